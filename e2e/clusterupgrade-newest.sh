#!/usr/bin/env bash
# From the seed's release to the newest in place (`make e2e-upgrade-newest`): start a cluster of
# the seed's release with its defaults and etcd kept across restarts, then let e2e/clusterupgrade's
# TestNewestUpgrade install the chart and upgrade the control plane one minor at a time through
# K8S_RELEASES_TO_NEWEST, then the kubelet, under running GPU pods, and get the stored objects
# ready for the next release (kubectl dra migrate, kubectl dra preflight --to 1.38).
set -euo pipefail
source "$(dirname "$0")/cluster/lib.sh"
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO"
FROM=$K8S_RELEASE_SEED TO=$K8S_RELEASE_NEWEST
IFS=, read -r -a VIA <<<"$K8S_RELEASES_TO_NEWEST"

if cluster_running; then
  die "a local cluster is already running; the scenario needs its own: 'make cluster-down' first"
fi
start=$(date +%s)
mkdir -p _output
# etcd of the first release and of the last: the control-plane upgrade to 1.37 upgrades etcd too.
"$HERE/build-tools.sh" helm etcd
K8S_VERSION=$TO "$HERE/build-tools.sh" etcd
# Build every release up front, each once and cached: a build failure shows here, not in the
# middle of an upgrade. The releases the control plane only passes through need no kubelet.
"$HERE/build-k8s.sh" "$FROM"
for v in "${VIA[@]}"; do
  K8S_BINARIES="kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl" "$HERE/build-k8s.sh" "$v"
done
"$HERE/build-k8s.sh" "$TO"
trap '"$HERE/down.sh"' EXIT
# Fresh etcd data and kubelet state: the scenario starts from an empty cluster of the seed's release.
WIPE=1 "$HERE/down.sh" >/dev/null
MODE=full K8S_VERSION=$FROM PRESERVE_ETCD=1 RUNTIME_CONFIG= FEATURE_GATES= "$HERE/up.sh"

# kubectl of the middle release: within kubectl's skew (one minor) of every API server but the
# first, which it is two minors ahead of.
kubectl_version=${VIA[${#VIA[@]}-1]}
export KUBECONFIG=$KUBECONFIG_PATH GPU_DRA_LOCAL_CLUSTER=1 GPU_DRA_NODE_NAME=$NODE_NAME
export GPU_DRA_UPGRADE_SCRIPT=$HERE/upgrade.sh
export PATH=$(k8s_bin_dir "$kubectl_version"):$(tools_bin_dir):$PATH
step "running the upgrade scenario v$FROM -> v${VIA[*]} -> v$TO (control plane), then the kubelet v$FROM -> v$TO"
go test -count=1 -v -timeout 90m -run '^TestNewestUpgrade$' ./e2e/clusterupgrade/ 2>&1 | tee "$REPO/_output/e2e-upgrade-newest.log"
"$HERE/down.sh"
trap - EXIT
step "upgrade scenario to the newest release passed in $(( $(date +%s) - start ))s (builds included)"
