#!/usr/bin/env bash
# Start a local single-node Kubernetes with hack/local-up-cluster.sh from the pinned k8s.io/kubernetes
# module, plus the glue it lacks: containerd 2.x with CDI, CNI config, local images, PID bookkeeping.
#   MODE=full (default): etcd, apiserver, controller-manager, scheduler, kubelet, kube-proxy, containerd
#   MODE=controlplane:   etcd, apiserver, controller-manager, scheduler
#   K8S_VERSION=1.34.2 | 1.32.13 | 1.37.2 ...; RUNTIME_CONFIG=...; FEATURE_GATES=...
#   PRESERVE_ETCD=1 keeps etcd data across down/up (for in-place upgrades).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

MODE=${MODE:-full}
case $MODE in full | controlplane) ;; *) die "MODE must be full or controlplane, not '$MODE'" ;; esac
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
"$HERE/build-tools.sh" etcd cfssl containerd crictl
mkdir -p "$STATE"/{logs,run,certs,tmp,static-pods,cni/net.d,cni/ipam,etcd} "$RUN_DIR/containerd"
mkdir -p /var/lib/kubelet/plugins /var/lib/kubelet/plugins_registry /etc/cdi /var/run/cdi /opt/cni/bin
echo "$K8S_VERSION" > "$STATE/run/version"
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
gomodcache=$(go env GOMODCACHE)
script=$gomodcache/k8s.io/kubernetes@v$K8S_VERSION/hack/local-up-cluster.sh
[ -f "$script" ] || (cd "$CACHE/k8s-build/v$K8S_VERSION" && go mod download k8s.io/kubernetes@v$K8S_VERSION)
start_mode=all
[ "$MODE" = controlplane ] && start_mode=nokubelet,nokubeproxy
kubelet_flags=${KUBELET_FLAGS:-}
# Kubelets from 1.35 refuse cgroup v1 hosts unless told otherwise; CI machines of this kind are v1.
if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then kubelet_flags="$kubelet_flags --fail-cgroupv1=false"; fi
etcd_env=()
if [ "${PRESERVE_ETCD:-0}" = 1 ]; then etcd_env=(PRESERVE_ETCD=true ETCD_DIR="$STATE/etcd"); fi
# --default-signal: a background job otherwise ignores the SIGINT that makes the script clean up.
env --default-signal=INT PATH="$PATH" USER=root HOSTNAME_OVERRIDE="$NODE_NAME" \
  ENABLE_DAEMON=false START_MODE=$start_mode GO_OUT="$kbin" \
  CONTAINER_RUNTIME_ENDPOINT="unix://$CONTAINERD_SOCK" CGROUP_DRIVER=cgroupfs \
  KUBE_ENABLE_CLUSTER_DNS=false KUBE_DEFAULT_STORAGE_CLASS=false ALLOW_PRIVILEGED=true \
  KUBELET_FLAGS="$kubelet_flags" RUNTIME_CONFIG="${RUNTIME_CONFIG:-}" FEATURE_GATES="${FEATURE_GATES:-AllAlpha=false}" \
  EVICTION_HARD="memory.available<100Mi,nodefs.available<1%,imagefs.available<1%,nodefs.inodesFree<1%" \
  LOG_DIR="$STATE/logs" CERT_DIR="$STATE/certs" TMP_DIR="$STATE/tmp" POD_MANIFEST_PATH="$STATE/static-pods" \
  "${etcd_env[@]}" \
  bash "$script" -o "$kbin" >"$STATE/logs/local-up-cluster.log" 2>&1 &
echo $! > "$STATE/run/local-up-cluster.pid"

watch_script() {
  kill -0 "$(cat "$STATE/run/local-up-cluster.pid")" 2>/dev/null && return 0
  tail -30 "$STATE/logs/local-up-cluster.log" >&2
  die "hack/local-up-cluster.sh exited (log: $STATE/logs/local-up-cluster.log)"
}
export KUBECONFIG=$KUBECONFIG_PATH
wait_for 180 "API server ready" sh -c "[ -f '$KUBECONFIG' ] && kubectl get --raw /readyz >/dev/null 2>&1" watch_script
wait_for 120 "default service account" kubectl get serviceaccount default watch_script
if [ "$MODE" = full ]; then
  wait_for 180 "node $NODE_NAME Ready" sh -c "kubectl get node '$NODE_NAME' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' 2>/dev/null | grep -q True" watch_script
fi
step "cluster up: Kubernetes v$K8S_VERSION, resource.k8s.io served: $(kubectl api-versions | grep resource.k8s.io | sed 's#resource.k8s.io/##' | tr '\n' ' ')"
note "export KUBECONFIG=$KUBECONFIG"
[ "$MODE" = full ] && kubectl get nodes -o wide | sed 's/^/    /'
true
