#!/usr/bin/env bash
# The seed's story as an in-place upgrade (`make e2e-upgrade`): start a cluster of the oldest release
# with the seed's DRA beta flags and etcd kept across restarts, then let e2e/clusterupgrade's test
# install the chart and upgrade the control plane and the kubelet under running GPU pods, up to the
# seed's release (hack/buildenv/build.env).
set -euo pipefail
source "$(dirname "$0")/cluster/lib.sh"
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO"
FROM=$K8S_RELEASE_OLDEST VIA=$K8S_RELEASE_UPGRADE_VIA TO=$K8S_RELEASE_SEED

if cluster_running; then
  die "a local cluster is already running; the scenario needs its own: 'make cluster-down' first"
fi
start=$(date +%s)
mkdir -p _output
"$HERE/build-tools.sh" helm
# Build every release up front: a build failure shows here, not in the middle of an upgrade.
for v in $FROM $VIA $TO; do "$HERE/build-k8s.sh" "$v"; done
trap '"$HERE/down.sh"' EXIT
# Fresh etcd data and kubelet state: the scenario starts from an empty 1.32 cluster.
WIPE=1 "$HERE/down.sh" >/dev/null
MODE=full K8S_VERSION=$FROM PRESERVE_ETCD=1 RUNTIME_CONFIG=resource.k8s.io/v1beta1=true \
  FEATURE_GATES=DynamicResourceAllocation=true "$HERE/up.sh"

# kubectl 1.33 is within the supported skew (one minor) of all three API servers.
export KUBECONFIG=$KUBECONFIG_PATH GPU_DRA_LOCAL_CLUSTER=1 GPU_DRA_NODE_NAME=$NODE_NAME
export GPU_DRA_UPGRADE_SCRIPT=$HERE/upgrade.sh
export PATH=$(k8s_bin_dir "$VIA"):$(tools_bin_dir):$PATH
step "running the upgrade scenario v$FROM -> v$VIA -> v$TO"
go test -count=1 -v -timeout 60m -run '^TestSeedUpgrade$' ./e2e/clusterupgrade/ 2>&1 | tee "$REPO/_output/e2e-upgrade.log"
"$HERE/down.sh"
trap - EXIT
step "upgrade scenario passed in $(( $(date +%s) - start ))s (builds included)"
