#!/usr/bin/env bash
# Run the end-to-end suite: on the cluster $KUBECONFIG names, or on a local cluster started here and
# stopped afterwards. `run.sh matrix` runs it on each release of hack/buildenv/build.env: the
# oldest (with the seed's beta flags), the seed's and the newest, then the PodGroup phase.
# `run.sh podgroups` is that phase alone: TestPodGroups on a local cluster of the newest release
# started with PodGroups served. Their gates (beta in 1.37 but off by default) switch on the
# scheduler's workload scheduling and the claim controller's PodGroup handling for every pod, so the
# rest of the suite keeps the release's defaults and meets them only in TestPodGroups, which there
# checks what a cluster without PodGroups says. `run.sh multinode` runs e2e/multinode on a
# multi-node local cluster (NODES, default 3). `run.sh all` is `make test`'s: see all_suites.
set -euo pipefail
source "$(dirname "$0")/cluster/lib.sh"
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO"

# suite_log: where the single-node suite of K8S_VERSION (and E2E_PHASE) keeps its output.
suite_log() { echo "$REPO/_output/e2e-$K8S_VERSION${E2E_PHASE:+-$E2E_PHASE}.log"; }

# run_suite PKG LOG: the suite of PKG (E2E_RUN, E2E_SKIP), its output also kept in LOG.
run_suite() {
  go test -count=1 -v -timeout 40m -run "${E2E_RUN:-.}" -skip "${E2E_SKIP:-}" "$1" 2>&1 | tee "$2"
}

# failures LOG: each failed test of a `go test -v` log with its last lines from the test's own
# files (errors, fatals and logs; not the framework's dumps), printed at the end of a run, where a
# reader of only the output's tail finds why.
failures() {
  [ -f "$1" ] || return 0
  step "failed in $1:"
  awk '
    /^=== (RUN|CONT|PAUSE)/ { t = $3 }
    /^ +[A-Za-z0-9_]+_test\.go:[0-9]+: / { buf[t, n[t]++ % 8] = substr($0, 1, 400) }
    /^ *--- FAIL: / {
      print $0
      k = n[$3] + 0
      for (i = (k > 8 ? k - 8 : 0); i < k; i++) print buf[$3, i % 8]
    }' "$1"
}

local_suite() {
  if cluster_running; then
    die "a local cluster is already running; the suite starts its own: 'make cluster-down' first (or set KUBECONFIG to use that one)"
  fi
  trap '"$HERE/down.sh"' EXIT
  MODE=full "$HERE/up.sh"
  export KUBECONFIG=$KUBECONFIG_PATH GPU_DRA_LOCAL_CLUSTER=1 GPU_DRA_NODE_NAME=$NODE_NAME GPU_DRA_CRI_ENDPOINT=unix://$CONTAINERD_SOCK
  export GPU_DRA_K8S_BIN=$(k8s_bin_dir "$K8S_VERSION")
  export PATH=$GPU_DRA_K8S_BIN:$(tools_bin_dir):$PATH
  step "running the e2e suite on Kubernetes v$K8S_VERSION"
  local rc=0 log
  log=$(suite_log)
  run_suite ./e2e/ "$log" || rc=$?
  "$HERE/down.sh"
  trap - EXIT
  [ $rc -eq 0 ] || failures "$log"
  return $rc
}

# multinode_suite: e2e/multinode on a multi-node local cluster (NODES, default 3) started here.
multinode_suite() {
  source "$HERE/multinode-lib.sh"
  if mn_running; then
    die "a multi-node cluster is already running; the suite starts its own: 'make cluster-down MODE=multinode' first"
  fi
  trap '"$HERE/multinode-down.sh"' EXIT
  "$HERE/multinode-up.sh"
  export KUBECONFIG=$MN_KUBECONFIG GPU_DRA_MULTINODE=1 GPU_DRA_MN_STATE=$MN_STATE GPU_DRA_MN_RUN=$MN_RUN
  export PATH=$MN_BIN:$(tools_bin_dir):$PATH
  step "running the multi-node suite on Kubernetes v$K8S_VERSION, $NODES nodes"
  local rc=0 log=$REPO/_output/e2e-multinode-$K8S_VERSION.log
  run_suite ./e2e/multinode/ "$log" || rc=$?
  "$HERE/multinode-down.sh"
  trap - EXIT
  [ $rc -eq 0 ] || failures "$log"
  return $rc
}

# all_suites is `make test`'s end-to-end part: the seed release's single-node suite with the
# multi-node suite on the newest release beside it (the clusters share nothing, and both suites
# mostly wait on pods, so the two cores have room), then the newest release's suite (NEWEST_E2E_SKIP
# left out) and its PodGroup phase.
all_suites() {
  # What both clusters build, built first: two builds of one binary into one cache would collide.
  local v
  for v in "$K8S_RELEASE_SEED" "$K8S_RELEASE_NEWEST"; do
    "$HERE/build-k8s.sh" "$v"
    K8S_VERSION=$v "$HERE/build-tools.sh" etcd cfssl containerd crictl
  done
  local beside=$REPO/_output/e2e-multinode-beside.log rc=0
  step "the multi-node suite on Kubernetes v$K8S_RELEASE_NEWEST starts beside the next one; its output follows that suite's (and is in $beside)"
  (export K8S_VERSION=$K8S_RELEASE_NEWEST E2E_RUN= E2E_SKIP=; multinode_suite) >"$beside" 2>&1 &
  local mn=$!
  # A job of its own too: under `||` bash would ignore `set -e` inside it.
  (export K8S_VERSION=$K8S_RELEASE_SEED; local_suite) &
  local seed=$!
  # Background jobs of a script ignore SIGINT: pass an interrupt on, so that each stops its cluster.
  trap 'kill -TERM $mn $seed 2>/dev/null; wait; exit 130' INT TERM
  wait "$seed" || rc=1
  wait "$mn" || rc=1
  trap - INT TERM
  step "the multi-node suite, run beside the one above:"
  cat "$beside"
  # The seed suite's own summary scrolled away under the multi-node output.
  [ $rc -eq 0 ] || { failures "$REPO/_output/e2e-$K8S_RELEASE_SEED.log"; return $rc; }
  (export K8S_VERSION=$K8S_RELEASE_NEWEST E2E_SKIP=$NEWEST_E2E_SKIP; local_suite)
  podgroups_phase
}

# podgroups_phase: TestPodGroups on the newest release with PodGroups (KEP-5729) served.
podgroups_phase() {
  (
    export K8S_VERSION=$K8S_RELEASE_NEWEST E2E_PHASE=podgroups E2E_RUN='^TestPodGroups$' E2E_SKIP=
    export RUNTIME_CONFIG=scheduling.k8s.io/v1beta1=true FEATURE_GATES=GenericWorkload=true,DRAWorkloadResourceClaims=true
    local_suite
  )
}

mkdir -p "$REPO/_output"
# The suite installs the chart with the helm CLI.
"$HERE/build-tools.sh" helm
if [ "${1:-}" = matrix ]; then
  for v in "$K8S_RELEASE_OLDEST" "$K8S_RELEASE_SEED" "$K8S_RELEASE_NEWEST"; do
    unset RUNTIME_CONFIG FEATURE_GATES
    if [ "$v" = "$K8S_RELEASE_OLDEST" ]; then
      export RUNTIME_CONFIG=resource.k8s.io/v1beta1=true FEATURE_GATES=DynamicResourceAllocation=true
    fi
    export K8S_VERSION=$v
    local_suite
  done
  podgroups_phase
elif [ "${1:-}" = all ]; then
  all_suites
elif [ "${1:-}" = multinode ]; then
  multinode_suite
elif [ "${1:-}" = podgroups ]; then
  podgroups_phase
elif [ -n "${KUBECONFIG:-}" ]; then
  step "running the e2e suite on the cluster of KUBECONFIG=$KUBECONFIG"
  export PATH=$(k8s_bin_dir "$K8S_VERSION"):$(tools_bin_dir):$PATH
  run_suite ./e2e/ "$(suite_log)"
else
  local_suite
fi
