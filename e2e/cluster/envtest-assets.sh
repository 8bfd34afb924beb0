#!/usr/bin/env bash
# A directory with kube-apiserver, etcd and kubectl for controller-runtime's envtest
# (KUBEBUILDER_ASSETS), from the harness's cached builds. Prints the directory.
# K8S_BINARIES=kube-apiserver (see build-k8s.sh) builds only the API server: enough for tests that
# need no kubectl, e.g. those that run on several releases (testapiserver.ReleaseAssetsDir).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
"$HERE/build-k8s.sh" "$K8S_VERSION" >&2
"$HERE/build-tools.sh" etcd >&2
dir=$CACHE/envtest/v$K8S_VERSION
bin=$(k8s_bin_dir "$K8S_VERSION")
mkdir -p "$dir"
ln -sf "$bin/kube-apiserver" "$(etcd_bin_dir)/etcd" "$dir/"
if [ -x "$bin/kubectl" ]; then ln -sf "$bin/kubectl" "$dir/"; fi
echo "$dir"
