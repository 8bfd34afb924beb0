#!/usr/bin/env bash
# Images without a container engine: pause, busybox (Debian busybox-static), the e2e probe and the
# project image (from `make build` output), packed by e2e/cmd/mkimage and imported into containerd.
#   images.sh build   build the tarballs
#   images.sh import  import them into the running cluster's containerd (builds what is missing)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
REPO=$(cd "$HERE/../.." && pwd)
IMAGES=$CACHE/images
OUT=$REPO/_output
mkdir -p "$IMAGES" "$OUT/images"

tool() { # tool NAME PKG: build a small Go program of this repo into the cache
  (cd "$REPO" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$CACHE/tools/bin/$1" "$2")
}

build_base() {
  step "building base images (pause, busybox, e2e probe)"
  tool mkimage ./e2e/cmd/mkimage
  tool pause ./e2e/cmd/pause
  tool apiprobe ./e2e/cmd/apiprobe
  local mk=$CACHE/tools/bin/mkimage root=$IMAGES/rootfs
  rm -rf "$root" && mkdir -p "$root"/{pause,busybox/bin,busybox/etc,busybox/tmp,probe}
  cp "$CACHE/tools/bin/pause" "$root/pause/pause"
  "$mk" -rootfs "$root/pause" -out "$IMAGES/pause.tar" -entrypoint /pause \
    -ref registry.k8s.io/pause:3.10.1 -ref registry.k8s.io/pause:3.10 2>/dev/null
  [ -x /bin/busybox ] || die "/bin/busybox is missing: run 'make deps' (Debian package busybox-static)"
  cp /bin/busybox "$root/busybox/bin/busybox"
  for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$root/busybox/bin/$a"; done
  # The upstream reference driver's demo manifests run `bash -c ...`; busybox has no bash applet, so a
  # two-line shim hands bash's arguments to busybox sh (every construct those scripts use is POSIX).
  printf '#!/bin/sh\nexec /bin/sh "$@"\n' > "$root/busybox/bin/bash"
  chmod 755 "$root/busybox/bin/bash"
  echo 'root:x:0:0:root:/root:/bin/sh' > "$root/busybox/etc/passwd"
  echo 'root:x:0:' > "$root/busybox/etc/group"
  chmod 1777 "$root/busybox/tmp"
  # The seed's pod asks for busybox:1.37.0-glibc; with no registry, the same local busybox answers.
  "$mk" -rootfs "$root/busybox" -out "$IMAGES/busybox.tar" -cmd sh \
    -ref docker.io/library/busybox:1.35 -ref docker.io/library/busybox:1.37.0-glibc -ref docker.io/library/busybox:latest 2>/dev/null
  cp "$CACHE/tools/bin/apiprobe" "$root/probe/apiprobe"
  "$mk" -rootfs "$root/probe" -out "$IMAGES/apiprobe.tar" -entrypoint /apiprobe -user 65532 \
    -ref gpu-dra.local/apiprobe:dev 2>/dev/null
}

build_project() {
  local bins=$OUT/bin
  if [ ! -d "$bins" ] || [ -z "$(ls "$bins" 2>/dev/null)" ]; then
    note "no project binaries in $bins yet (make build); skipping the project image"
    return 0
  fi
  step "building project image $PROJECT_IMAGE from $bins"
  tool mkimage ./e2e/cmd/mkimage
  local root=$OUT/images/rootfs
  rm -rf "$root" && mkdir -p "$root/usr/local/bin" "$root/tmp"
  chmod 1777 "$root/tmp"
  cp "$bins"/* "$root/usr/local/bin/"
  "$CACHE/tools/bin/mkimage" -rootfs "$root" -out "$OUT/images/gpu-dra.tar" -user 65532 -ref "$PROJECT_IMAGE" 2>/dev/null
}

import() {
  local ctr="$(tools_bin_dir)/ctr -a $CONTAINERD_SOCK -n k8s.io"
  for t in "$IMAGES/pause.tar" "$IMAGES/busybox.tar" "$IMAGES/apiprobe.tar" "$OUT/images/gpu-dra.tar"; do
    [ -f "$t" ] || continue
    $ctr images import "$t" 2>&1 >/dev/null | grep -v 'DEPRECATION: The support for cgroup v1' >&2 || true
  done
  note "images in containerd: $($ctr images ls -q 2>/dev/null | grep -v '^sha256:' | tr '\n' ' ')"
}

case ${1:-build} in
  build) build_base; build_project ;;
  import)
    [ -f "$IMAGES/busybox.tar" ] && [ -f "$IMAGES/apiprobe.tar" ] || build_base
    import ;;
  *) die "usage: images.sh build|import" ;;
esac
