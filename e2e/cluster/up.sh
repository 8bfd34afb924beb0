#!/usr/bin/env bash
# Start a local single-node Kubernetes with hack/local-up-cluster.sh from the pinned k8s.io/kubernetes
# module, plus the glue it lacks: containerd 2.x with CDI, CNI config, local images, PID bookkeeping.
#   MODE=full (default): etcd, apiserver, controller-manager, scheduler, kubelet, kube-proxy, containerd
#   MODE=controlplane:   etcd, apiserver, controller-manager, scheduler
#   MODE=multinode:      NODES (default 3) worker nodes in namespaces of this machine (multinode-up.sh)
#   K8S_VERSION=<a release of hack/buildenv/build.env> ...; RUNTIME_CONFIG=...; FEATURE_GATES=...
#   PRESERVE_ETCD=1 keeps etcd data across down/up and restarts (in-place upgrades: upgrade.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

MODE=${MODE:-full}
case $MODE in
  full | controlplane) ;;
  multinode) exec "$HERE/multinode-up.sh" ;;
  *) die "MODE must be full, controlplane or multinode, not '$MODE'" ;;
esac
[ "$(id -u)" = 0 ] || die "the local cluster needs root (kubelet, containerd, iptables); run as root"

if cluster_running; then
  step "a local cluster is already running (kubeconfig $KUBECONFIG_PATH); 'make cluster-down' stops it"
  exit 0
fi

# An earlier cluster may have been killed rather than stopped: clear its processes, pods, mounts
# and rules first (a no-op when there is nothing).
"$HERE/down.sh" >/dev/null

kbin=$(k8s_bin_dir "$K8S_VERSION")
tbin=$(tools_bin_dir)
"$HERE/build-k8s.sh" "$K8S_VERSION"
# A control plane alone needs neither containerd nor crictl.
if [ "$MODE" = full ]; then "$HERE/build-tools.sh" etcd cfssl containerd crictl; else "$HERE/build-tools.sh" etcd cfssl; fi
mkdir -p "$STATE"/{logs,run,certs,tmp,static-pods,cni/net.d,cni/ipam,etcd} "$RUN_DIR/containerd"
mkdir -p /var/lib/kubelet/plugins /var/lib/kubelet/plugins_registry /etc/cdi /var/run/cdi /opt/cni/bin
echo "$MODE" > "$STATE/run/mode"

export PATH=$kbin:$(etcd_bin_dir):$tbin:/usr/local/go/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ "$MODE" = full ]; then
  for p in /usr/sbin/runc /usr/lib/cni/bridge /usr/sbin/iptables /usr/sbin/conntrack /usr/bin/sudo; do
    [ -x "$p" ] || die "$p is missing: run 'make deps' (Debian packages runc containernetworking-plugins iptables conntrack sudo)"
  done
  # local-up-cluster.sh downloads CNI plugins unless it finds this one.
  [ -e /opt/cni/bin/loopback ] || ln -s /usr/lib/cni/loopback /opt/cni/bin/loopback
  sed -e "s#@STATE@#$STATE#g" -e "s#@RUN@#$RUN_DIR#g" "$HERE/containerd.toml.in" > "$STATE/containerd.toml"
  sed -e "s#@STATE@#$STATE#g" "$HERE/cni.conflist.in" > "$STATE/cni/net.d/10-gpu-dra.conflist"
  if [ -f "$STATE/run/containerd.pid" ] && kill -0 "$(cat "$STATE/run/containerd.pid")" 2>/dev/null; then
    step "containerd already running"
  else
    step "starting containerd $CONTAINERD_VERSION (CDI on)"
    nohup "$tbin/containerd" --config "$STATE/containerd.toml" >"$STATE/logs/containerd.log" 2>&1 &
    echo $! > "$STATE/run/containerd.pid"
  fi
  wait_for 30 "containerd" "$tbin/ctr" -a "$CONTAINERD_SOCK" version
  "$HERE/images.sh" import
fi

step "starting Kubernetes v$K8S_VERSION ($MODE) with hack/local-up-cluster.sh"
[ -n "${RUNTIME_CONFIG:-}" ] && note "runtime-config: $RUNTIME_CONFIG"
[ -n "${FEATURE_GATES:-}" ] && note "feature gates: $FEATURE_GATES"
[ "${PRESERVE_ETCD:-0}" = 1 ] && note "etcd data kept in $STATE/etcd across restarts (in-place upgrades)"
if [ "$MODE" = controlplane ]; then
  local_up controlplane "$K8S_VERSION" nokubelet,nokubeproxy
else
  local_up controlplane "$K8S_VERSION" nokubelet
fi
export KUBECONFIG=$KUBECONFIG_PATH
wait_api_ready 180
# The controller manager creates it once its informers are in: on a machine busy with builds or
# another cluster that took over 120 s; a dead component still fails the wait at once (the check).
wait_for 300 "default service account" kubectl get serviceaccount default local_up_check_controlplane
if [ "$MODE" = full ]; then
  # The kubelet's instance signs its client certificate with the CA the control plane's created.
  local_up kubelet "$K8S_VERSION" kubeletonly
  wait_node_ready 180
fi
step "cluster up: Kubernetes v$K8S_VERSION, resource.k8s.io served: $(kubectl api-versions | grep resource.k8s.io | sed 's#resource.k8s.io/##' | tr '\n' ' ')"
note "export KUBECONFIG=$KUBECONFIG"
[ "$MODE" = full ] && kubectl get nodes -o wide | sed 's/^/    /'
true
