#!/usr/bin/env bash
# Builds the NCCL plugin standalone (cmake -S plugin) into build/plugin-gpu, for a GPU host
# without Debian's -dev packages: needs a C++20 compiler, cmake, and the fmt + spdlog headers
# (installed, or a directory holding fmt/ and spdlog/ given as GW_THIRD_PARTY_INCLUDE=<dir>).
# Used by run_nccl_gpu_check.sh and run_gpu_check.sh --build. Exit status 0 when built.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build="$root/build/plugin-gpu"
mkdir -p "$root/build"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
extra=()
[ -n "${GW_THIRD_PARTY_INCLUDE:-}" ] && extra=(-DGW_THIRD_PARTY_INCLUDE="$GW_THIRD_PARTY_INCLUDE")
echo "== building the plugin standalone in $build"
cmake -S "$root/plugin" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "${extra[@]}" \
  >"$build.cmake.log" 2>&1 || { cat "$build.cmake.log"; echo "build_plugin.sh: cmake failed" >&2; exit 2; }
cmake --build "$build" -j "$(nproc)" >"$build.build.log" 2>&1 || {
  tail -40 "$build.build.log"
  echo "hint: missing fmt/ or spdlog/ headers? copy /usr/include/fmt and /usr/include/spdlog" \
       "from a Debian 12 host into a directory and set GW_THIRD_PARTY_INCLUDE=<dir>" >&2
  echo "build_plugin.sh: build failed" >&2
  exit 2
}
