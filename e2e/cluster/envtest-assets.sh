#!/usr/bin/env bash
# A directory with kube-apiserver, etcd and kubectl for controller-runtime's envtest
# (KUBEBUILDER_ASSETS), from the harness's cached builds. Prints the directory.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
"$HERE/build-k8s.sh" "$K8S_VERSION" >&2
"$HERE/build-tools.sh" etcd >&2
dir=$CACHE/envtest/v$K8S_VERSION
mkdir -p "$dir"
ln -sf "$(k8s_bin_dir "$K8S_VERSION")/kube-apiserver" "$(k8s_bin_dir "$K8S_VERSION")/kubectl" "$(etcd_bin_dir)/etcd" "$dir/"
echo "$dir"
