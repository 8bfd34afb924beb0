# Shared settings and helpers of the local-cluster harness. Sourced, not run.
# Everything built is cached outside the repository, keyed by version, so a clean clone reuses it.

K8S_VERSION=${K8S_VERSION:-1.34.2}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.2.9}
# hack/local-up-cluster.sh of 1.37 wants etcd 3.7; older releases are tested with 3.6.
_k8s_minor=$(echo "$K8S_VERSION" | cut -d. -f2)
if [ "$_k8s_minor" -ge 37 ]; then ETCD_VERSION=${ETCD_VERSION:-v3.7.3}; else ETCD_VERSION=${ETCD_VERSION:-v3.6.16}; fi
CFSSL_VERSION=${CFSSL_VERSION:-v1.6.5}
CRICTL_VERSION=${CRICTL_VERSION:-v1.34.0}
HELM_VERSION=${HELM_VERSION:-v4.3.2}

CACHE=${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra}
# Runtime state of the running cluster (sockets, PKI, logs). One cluster per machine.
STATE=${GPU_DRA_STATE:-/var/lib/gpu-dra-cluster}
RUN_DIR=${GPU_DRA_RUN:-/run/gpu-dra-cluster}

export PATH=/usr/local/go/bin:$PATH
export GOFLAGS=${GOFLAGS:--buildvcs=false}

k8s_bin_dir() { echo "$CACHE/k8s/v$1/bin"; }
tools_bin_dir() { echo "$CACHE/tools/bin"; }
etcd_bin_dir() { echo "$CACHE/tools/etcd-$ETCD_VERSION"; }

_T0=${_T0:-$(date +%s)}
export _T0
_elapsed() { local s=$(( $(date +%s) - _T0 )); printf '%02d:%02d' $((s / 60)) $((s % 60)); }
step() { printf '[%s] ==> %s\n' "$(_elapsed)" "$*"; }
note() { printf '[%s]     %s\n' "$(_elapsed)" "$*"; }
die() { printf '[%s] ERROR: %s\n' "$(_elapsed)" "$*" >&2; exit 1; }
# timed LABEL CMD...: run CMD, print how long it took; its output goes to a log unless VERBOSE=1.
timed() {
  local label=$1; shift
  local s=$(date +%s) log
  mkdir -p "$CACHE/logs"; log=$CACHE/logs/$(echo "$label" | tr -c 'a-zA-Z0-9.\n-' '_').log
  note "$label ..."
  if [ "${VERBOSE:-0}" = 1 ]; then "$@"; else
    "$@" >"$log" 2>&1 || { tail -40 "$log" >&2; die "$label failed (full log: $log)"; }
  fi
  note "$label done in $(( $(date +%s) - s ))s"
}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NODE_NAME=${NODE_NAME:-$(hostname | tr 'A-Z' 'a-z')}
CONTAINERD_SOCK=$RUN_DIR/containerd/containerd.sock
KUBECONFIG_PATH=$STATE/certs/admin.kubeconfig

cluster_running() {
  [ -f "$STATE/run/local-up-cluster.pid" ] && kill -0 "$(cat "$STATE/run/local-up-cluster.pid")" 2>/dev/null
}

# wait_for SECONDS WHAT CMD... [CHECK]: poll CMD until it succeeds; CHECK (a function name, optional
# last word) runs each round to fail fast when what we wait on has died. Prints progress every 10s.
wait_for() {
  local secs=$1 what=$2; shift 2
  local check=""
  if declare -F "${!#}" >/dev/null; then check=${!#}; set -- "${@:1:$(($# - 1))}"; fi
  local s=$(date +%s) last=0
  note "waiting for $what"
  until "$@" >/dev/null 2>&1; do
    [ -z "$check" ] || $check
    local e=$(( $(date +%s) - s ))
    [ $e -lt "$secs" ] || die "timed out after ${secs}s waiting for $what"
    if [ $((e / 10)) -gt $last ]; then last=$((e / 10)); note "... still waiting for $what (${e}s)"; fi
    sleep 0.5
  done
  note "$what after $(( $(date +%s) - s ))s"
}

# stop_pid FILE SIGNAL SECONDS: signal the process, wait for it, then kill it.
stop_pid() {
  local f=$1 sig=$2 secs=$3 p
  [ -f "$f" ] || return 0
  p=$(cat "$f")
  kill -"$sig" "$p" 2>/dev/null
  for _ in $(seq 1 $((secs * 5))); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$p" 2>/dev/null
  rm -f "$f"
}
