# Sourced by the bench/run_*_on_device.sh scripts on the GPU machine:
#   source bench/device_env.sh BUNDLE.tar.xz || exit 1   (or an already unpacked bundle folder)
# unpacks the carried bundle (scripts/device_bundle.sh, then `tar -cf - .devbundle | xz`) with
# Python (no xz binary needed there) unless given the folder a previous call of a machine still
# warm unpacked, points the loader at its libraries, the CUDA toolkit and the image's NCCL wheel
# (NVLink multicast off), the tests at the carried conformance folder .conf/ and this copy's
# tests/model/data, and sets `bin`.
if [ -d "$1" ]; then
  bundle=$(cd "$1" && pwd)
else
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall('.')" "$1" || return 1
  bundle=$PWD/.devbundle
fi
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$bundle/lib:/usr/local/cuda/lib64:${nccl:-} EXL3_CONFORMANCE_DIR=$PWD/.conf
export EXL3_SOURCE_DIR=$PWD  # the tests' reference checkpoints (tests/model/data) in this copy
export NCCL_NVLS_ENABLE=0
bin=$bundle/bin

# gpu_tests LOG SUMMARY: the GPU's name, driver and clocks, then each cuda_*_test (and runtime_test
# when bundled; server_load_test on the CUDA engine too) into LOG, with one line per binary (exit
# status, seconds, its result) into SUMMARY.
gpu_tests() {
  local log="$1" summary="$2" t name start
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv > "$log" 2>&1
  for t in "$bin"/cuda_*_test "$bin"/runtime_test; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    echo "=== $name" >> "$log"
    start=$(date +%s)
    timeout 240 "$t" --gtest_brief=1 >> "$log" 2>&1
    echo "$name rc=$? $(( $(date +%s) - start ))s $(grep -E '^\[  (PASSED|FAILED) ' "$log" | tail -n 1)" | tee -a "$summary"
  done
  # The server's load and fault suite on the CUDA engine, when bundled.
  if [ -x "$bin/server_load_test" ]; then
    echo "=== server_load_test (EXL3_SERVER_TEST_DEVICE=cuda)" >> "$log"
    start=$(date +%s)
    EXL3_SERVER_TEST_DEVICE=cuda timeout 240 "$bin/server_load_test" >> "$log" 2>&1
    echo "server_load_test (cuda) rc=$? $(( $(date +%s) - start ))s $(grep -E '^\[  (PASSED|FAILED) ' "$log" | tail -n 1)" | tee -a "$summary"
  fi
}

# synthetic DIR LOG ARGS...: `exl3 bench model --synthetic ARGS --out DIR --prepare-only` (output
# into LOG) unless DIR already holds a model (a machine kept warm keeps /tmp between calls).
synthetic() {
  local dir="$1" log="$2"
  shift 2
  [ -f "$dir/config.json" ] || timeout 300 "$bin/exl3" bench model --synthetic "$@" --out "$dir" \
    --prepare-only > "$log" 2>&1
}
