#!/usr/bin/env bash
# Install what `make test` and `make demo` need on a fresh Debian machine of this kind: Debian
# packages for the local cluster, and Go tools from the module proxy (into the harness cache).
set -euo pipefail
source "$(dirname "$0")/../e2e/cluster/lib.sh"

pkgs=(runc containernetworking-plugins iptables conntrack socat ethtool kmod sudo openssl curl
  busybox-static iproute2 psmisc ca-certificates)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "missing Debian packages (${missing[*]}); run as root or install them"
  step "installing Debian packages: ${missing[*]}"
  timed "apt-get update" apt-get update
  DEBIAN_FRONTEND=noninteractive timed "apt-get install" apt-get install -y --no-install-recommends "${missing[@]}"
else
  step "Debian packages present"
fi

bin=$(tools_bin_dir)
mkdir -p "$bin"
install_tool() { # NAME MODULE/PKG@VERSION
  local stamp=$bin/.$1.version
  [ -x "$bin/$1" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$2" ] && return 0
  GOBIN=$bin timed "go install $2" go install "$2"
  echo "$2" > "$stamp"
}
install_tool staticcheck honnef.co/go/tools/cmd/staticcheck@${STATICCHECK_VERSION:-v0.8.2}
install_tool benchstat golang.org/x/perf/cmd/benchstat@${BENCHSTAT_VERSION:-v0.0.0-20260908200009-22c9c6c9d4da}
# The load tool of `make bench`: a separate process sends the webhook its AdmissionReviews.
install_tool vegeta github.com/tsenart/vegeta/v12@${VEGETA_VERSION:-v12.13.0}
# The chart's alerting rules are checked and unit-tested with promtool, and scraped by a real
# Prometheus in the e2e: Debian's package, unpacked into the tools directory rather than installed
# (its maintainer scripts would start a server as a system service).
install_prometheus() {
  [ -x "$bin/promtool" ] && [ -x "$bin/prometheus" ] && return 0
  local d
  d=$(mktemp -d)
  if ! (cd "$d" && apt-get download prometheus >/dev/null 2>&1); then
    [ "$(id -u)" = 0 ] || die "cannot download Debian's prometheus package; run as root (apt-get update)"
    timed "apt-get update" apt-get update
    (cd "$d" && timed "apt-get download prometheus" apt-get download prometheus)
  fi
  dpkg-deb -x "$d"/prometheus_*.deb "$d/x"
  install -m 0755 "$d/x/usr/bin/prometheus" "$d/x/usr/bin/promtool" "$bin/"
  rm -rf "$d"
}
install_prometheus
# The chart tests validate rendered manifests against the OpenAPI specs shipped in these releases.
timed "go mod download k8s.io/kubernetes (OpenAPI specs $K8S_RELEASE_OLDEST/$K8S_RELEASE_SEED/$K8S_RELEASE_NEWEST)" \
  go mod download k8s.io/kubernetes@v$K8S_RELEASE_OLDEST k8s.io/kubernetes@v$K8S_RELEASE_SEED k8s.io/kubernetes@v$K8S_RELEASE_NEWEST
step "tools ready in $bin"
