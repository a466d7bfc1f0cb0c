#!/usr/bin/env bash
# Builds gw-gpu-check standalone (cmake -S perf/gpu: needs only cmake, ninja, a C++20 compiler
# and nvcc; fmt headers installed or under $GW_THIRD_PARTY_INCLUDE/fmt) and runs it: every
# GPU-vs-CPU codec comparison, then the throughput table (GB/s of f32 input, 1 MiB .. 1 GiB,
# median of 20). Prints PASS or FAIL last; exits with gw-gpu-check's status (0 pass, 1 fail,
# 3 no GPU). Usage, from the repository root: bash perf/gpu/run_gpu_check.sh [gw-gpu-check args]
# With --allreduce instead: builds and runs gw-gpu-allreduce-check (gw_allreduce_compressed on GPU
# memory against host memory, 2, 3 and then 4 ranks forked on the one GPU; GW_GPU_NPS="2 3 4").
# With --dmabuf instead: builds and runs gw-gpu-dmabuf-check (verbs over its emulator registering
# real CUDA memory through a dma-buf export; needs rdma-core's headers, which gpu_prepare.sh carries).
# With --python instead: builds libgradwire.so standalone and runs the Python package's tests
# (tests/python, test_cuda.py included) under the first python3 that imports torch.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${GW_GPU_CHECK_BUILD:-$root/build/gpu-check}"
mkdir -p "$(dirname "$build")"
args=(-S "$root/perf/gpu" -B "$build" -DCMAKE_BUILD_TYPE=Release)
if command -v ninja >/dev/null; then args+=(-G Ninja); fi
if [[ -n "${GW_THIRD_PARTY_INCLUDE:-}" ]]; then
  args+=("-DGW_THIRD_PARTY_INCLUDE=$GW_THIRD_PARTY_INCLUDE")
fi
if [[ -z "${CUDA_HOME:-}" && -x /usr/local/cuda/bin/nvcc ]]; then export CUDA_HOME=/usr/local/cuda; fi
echo "== configure: cmake ${args[*]}"
cmake "${args[@]}" >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; echo FAIL; exit 1; }
target=gw-gpu-check
[[ "${1:-}" == --allreduce ]] && target=gw-gpu-allreduce-check
[[ "${1:-}" == --python ]] && target=gradwire
[[ "${1:-}" == --dmabuf ]] && target=gw-gpu-dmabuf-check
echo "== build $target"
cmake --build "$build" --target "$target" -j "$(nproc)" >"$build.build.log" 2>&1 ||
  { tail -50 "$build.build.log"; echo FAIL; exit 1; }
if [[ $target == gradwire ]]; then
  py=""
  for p in python3 /usr/bin/python3 python; do
    if command -v "$p" >/dev/null && "$p" -c 'import torch, pytest' 2>/dev/null; then py=$p; break; fi
  done
  [[ -n $py ]] || { echo "no python with torch and pytest"; echo FAIL; exit 1; }
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
  cd "$root"
  GRADWIRE_LIBRARY="$build/libgradwire.so" GW_PYTHON="$(command -v "$py")" GW_TIMEOUT_MS=20000 \
    timeout 280 "$py" -m pytest -q -rs -p no:cacheprovider tests/python && echo PASS || { echo FAIL; exit 1; }
  exit 0
fi
if [[ $target == gw-gpu-dmabuf-check ]]; then
  timeout 120 "$build/gw-gpu-dmabuf-check"
  exit $?
fi
if [[ $target == gw-gpu-allreduce-check ]]; then
  rc=0
  for np in ${GW_GPU_NPS:-2 3 4}; do
    echo "== gw-gpu-allreduce-check --np $np"
    timeout 280 "$build/gw-gpu-allreduce-check" --np "$np" || rc=1
  done
  exit $rc
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm \
  --format=csv,noheader || true
echo "== gw-gpu-check $*"
set +e
timeout 280 "$build/gw-gpu-check" "$@"
rc=$?
set -e
if [[ $rc -eq 124 ]]; then echo "gw-gpu-check: timed out after 280 s"; echo FAIL; fi
exit $rc
