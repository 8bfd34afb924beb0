# Shared settings and helpers of the local-cluster harness. Sourced, not run.
# Everything built is cached outside the repository, keyed by version, so a clean clone reuses it.

# shellcheck source=../../hack/buildenv/build.env
source "$(dirname "${BASH_SOURCE[0]}")/../../hack/buildenv/build.env"
K8S_VERSION=${K8S_VERSION:-$K8S_RELEASE_SEED}
PROJECT_IMAGE=${PROJECT_IMAGE:-$PROJECT_IMAGE_REPOSITORY:$PROJECT_IMAGE_TAG}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.2.9}
# hack/local-up-cluster.sh of 1.37 wants etcd 3.7; older releases are tested with 3.6.
_k8s_minor=$(echo "$K8S_VERSION" | cut -d. -f2)
if [ "$_k8s_minor" -ge 37 ]; then ETCD_VERSION=${ETCD_VERSION:-v3.7.3}; else ETCD_VERSION=${ETCD_VERSION:-v3.6.16}; fi
CFSSL_VERSION=${CFSSL_VERSION:-v1.6.5}
CRICTL_VERSION=${CRICTL_VERSION:-v1.34.0}
HELM_VERSION=${HELM_VERSION:-v4.3.2}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
DRA_EXAMPLE_DRIVER_VERSION=${DRA_EXAMPLE_DRIVER_VERSION:-v0.4.0}

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

# Every Kubernetes binary the harness runs, whichever version: after an in-place upgrade the
# control plane and the kubelet may run different releases.
K8S_BIN_RE="$CACHE/k8s/v[0-9][0-9.]*/bin"

# sweep_k8s BINARY...: whatever local-up-cluster.sh's cleanup missed (it kills by PID, and components
# may outlive it), of any cached release.
sweep_k8s() {
  local b
  for b in "$@"; do pkill -TERM -f "^($K8S_BIN_RE/|sudo -E $K8S_BIN_RE/|sudo $K8S_BIN_RE/)$b( |$)" 2>/dev/null || true; done
  sleep 1
  for b in "$@"; do pkill -KILL -f "^($K8S_BIN_RE/|sudo -E $K8S_BIN_RE/|sudo $K8S_BIN_RE/)$b( |$)" 2>/dev/null || true; done
}

# local_up PART VERSION START_MODE: run hack/local-up-cluster.sh of VERSION for one part of the
# cluster, in the background, logging to $STATE/logs/local-up-PART.log. The control plane
# (START_MODE nokubelet...) and the kubelet (kubeletonly) are separate instances so that either can be
# restarted with other binaries while the other keeps running: in-place upgrades (upgrade.sh).
# Honors RUNTIME_CONFIG, FEATURE_GATES, KUBELET_FLAGS, PRESERVE_ETCD=1 and REUSE_CERTS=true.
local_up() {
  local part=$1 version=$2 start_mode=$3
  local kbin script kubelet_flags=${KUBELET_FLAGS:-} etcd_env=()
  kbin=$(k8s_bin_dir "$version")
  script=$(local_up_script "$version")
  # Kubelets from 1.35 refuse cgroup v1 hosts unless told otherwise; CI machines of this kind are v1.
  if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then kubelet_flags="$kubelet_flags --fail-cgroupv1=false"; fi
  if [ "${PRESERVE_ETCD:-0}" = 1 ]; then etcd_env=(PRESERVE_ETCD=true ETCD_DIR="$STATE/etcd"); fi
  if [ "$start_mode" = kubeletonly ] && ! grep -q '^serverTLSBootstrap: true$' "$script"; then
    kubelet_serving_cert
    kubelet_flags="$kubelet_flags --tls-cert-file=$STATE/certs/kubelet-serving.crt --tls-private-key-file=$STATE/certs/kubelet-serving.key"
  fi
  # --default-signal: a background job otherwise ignores the SIGINT that makes the script clean up.
  env --default-signal=INT PATH="$kbin:$PATH" USER=root HOSTNAME_OVERRIDE="$NODE_NAME" \
    ENABLE_DAEMON=false START_MODE="$start_mode" GO_OUT="$kbin" REUSE_CERTS="${REUSE_CERTS:-false}" \
    CONTAINER_RUNTIME_ENDPOINT="unix://$CONTAINERD_SOCK" CGROUP_DRIVER=cgroupfs \
    KUBE_ENABLE_CLUSTER_DNS=false KUBE_DEFAULT_STORAGE_CLASS=false ALLOW_PRIVILEGED=true \
    KUBELET_FLAGS="$kubelet_flags" RUNTIME_CONFIG="${RUNTIME_CONFIG:-}" FEATURE_GATES="${FEATURE_GATES:-AllAlpha=false}" \
    EVICTION_HARD="memory.available<100Mi,nodefs.available<1%,imagefs.available<1%,nodefs.inodesFree<1%" \
    LOG_DIR="$STATE/logs" CERT_DIR="$STATE/certs" TMP_DIR="$STATE/tmp" POD_MANIFEST_PATH="$STATE/static-pods" \
    "${etcd_env[@]}" \
    bash "$script" -o "$kbin" >"$STATE/logs/local-up-$part.log" 2>&1 &
  echo $! > "$(local_up_pidfile "$part")"
  echo "$version" > "$STATE/run/$part-version"
}

# kubelet_serving_cert: a serving certificate for the kubelet signed by the cluster's CA. Up to 1.34
# hack/local-up-cluster.sh leaves the kubelet to sign its own, which its API server does not check;
# from 1.35 the script starts the API server with --kubelet-certificate-authority (the cluster CA)
# and the kubelet with serverTLSBootstrap. A kubelet started by an older script and kept running
# under a newer control plane (upgrade.sh: the kubelet goes last) would then fail every
# `kubectl exec` and `logs` with "x509: certificate signed by unknown authority". The control
# plane's restarts reuse the CA (REUSE_CERTS), so this certificate stays valid across them.
kubelet_serving_cert() {
  local d=$STATE/certs sans ip
  [ -f "$d/client-ca.crt" ] && [ -f "$d/client-ca.key" ] || die "no cluster CA in $d: start the control plane first"
  sans="DNS:$NODE_NAME,DNS:localhost,IP:127.0.0.1"
  for ip in $(hostname -I 2>/dev/null); do sans="$sans,IP:$ip"; done
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=%s\n' \
    "$sans" >"$d/kubelet-serving.ext"
  { openssl req -new -newkey rsa:2048 -nodes -subj "/O=system:nodes/CN=system:node:$NODE_NAME" \
      -keyout "$d/kubelet-serving.key" -out "$d/kubelet-serving.csr" &&
    openssl x509 -req -in "$d/kubelet-serving.csr" -CA "$d/client-ca.crt" -CAkey "$d/client-ca.key" \
      -set_serial "0x$(openssl rand -hex 16)" -days 365 -extfile "$d/kubelet-serving.ext" -out "$d/kubelet-serving.crt"
  } >"$STATE/logs/kubelet-serving-cert.log" 2>&1 ||
    { cat "$STATE/logs/kubelet-serving-cert.log" >&2; die "cannot make the kubelet's serving certificate"; }
}

# local_up_script VERSION: the hack/local-up-cluster.sh of VERSION to run. Up to 1.32 the script
# waits for CoreDNS whenever it starts kube-proxy, even with KUBE_ENABLE_CLUSTER_DNS=false (which
# we set: the suite needs no DNS, and CoreDNS's image is not imported); finding none after about
# 5.5 minutes it exits, and its EXIT trap stops the whole control plane under a running test
# (1.33+ guard the wait with ENABLE_CLUSTER_DNS). For those releases we run a copy with the same
# guard, and with KUBE_ROOT pointing at the module, as the copy lives outside it (the module
# cache is read-only).
local_up_script() {
  local version=$1 moddir script patched
  moddir=$(go env GOMODCACHE)/k8s.io/kubernetes@v$version
  script=$moddir/hack/local-up-cluster.sh
  [ -f "$script" ] || (mkdir -p "$CACHE/k8s-build/v$version" && cd "$CACHE/k8s-build/v$version" && go mod download "k8s.io/kubernetes@v$version")
  if ! grep -q '^        wait_coredns_available$' "$script"; then
    echo "$script"
    return
  fi
  patched=$CACHE/k8s-build/v$version/local-up-cluster.sh
  mkdir -p "$(dirname "$patched")"
  sed -e 's#^KUBE_ROOT=$(dirname "${BASH_SOURCE\[0\]}")/\.\.$#KUBE_ROOT='"$moddir"'#' \
    -e 's#^        wait_coredns_available$#        if [[ "${ENABLE_CLUSTER_DNS}" = true ]]; then wait_coredns_available; fi#' \
    "$script" >"$patched.tmp"
  # Both edits or none: a release whose script reads otherwise must fail here, not later.
  grep -qxF "KUBE_ROOT=$moddir" "$patched.tmp" && ! grep -q '^        wait_coredns_available$' "$patched.tmp" ||
    die "cannot patch $script (its KUBE_ROOT line or CoreDNS wait changed); see local_up_script in lib.sh"
  mv "$patched.tmp" "$patched"
  echo "$patched"
}

local_up_pidfile() {
  case $1 in controlplane) echo "$STATE/run/local-up-cluster.pid" ;; *) echo "$STATE/run/local-up-$1.pid" ;; esac
}

# local_up_check PART: fail with the script's log when that instance of local-up-cluster.sh died.
local_up_check() {
  kill -0 "$(cat "$(local_up_pidfile "$1")")" 2>/dev/null && return 0
  tail -30 "$STATE/logs/local-up-$1.log" >&2
  die "hack/local-up-cluster.sh ($1) exited (log: $STATE/logs/local-up-$1.log)"
}
local_up_check_controlplane() { local_up_check controlplane; }
local_up_check_kubelet() { local_up_check kubelet; }

# wait_api_ready / wait_node_ready SECONDS: what every (re)start waits for.
wait_api_ready() {
  wait_for "$1" "API server ready" sh -c "[ -f '$KUBECONFIG_PATH' ] && kubectl --kubeconfig '$KUBECONFIG_PATH' get --raw /readyz >/dev/null 2>&1" local_up_check_controlplane
}
wait_node_ready() {
  wait_for "$1" "node $NODE_NAME Ready" sh -c "kubectl --kubeconfig '$KUBECONFIG_PATH' get node '$NODE_NAME' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' 2>/dev/null | grep -q True" local_up_check_kubelet
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
  kill -"$sig" "$p" 2>/dev/null || true
  for _ in $(seq 1 $((secs * 5))); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$p" 2>/dev/null || true
  rm -f "$f"
}
