#!/usr/bin/env bash
# Installs what gradwire needs on Debian 12. Idempotent: packages already present are skipped.
# usage: scripts/install-deps.sh           everything: build, test and benchmark
#        scripts/install-deps.sh --build   only what configuring and building the release preset
#                                          needs (the demo); every optional backend's headers are
#                                          included, so the build tree it configures is the one the
#                                          tests later use
set -euo pipefail

build_pkgs=(
  build-essential cmake ninja-build pkg-config git clang-format lld
  libspdlog-dev libfmt-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev prometheus-cpp-dev
  libsystemd-dev
  libgtest-dev libgmock-dev libbenchmark-dev libssl-dev
  libibverbs-dev librdmacm-dev liburing-dev libnuma-dev libpmix-dev
  libdpdk-dev libxdp-dev libbpf-dev
)
# The tests, fuzzers, peers and benchmarks: clang's libFuzzer, Open MPI, UCX's ucx_perftest,
# Debian's torch, network namespaces and captures; a Prometheus server and a Slurm (tests/ops/).
test_pkgs=(
  clang-14 libfuzzer-14-dev
  openmpi-bin libopenmpi-dev ucx-utils
  python3 python3-torch python3-torchvision python3-numpy python3-matplotlib python3-pytest
  python3-venv python3-pip python3-setuptools python3-wheel
  iproute2 procps ethtool dpdk tshark
  prometheus munge slurmctld slurmd slurm-client
)

case "${1:-}" in
  --build) pkgs=("${build_pkgs[@]}") ;;
  "") pkgs=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
  *) echo "usage: $0 [--build]" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
