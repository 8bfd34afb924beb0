#!/usr/bin/env bash
# Start a multi-node local cluster on this machine (MODE=multinode in up.sh): the control plane
# (hack/local-up-cluster.sh of K8S_VERSION, kube-proxy included) in a network namespace, and NODES
# worker nodes gpu-node-1..N, each a network and mount namespace with its own containerd, kubelet
# and kube-proxy. Runs beside a single-node cluster of up.sh. See docs/local-cluster.md.
#   NODES=1..5 (default 3); K8S_VERSION, RUNTIME_CONFIG, FEATURE_GATES as for up.sh.
set -euo pipefail
source "$(dirname "$0")/multinode-lib.sh"
# shellcheck source=multinode-node.sh
source "$(dirname "$0")/multinode-node.sh"

[ "$(id -u)" = 0 ] || die "the local cluster needs root (namespaces, kubelet, containerd); run as root"
case $NODES in [1-5]) ;; *) die "NODES must be 1 to 5, not '$NODES'" ;; esac
for p in /usr/sbin/runc /usr/lib/cni/bridge /usr/sbin/iptables /usr/bin/sudo /usr/bin/nsenter /usr/bin/unshare /usr/sbin/ip; do
  [ -x "$p" ] || die "$p is missing: run 'make deps'"
done
if mn_running; then
  step "a multi-node cluster is already running (kubeconfig $MN_KUBECONFIG); 'make cluster-down MODE=multinode' stops it"
  exit 0
fi
# A cluster killed rather than stopped leaves namespaces, mounts and processes: clear them first.
"$HERE/multinode-down.sh" >/dev/null
rm -rf "$MN_STATE/nodes" "$MN_STATE/control-plane"

"$HERE/build-k8s.sh" "$K8S_VERSION"
"$HERE/build-tools.sh" etcd cfssl containerd crictl
kbin=$(k8s_bin_dir "$K8S_VERSION")
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do mn_copy_bin "$kbin/$b" "$MN_BIN"; done
for b in containerd containerd-shim-runc-v2 ctr crictl; do mn_copy_bin "$(tools_bin_dir)/$b" "$MN_TOOLS"; done
mn_copy_bin "$(etcd_bin_dir)/etcd" "$MN_TOOLS"
mkdir -p "$MN_RUN" "$MN_STATE/control-plane"/{certs,logs,tmp,static-pods}
echo "$K8S_VERSION" >"$MN_RUN/version"
echo "$NODES" >"$MN_RUN/node-count"
# Everything below runs the copies; cfssl only signs certificates and exits.
export PATH=$MN_BIN:$MN_TOOLS:$(tools_bin_dir):/usr/local/go/bin:/usr/sbin:/usr/bin:/sbin:/bin

step "network: bridge in $MN_NS_SWITCH, host $MN_HOST_IP on $MN_HOST_VETH, control plane $MN_CP_IP, $NODES node(s)"
mn_network_up
[ -f "$CACHE/images/busybox.tar" ] && [ -f "$CACHE/images/apiprobe.tar" ] || "$HERE/images.sh" build

step "starting the control plane, Kubernetes v$K8S_VERSION, in network namespace $MN_NS_CP"
mn_control_plane_up
export KUBECONFIG=$MN_KUBECONFIG
wait_for 180 "API server ready" sh -c "[ -f '$MN_KUBECONFIG' ] && kubectl get --raw /readyz" mn_check_control_plane
# The controller manager creates it once its informers are in: on a machine busy with builds or
# another cluster that took over 120 s; a dead component still fails the wait at once (the check).
wait_for 300 "default service account" kubectl get serviceaccount default mn_check_control_plane
wait_for 60 "kube-proxy's kubeconfig" test -f "$MN_CERTS/kube-proxy.kubeconfig" mn_check_control_plane

for i in $(seq 1 "$NODES"); do
  step "starting node $(mn_node_name "$i") ($(mn_node_ip "$i"), pods $MN_POD_PREFIX.$i.0/24)"
  mn_node_up "$i"
done
for i in $(seq 1 "$NODES"); do
  wait_for 180 "node $(mn_node_name "$i") Ready" sh -c "kubectl get node $(mn_node_name "$i") -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True" mn_check_nodes
done
step "multi-node cluster up: Kubernetes v$K8S_VERSION, $NODES node(s), resource.k8s.io served: $(kubectl api-versions | grep resource.k8s.io | sed 's#resource.k8s.io/##' | tr '\n' ' ')"
note "export KUBECONFIG=$MN_KUBECONFIG"
kubectl get nodes -o wide | sed 's/^/    /'
