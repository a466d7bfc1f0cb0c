#!/usr/bin/env bash
# Installs everything gradwire needs to build, test and benchmark on Debian 12.
# Idempotent: packages already present are skipped by apt; safe to run repeatedly.
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build pkg-config git clang-format
  libspdlog-dev libfmt-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev prometheus-cpp-dev
  libsystemd-dev
  libgtest-dev libgmock-dev libbenchmark-dev libssl-dev
  clang-14 libfuzzer-14-dev
  libibverbs-dev librdmacm-dev liburing-dev libnuma-dev
  openmpi-bin libopenmpi-dev libpmix-dev
  python3 python3-torch python3-numpy python3-matplotlib python3-pytest
  python3-venv python3-pip python3-setuptools python3-wheel
  iproute2 procps ethtool
  libdpdk-dev dpdk libxdp-dev libbpf-dev tshark
)

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
