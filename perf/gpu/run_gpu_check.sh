#!/usr/bin/env bash
# Builds the GPU check programs standalone (cmake -S perf/gpu: needs only cmake, ninja, a C++20
# compiler and nvcc; fmt/spdlog/CLI11/nlohmann-json/rdma-core headers installed or under
# $GW_THIRD_PARTY_INCLUDE) and runs one of them. Usage, from the repository root:
#   bash perf/gpu/run_gpu_check.sh [gw-gpu-check args]
#       every GPU-vs-CPU codec comparison, then the throughput table (GB/s of f32 input, 1 MiB ..
#       1 GiB, median of 20); PASS or FAIL last; exit 0 pass, 1 fail, 3 no GPU
#   --build      configure and build every program here, and the NCCL plugin standalone
#                (build/plugin-gpu), side by side; the other modes build only what they run
#   --targets T...  configure and build those targets of this build only (e.g. gradwired
#                nccl-net-gradwire: the plugin with daemon mode, build/gpu-check/plugin)
#   --allreduce  gw-gpu-allreduce-check: gw_allreduce_compressed on GPU memory against host
#                memory, 2 and then 4 ranks forked on the one GPU (GW_GPU_NPS="2 4")
#   --dmabuf     gw-gpu-dmabuf-check: verbs over its emulator registering real CUDA memory
#                through a dma-buf export
#   --python     the Python package's tests (tests/python, test_cuda.py included) against the
#                standalone libgradwire.so, under the first python3 that imports torch
#   --devmem     devmem_check.py, 2 ranks, in direct mode and through the standalone gradwired
#   --daemon     device_trainer (tests/daemon) through the standalone gradwired: 2 and 4 trainer
#                processes on the GPU, every collective on device buffers imported over CUDA IPC,
#                checked exactly; the daemon's imports back to 0 after each job (gradwirectl)
#   --ddp        examples/train_ddp.py --device cuda, 2 ranks under MPS: gloo, nccl, the gradwire
#                backend and hooks, torch's powerSGD over NCCL, in two jobs (DDP_CONFIGS: a
#                space-separated list of --configs values, one job each)
#   --suite      torch's distributed_test.py on the gradwire backend (run_torch_distributed_test.sh),
#                with pytest-xdist over SUITE_WORKERS workers (default 6) where installed;
#                SUITE_TESTS="test_a test_b ..." runs those tests only
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${GW_GPU_CHECK_BUILD:-$root/build/gpu-check}"
mkdir -p "$(dirname "$build")"
if [[ -z "${CUDA_HOME:-}" && -x /usr/local/cuda/bin/nvcc ]]; then export CUDA_HOME=/usr/local/cuda; fi
mode=${1:-}

configure() {
  local args=(-S "$root/perf/gpu" -B "$build" -DCMAKE_BUILD_TYPE=Release)
  if command -v ninja >/dev/null; then args+=(-G Ninja); fi
  if [[ -n "${GW_THIRD_PARTY_INCLUDE:-}" ]]; then
    args+=("-DGW_THIRD_PARTY_INCLUDE=$GW_THIRD_PARTY_INCLUDE")
  fi
  [[ -f $build/CMakeCache.txt ]] && return 0
  echo "== configure: cmake ${args[*]}"
  cmake "${args[@]}" >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; echo FAIL; exit 1; }
}
build_targets() {
  configure
  echo "== build $*"
  cmake --build "$build" --target "$@" -j "$(nproc)" >"$build.build.log" 2>&1 ||
    { tail -50 "$build.build.log"; echo FAIL; exit 1; }
}
python_with_torch() {
  for p in python3 /usr/bin/python3 python; do
    if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then command -v "$p"; return; fi
  done
  echo "no python with torch" >&2
  echo FAIL
  exit 1
}
peers=${PEERS:-$root/.gpu/peers}
launch() {  # launch NP CMD...: the package's launcher, the standalone library
  local np=$1
  shift
  GRADWIRE_LIBRARY="$build/libgradwire.so" PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$py" "$root/python/bin/gradwire-run" -np "$np" -- "$@"
}

case $mode in
  --build)
    configure
    t0=$SECONDS
    cmake --build "$build" -j "$(nproc)" >"$build.build.log" 2>&1 &
    checks=$!
    pb="$root/build/plugin-gpu"
    bash "$root/perf/gpu/build_plugin.sh" >"$pb.log" 2>&1 &
    plugin=$!
    rc=0
    wait $checks || { tail -40 "$build.build.log"; rc=1; }
    wait $plugin || { tail -40 "$pb.log"; rc=1; }
    ls -la "$build"/gw-gpu-* "$build"/gradwired "$build"/libgradwire.so "$pb"/*.so 2>&1
    echo "built in $((SECONDS - t0)) s"
    [[ $rc == 0 ]] && echo PASS || echo FAIL
    exit $rc
    ;;
  --targets)
    shift
    t0=$SECONDS
    build_targets "$@"
    ls -la "$build/plugin" "$build/gradwired" 2>&1
    echo "built in $((SECONDS - t0)) s"
    echo PASS
    ;;
  --allreduce)
    build_targets gw-gpu-allreduce-check
    rc=0
    for np in ${GW_GPU_NPS:-2 4}; do
      echo "== gw-gpu-allreduce-check --np $np"
      timeout 280 "$build/gw-gpu-allreduce-check" --np "$np" || rc=1
    done
    exit $rc
    ;;
  --dmabuf)
    build_targets gw-gpu-dmabuf-check
    timeout 120 "$build/gw-gpu-dmabuf-check"
    exit $?
    ;;
  --python)
    build_targets gradwire gradwired gradwirectl
    py=$(python_with_torch)
    "$py" -c 'import torch, pytest; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
    cd "$root"
    GRADWIRE_LIBRARY="$build/libgradwire.so" GW_PYTHON="$py" GW_TIMEOUT_MS=20000 \
      timeout 280 "$py" -m pytest -q -rs -p no:cacheprovider tests/python \
      --ignore=tests/python/test_torch_suite.py && echo PASS || { echo FAIL; exit 1; }
    ;;
  --devmem)
    build_targets gradwire gradwired
    py=$(python_with_torch)
    echo "== direct mode"
    launch 2 "$py" "$root/perf/gpu/devmem_check.py"
    dir=$(mktemp -d)
    "$build/gradwired" --foreground --socket "$dir/s.sock" >"$dir/daemon.log" 2>&1 &
    daemon=$!
    for _ in $(seq 50); do [[ -S $dir/s.sock ]] && break; sleep 0.1; done
    echo "== daemon mode"
    rc=0
    GW_DAEMON="unix:$dir/s.sock" launch 2 "$py" "$root/perf/gpu/devmem_check.py" || rc=1
    kill "$daemon"; wait "$daemon" || true
    tail -5 "$dir/daemon.log"
    rm -rf "$dir"
    [[ $rc == 0 ]] && echo PASS || { echo FAIL; exit 1; }
    ;;
  --daemon)
    build_targets gradwire gradwired gradwirectl device_trainer
    dir=$(mktemp -d)
    "$build/gradwired" --foreground --socket "$dir/s.sock" >"$dir/daemon.log" 2>&1 &
    daemon=$!
    for _ in $(seq 50); do [[ -S $dir/s.sock ]] && break; sleep 0.1; done
    rc=0
    for np in 2 4; do
      port=$((29000 + RANDOM % 1000))
      pids=()
      for r in $(seq 0 $((np - 1))); do
        GW_DAEMON="unix:$dir/s.sock" GW_LOG_LEVEL=info "$build/device_trainer" --rank "$r" \
          --world "$np" --store "127.0.0.1:$port" --timeout-ms 60000 suite 1000003 \
          >"$dir/t$np.$r.log" 2>&1 &
        pids+=($!)
      done
      for p in "${pids[@]}"; do wait "$p" || rc=1; done
      echo "== $np trainers"; grep -h "RESULT\|ERROR\|CUDA IPC\|staged" "$dir"/t$np.*.log | sort | uniq -c
      sleep 0.5
      "$build/gradwirectl" status --socket "$dir/s.sock" | grep -i "imports" || rc=1
    done
    kill "$daemon"; wait "$daemon" || true
    grep -h "device buffers\|could not" "$dir/daemon.log" | head -5
    rm -rf "$dir"
    [[ $rc == 0 ]] && echo PASS || { echo FAIL; exit 1; }
    ;;
  --ddp)
    build_targets gradwire gradwired gradwirectl
    py=$(python_with_torch)
    cd "$root"
    mkdir -p "$root/build/gpu-check-logs"
    # Two jobs, so that a configuration that fails does not take the others' rows with it.
    rc=0
    n=0
    for configs in ${DDP_CONFIGS:-gloo,nccl,gradwire,gw-fp16,gw-topk:0.01,gw-powersgd:4 \
                   nccl,nccl-torch-powersgd:4,gw-powersgd:4}; do
      n=$((n + 1))
      echo "== train_ddp.py --device cuda --configs $configs"
      timeout -k 5 "${DDP_TIMEOUT:-60}" bash "$peers/with_mps.sh" env \
        GRADWIRE_LIBRARY="$build/libgradwire.so" PYTHONPATH="$root/python" GW_TIMEOUT_MS=30000 \
        "$py" "$root/python/bin/gradwire-run" -np 2 -- "$py" examples/train_ddp.py --device cuda \
        --steps 30 --configs "$configs" --png "$root/build/gpu-check-logs/train_ddp_$n.png" || rc=1
    done
    exit $rc
    ;;
  --suite)
    build_targets gradwire gradwired gradwirectl
    py=$(python_with_torch)
    extra=()
    if "$py" -c 'import xdist' 2>/dev/null; then extra=(-n "${SUITE_WORKERS:-6}"); fi
    cd "$root"
    # The suite's TestDistBackend._run skips every test ("multi-gpu-N") when CUDA is available
    # with fewer GPUs than ranks, as on a one-GPU machine; the backend's CUDA path is tested by
    # --python and --ddp, so the suite runs with the GPU hidden (SUITE_CUDA=1 keeps it).
    [[ ${SUITE_CUDA:-0} == 1 ]] || export CUDA_VISIBLE_DEVICES=""
    GRADWIRE_LIBRARY="$build/libgradwire.so" GW_PYTHON="$py" SUITE_TIMEOUT=${SUITE_TIMEOUT:-0} \
      bash tests/python/run_torch_distributed_test.sh -- "${extra[@]}" ${SUITE_TESTS:-}
    ;;
  *)
    build_targets gw-gpu-check
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm \
      --format=csv,noheader || true
    echo "== gw-gpu-check $*"
    set +e
    timeout 280 "$build/gw-gpu-check" "$@"
    rc=$?
    set -e
    if [[ $rc -eq 124 ]]; then echo "gw-gpu-check: timed out after 280 s"; echo FAIL; fi
    exit $rc
    ;;
esac
