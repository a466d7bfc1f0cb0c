#!/usr/bin/env bash
# Every check that needs a GPU, for the GPU test machine (run scripts/gpu_prepare.sh here first
# and carry .gpu/ along). One call of the device tool runs at most 10 minutes, so the parts can
# be run one at a time:
#   scripts/gpu_check.sh kernels   gpudirect's CUDA codec kernels against the CPU ones + GB/s
#   scripts/gpu_check.sh allreduce gw_allreduce_compressed on GPU memory vs host memory (2-4 ranks)
#   scripts/gpu_check.sh dmabuf    verbs (emulated NIC) registering real CUDA memory via dma-buf
#   scripts/gpu_check.sh python    the Python package's tests (tests/python, CUDA tensors
#                                  included) against a standalone libgradwire.so, the host's torch
#   scripts/gpu_check.sh plugin    NCCL allreduce through libnccl-net-gradwire.so vs NCCL Socket,
#                                  2 and 4 ranks on the one GPU under MPS (issue 3's table)
#   scripts/gpu_check.sh all       all five (default)
# Logs go to $OUT (the device tool's output folder) when set, else build/gpu-check-logs.
# Exit status: 0 when every part passed, else the first failing part's status.
set -u -o pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
what=${1:-all}
case $what in kernels|allreduce|dmabuf|python|plugin|all) ;; *) echo "usage: $0 [kernels|allreduce|dmabuf|python|plugin|all]" >&2; exit 2 ;; esac
logs=${OUT:-$root/build/gpu-check-logs}
mkdir -p "$logs"
[ -d "$root/.gpu/include" ] && export GW_THIRD_PARTY_INCLUDE="$root/.gpu/include"
[ -d "$root/.gpu/peers" ] && export PEERS="${PEERS:-$root/.gpu/peers}"
export RUN_TIMEOUT=${RUN_TIMEOUT:-150}

command -v nvidia-smi >/dev/null || { echo "gpu_check.sh: no nvidia-smi: not a GPU machine" >&2; exit 2; }
{ nvidia-smi -L; nvcc --version 2>/dev/null | tail -1; g++ --version | head -1; } | tee "$logs/machine.txt"

rc=0
part() {
  local name=$1
  shift
  echo "== $name"
  local start=$SECONDS
  "$@" 2>&1 | tee "$logs/$name.log"
  local r=${PIPESTATUS[0]}
  echo "== $name: exit $r after $((SECONDS - start)) s"
  [ "$rc" = 0 ] && rc=$r
}
if [ "$what" = kernels ] || [ "$what" = all ]; then
  if [ -f perf/gpu/run_gpu_check.sh ]; then
    part kernels bash perf/gpu/run_gpu_check.sh
  else
    echo "gpu_check.sh: perf/gpu/run_gpu_check.sh missing" >&2; rc=2
  fi
fi
if [ "$what" = allreduce ] || [ "$what" = all ]; then
  part allreduce bash perf/gpu/run_gpu_check.sh --allreduce
fi
if [ "$what" = dmabuf ] || [ "$what" = all ]; then
  part dmabuf bash perf/gpu/run_gpu_check.sh --dmabuf
fi
if [ "$what" = python ] || [ "$what" = all ]; then
  part python bash perf/gpu/run_gpu_check.sh --python
fi
[ "$what" = plugin ] || [ "$what" = all ] && part plugin bash perf/gpu/run_nccl_gpu_check.sh
exit "$rc"
