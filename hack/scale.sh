#!/usr/bin/env bash
# `make scale`: the webhook and kubectl dra on a fleet of fake GPU nodes (e2e/scale). Starts a
# control plane without kubelets (e2e/cluster/up.sh MODE=controlplane), runs the harness, stops the
# control plane. Loopback only; every load is bounded (e2e/scale Options.Validate).
#   SCALE_NODES=1,100,1000,5000  fleet sizes, ascending (the first is the baseline)
#   SCALE_RATE=200 SCALE_HIGH_RATE=1000 SCALE_DURATION=10s  review rates and length of each load
#   SCALE_SCHED_NODES=1000 SCALE_SCHED_PODS=1000  the scheduling phase (kwok nodes, real pods)
#   SCALE_PAUSE_CONTROLLERS=true  stop the controller-manager and scheduler during the direct loads
#   SCALE_GOGC=100 SCALE_GOMEMLIMIT=off  GOGC and GOMEMLIMIT of the webhook process (the chart's: 400, its memory limit: 256MiB)
#   SCALE_CLAIMS=1.0  fraction of the largest fleet's GPUs held by allocated claims for the claims loads (0 skips)
#   SCALE_CLAIMS_RATES=1000,2000 SCALE_CLAIMS_CHURN=100  review rates with the claims held (and against the
#     upstream example webhook), allocation changes per second during the churn load
#   SCALE_UPSTREAM=auto  compare with the upstream example webhook at the largest fleet: auto (when it
#     builds: DRA_EXAMPLE_DRIVER_SRC, see e2e/cluster/build-tools.sh), on (must build), off
#   SCALE_CLI_ONLY=1  only time kubectl dra status and why (SCALE_CLI_RUNS=5 rounds) on envtest's
#     kube-apiserver holding the largest fleet and its claims: no cluster, webhook or controllers.
#     SCALE_KUBECTL_DRA=a,b times several builds in turn (default _output/bin/kubectl-dra)
set -euo pipefail
source "$(dirname "$0")/../e2e/cluster/lib.sh"
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO"

nodes=${SCALE_NODES:-1,100,1000,5000}
last=${nodes##*,}
sched_nodes=${SCALE_SCHED_NODES:-$(( last < 1000 ? last : 1000 ))}
minor=$(echo "$K8S_VERSION" | cut -d. -f2)
render=charts/charttest/testdata/k8s-1.$minor.golden
[ -f "$render" ] || render=charts/charttest/testdata/k8s-1.34.golden

if [ -n "${SCALE_CLI_ONLY:-}" ]; then
  # The fleet's generators write resource.k8s.io/v1, which 1.34 is the first to serve.
  [ "$minor" -ge 34 ] || die "SCALE_CLI_ONLY=1 needs K8S_VERSION 1.34 or later (resource.k8s.io/v1); got $K8S_VERSION"
  baseline_assets=$("$HERE/envtest-assets.sh")
  mkdir -p _output/scale/cli
  step "kubectl dra status and why on Kubernetes v$K8S_VERSION: $last nodes (log: _output/scale/cli.log)"
  go build -o _output/bin/scale ./e2e/cmd/scale
  _output/bin/scale --cli-only --baseline-assets "$baseline_assets" --chart-render "$render" \
    --nodes "$last" --claims "${SCALE_CLAIMS:-1.0}" --kubectl-dra "${SCALE_KUBECTL_DRA:-_output/bin/kubectl-dra}" \
    --cli-runs "${SCALE_CLI_RUNS:-5}" --work-dir _output/scale/cli 2> >(tee _output/scale/cli.log >&2) \
    | tee _output/scale/cli.md
  exit 0
fi
if cluster_running; then
  die "a local cluster is already running; 'make scale' starts its own control plane: 'make cluster-down' first"
fi
"$HERE/build-tools.sh" kwok
upstream=
case ${SCALE_UPSTREAM:-auto} in
  off) ;;
  on) "$HERE/build-tools.sh" dra-example-webhook; upstream=$(tools_bin_dir)/dra-example-webhook ;;
  auto) if ("$HERE/build-tools.sh" dra-example-webhook); then upstream=$(tools_bin_dir)/dra-example-webhook
        else note "no upstream example webhook (above): its comparison is skipped; SCALE_UPSTREAM=off says so quietly"; fi ;;
  *) die "SCALE_UPSTREAM=${SCALE_UPSTREAM}: want auto, on or off" ;;
esac
baseline_assets=$("$HERE/envtest-assets.sh")
kwok_stages=$(cd "$CACHE/tools-build/kwok-$KWOK_VERSION" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
trap '"$HERE/down.sh"' EXIT
MODE=controlplane "$HERE/up.sh"
mkdir -p _output/scale
step "fleet scale on Kubernetes v$K8S_VERSION: nodes $nodes (log: _output/scale/scale.log)"
go build -o _output/bin/scale ./e2e/cmd/scale
_output/bin/scale --kubeconfig "$KUBECONFIG_PATH" --chart-render "$render" \
  --kwok "$(tools_bin_dir)/kwok" --kwok-stages "$kwok_stages" --baseline-assets "$baseline_assets" \
  --nodes "$nodes" --sched-nodes "$sched_nodes" --sched-pods "${SCALE_SCHED_PODS:-1000}" \
  --rate "${SCALE_RATE:-200}" --high-rate "${SCALE_HIGH_RATE:-1000}" --duration "${SCALE_DURATION:-10s}" \
  --webhook-gogc "${SCALE_GOGC:-100}" --webhook-gomemlimit "${SCALE_GOMEMLIMIT:-off}" \
  --pause-controllers="${SCALE_PAUSE_CONTROLLERS:-true}" \
  --claims "${SCALE_CLAIMS:-1.0}" --claims-rates "${SCALE_CLAIMS_RATES:-1000,2000}" --claims-churn "${SCALE_CLAIMS_CHURN:-100}" \
  --upstream-webhook "$upstream" 2> >(tee _output/scale/scale.log >&2)
