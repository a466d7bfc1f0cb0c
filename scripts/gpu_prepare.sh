#!/usr/bin/env bash
# Prepares .gpu/ (git-ignored) for the GPU test machine, which has CUDA, cmake, ninja, g++ and
# torch but no apt, no internet and none of the -dev packages this project builds against:
#   .gpu/include/{fmt,spdlog,toml++}  headers for the header-only builds of the NCCL plugin and of the
#                              GPU check programs in perf/gpu/ (GW_THIRD_PARTY_INCLUDE)
#   .gpu/include/{infiniband,rdma}  rdma-core's verbs headers (gw-gpu-dmabuf-check)
#   .gpu/include/{CLI,nlohmann}  CLI11 and nlohmann-json headers (the standalone gradwired)
#   .gpu/include/openssl       OpenSSL 3's headers (Debian's arch-specific ones merged in): the
#                              handshakes link the host's run-time libcrypto.so.3
#   .gpu/peers/                ../shared/peers (the NCCL peer benchmark and with_mps.sh), which
#                              does not travel with the repository
# Then, through the device tool: run(command="bash scripts/gpu_check.sh all", carry=[".gpu"]).
# usage: scripts/gpu_prepare.sh [PEERS_DIR]   (default ../shared/peers beside the checkout)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
peers=${1:-$root/../shared/peers}
dest=$root/.gpu

for d in /usr/include/fmt /usr/include/spdlog /usr/include/toml++; do
  [ -d "$d" ] || { echo "gpu_prepare.sh: $d missing: run scripts/install-deps.sh first" >&2; exit 2; }
done
[ -f "$peers/nccl_torch_allreduce.py" ] || {
  echo "gpu_prepare.sh: no nccl_torch_allreduce.py in $peers (pass the peers directory)" >&2
  exit 2
}
rm -rf "$dest"
mkdir -p "$dest/include"
cp -r /usr/include/fmt /usr/include/spdlog /usr/include/toml++ "$dest/include/"
# CLI11's and nlohmann-json's headers for the standalone gradwired (perf/gpu/CMakeLists.txt).
for d in CLI nlohmann; do
  [ -d "/usr/include/$d" ] && cp -r "/usr/include/$d" "$dest/include/"
done
# rdma-core's headers (and the kernel UAPI ones they include) for gw-gpu-dmabuf-check.
for d in infiniband rdma; do
  [ -d "/usr/include/$d" ] && cp -r "/usr/include/$d" "$dest/include/"
done
if [ -d /usr/include/openssl ]; then
  cp -r /usr/include/openssl "$dest/include/"
  cp /usr/include/x86_64-linux-gnu/openssl/*.h "$dest/include/openssl/" 2>/dev/null || true
fi
cp -r "$peers" "$dest/peers"
echo "gpu_prepare.sh: $dest ready ($(du -sh "$dest" | cut -f1)); carry it: carry=[\".gpu\"]"
