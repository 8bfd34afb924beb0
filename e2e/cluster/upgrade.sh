#!/usr/bin/env bash
# Upgrade one part of the running local cluster in place, the way an administrator upgrades a node:
# same etcd data, same PKI and service-account key, same containerd with its running containers.
#   upgrade.sh controlplane VERSION   etcd + apiserver + controller-manager + scheduler + kube-proxy;
#                                     RUNTIME_CONFIG / FEATURE_GATES apply to the new control plane
#   upgrade.sh kubelet VERSION        the kubelet; drain the node first (upstream does not support
#                                     in-place minor kubelet upgrades: the version skew policy)
# The cluster must have been started with PRESERVE_ETCD=1, or the control plane's restart would
# start from an empty etcd. Only the binaries of the part are built: a release the control plane
# passes through never needs a kubelet.
set -euo pipefail
# lib.sh picks the etcd the new release's hack/local-up-cluster.sh wants (3.7 from 1.37).
[ -z "${2:-}" ] || export K8S_VERSION=$2
source "$(dirname "$0")/lib.sh"

part=${1:-}
version=${2:-}
case $part in controlplane | kubelet) ;; *) die "usage: upgrade.sh controlplane|kubelet VERSION" ;; esac
[ -n "$version" ] || die "usage: upgrade.sh $part VERSION"
[ "$(id -u)" = 0 ] || die "the local cluster needs root; run as root"
cluster_running || die "no local cluster is running ('make cluster-up' with PRESERVE_ETCD=1 first)"
[ "$(cat "$STATE/run/mode")" = full ] || die "in-place upgrades need MODE=full (a kubelet to keep running)"
if [ "$part" = controlplane ] && [ ! -s "$STATE/etcd/member/snap/db" ]; then
  die "the cluster was not started with PRESERVE_ETCD=1: restarting its control plane would lose etcd's data"
fi
old=$(cat "$STATE/run/$part-version")

# hack/local-up-cluster.sh runs kubectl in both parts.
if [ "$part" = controlplane ]; then
  K8S_BINARIES=${K8S_BINARIES:-kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl} "$HERE/build-k8s.sh" "$version"
  "$HERE/build-tools.sh" etcd
else
  K8S_BINARIES=${K8S_BINARIES:-kubelet kubectl} "$HERE/build-k8s.sh" "$version"
fi
export PATH=$(k8s_bin_dir "$version"):$(etcd_bin_dir):$(tools_bin_dir):$PATH
export KUBECONFIG=$KUBECONFIG_PATH
step "upgrading the $part in place: v$old -> v$version"
[ -n "${RUNTIME_CONFIG:-}" ] && note "runtime-config: $RUNTIME_CONFIG"
[ -n "${FEATURE_GATES:-}" ] && note "feature gates: $FEATURE_GATES"

stop_part() {
  stop_pid "$(local_up_pidfile "$part")" INT 60
  # Nothing of the old part may survive to hold a port.
  sweep_k8s "$@"
}

if [ "$part" = controlplane ]; then
  stop_part kube-proxy kube-scheduler kube-controller-manager kube-apiserver
  wait_for 60 "etcd to stop" sh -c "! ss -ltnH 'sport = :2379' | grep -q ."
  # Reuse the CA: the kubelet's client certificate and every pod's service-account token must stay valid.
  PRESERVE_ETCD=1 REUSE_CERTS=true local_up controlplane "$version" nokubelet
  wait_api_ready 180
else
  stop_part kubelet
  local_up kubelet "$version" kubeletonly
  wait_node_ready 180
  wait_for 60 "node $NODE_NAME to report kubelet v$version" sh -c \
    "kubectl get node '$NODE_NAME' -o jsonpath='{.status.nodeInfo.kubeletVersion}' | grep -qx 'v$version'"
fi
step "$part now v$version; resource.k8s.io served: $(kubectl api-versions | grep resource.k8s.io | sed 's#resource.k8s.io/##' | tr '\n' ' ')"
