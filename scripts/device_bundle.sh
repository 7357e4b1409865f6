#!/usr/bin/env bash
# Collect built test/bench binaries and the non-system shared libraries they need (fmt, TBB,
# ...; the CUDA runtime, cuBLAS and NCCL come from the toolkit / the nvidia-nccl wheel there) into .devbundle/ so they can be carried to the GPU machine, which has no Debian packages.
# Usage: scripts/device_bundle.sh BUILD_DIR binary...   (then carry .devbundle and run
#   `LD_LIBRARY_PATH=.devbundle/lib .devbundle/bin/<binary>` there)
set -euo pipefail
build="$1"; shift
rm -rf .devbundle && mkdir -p .devbundle/bin .devbundle/lib
grep -qx '/.devbundle/' .git/info/exclude 2>/dev/null || echo '/.devbundle/' >> .git/info/exclude
for b in "$@"; do
  src=$(find "$build" -type f -name "$b" -perm -u+x | head -n 1)
  [ -n "$src" ] || { echo "device_bundle: $b not found under $build" >&2; exit 1; }
  cp "$src" .devbundle/bin/
  ldd "$src" | awk '/=>/ {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libcublas*|libcudart*|libnccl*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libgcc_s.so*|libstdc++.so*|libcuda.so*|ld-linux*) ;;
      *) cp -n "$lib" .devbundle/lib/ ;;
    esac
  done
done
du -sh .devbundle
