#!/usr/bin/env bash
# `cmake --install` into a temporary prefix gives what a user builds against: the library and the
# NCCL plugin in the same libdir, the header, gradwire.pc and the CMake package. The C example
# (examples/hello_allreduce.c) is compiled and run against that prefix twice: with the README's
# pkg-config line and with find_package(gradwire) + gradwire::gradwire. Then the daemon's files:
# gradwired, gradwirectl, the systemd unit and the config, checked by starting the installed daemon.
#
# usage: install_test.sh BUILD_DIR SOURCE_DIR [SANITIZE_FLAGS]
# SANITIZE_FLAGS: the sanitizer flags the build used (an instrumented libgradwire needs an
# instrumented program), empty otherwise.
set -euo pipefail
build=$1
src=$2
san=${3:-}

fail() { echo "install_test: $*" >&2; exit 1; }

tmp=$(mktemp -d /tmp/gw_install_test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || {
  cat "$tmp/install.log" >&2
  fail "cmake --install failed"
}

# The library and the plugin side by side, in one libdir.
lib=$(find "$prefix" -name 'libgradwire.so' -print -quit)
[ -n "$lib" ] || fail "no libgradwire.so under $prefix"
libdir=$(dirname "$lib")
[ -e "$libdir/libnccl-net-gradwire.so" ] || fail "libnccl-net-gradwire.so is not beside $lib"
[ -e "$libdir/libgradwire.so.0" ] || fail "no libgradwire.so.0 (the soname) in $libdir"
# DPDK is a module beside the library (built where libdpdk-dev was found); the library needs none.
if [ -e "$build/capi/libgradwire_dpdk.so" ]; then
  [ -f "$libdir/libgradwire_dpdk.so" ] || fail "libgradwire_dpdk.so is not beside $lib"
fi
if command -v readelf >/dev/null; then
  readelf -d "$lib" | grep NEEDED | grep -q librte_ && fail "the installed libgradwire.so links DPDK"
fi
[ -f "$prefix/include/gradwire/gradwire.h" ] || fail "no include/gradwire/gradwire.h"
[ -f "$libdir/pkgconfig/gradwire.pc" ] || fail "no $libdir/pkgconfig/gradwire.pc"
[ -f "$libdir/cmake/gradwire/gradwireConfig.cmake" ] || fail "no gradwireConfig.cmake"
grep -rq "$src" "$libdir/pkgconfig/gradwire.pc" "$libdir/cmake/gradwire/" &&
  fail "an installed package file names the source tree $src"

run_hello() {  # run_hello BINARY WHAT
  local out
  out=$(env -i PATH="$PATH" LD_LIBRARY_PATH="$libdir" GW_RANK=0 GW_WORLD_SIZE=1 "$1" 2>&1) ||
    fail "$2: the program failed: $out"
  grep -q "hello_allreduce: rank 0 of 1, gradwire .*: sum 1 (ok)" <<<"$out" ||
    fail "$2: unexpected output: $out"
  echo "install_test: $2: $out"
}

# 1. The README's line: cc hello_allreduce.c $(pkg-config --cflags --libs gradwire).
export PKG_CONFIG_PATH=$libdir/pkgconfig
ver=$(pkg-config --modversion gradwire) || fail "pkg-config does not find gradwire"
grep -q "^#define GW_VERSION_MAJOR ${ver%%.*}\$" "$prefix/include/gradwire/gradwire.h" ||
  fail "gradwire.pc says version $ver, the header another"
# shellcheck disable=SC2046,SC2086
cc -std=c11 -Wall -Werror $san "$src/examples/hello_allreduce.c" $(pkg-config --cflags --libs gradwire) \
  -o "$tmp/hello_pc" || fail "compiling with pkg-config failed"
run_hello "$tmp/hello_pc" pkg-config

# 2. find_package(gradwire) and gradwire::gradwire.
mkdir -p "$tmp/consumer"
cat >"$tmp/consumer/CMakeLists.txt" <<CML
cmake_minimum_required(VERSION 3.20)
project(consumer C)
find_package(gradwire ${ver%%.*} REQUIRED)
add_executable(hello "$src/examples/hello_allreduce.c")
target_link_libraries(hello PRIVATE gradwire::gradwire)
CML
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" >"$tmp/consumer.log" 2>&1 || {
  cat "$tmp/consumer.log" >&2
  fail "configuring a project with find_package(gradwire) failed"
}
cmake --build "$tmp/consumer/build" >>"$tmp/consumer.log" 2>&1 || {
  cat "$tmp/consumer.log" >&2
  fail "building against gradwire::gradwire failed"
}
run_hello "$tmp/consumer/build/hello" find_package

# 3. The daemon: gradwired, gradwirectl, the systemd unit naming them where they were installed,
# the example config (as .example, and as gradwired.toml unless one exists), which the installed
# daemon starts with and gradwirectl reads back.
gwd=$prefix/sbin/gradwired
gwctl=$prefix/bin/gradwirectl
unit=$prefix/lib/systemd/system/gradwired.service
conf=$prefix/etc/gradwire/gradwired.toml
[ -x "$gwd" ] || fail "no $gwd"
[ -x "$gwctl" ] || fail "no $gwctl"
[ -f "$unit" ] || fail "no $unit"
[ -f "$conf.example" ] || fail "no $conf.example"
[ -f "$conf" ] || fail "no $conf"
grep -q '@[A-Z_]*@' "$unit" && fail "$unit has an unfilled @VARIABLE@: $(grep '@[A-Z_]*@' "$unit")"
grep -q "^ExecStart=$gwd --foreground --config $conf " "$unit" ||
  fail "$unit does not start $gwd with $conf: $(grep ExecStart "$unit")"
grep -q '^Type=notify$' "$unit" || fail "$unit is not Type=notify"
grep -q '^WatchdogSec=' "$unit" || fail "$unit has no WatchdogSec"
if command -v systemd-analyze >/dev/null; then
  # Only the unit's own problems count (a container may lack a running systemd).
  verify=$(systemd-analyze verify "$unit" 2>&1 | grep -F "gradwired.service" || true)
  [ -z "$verify" ] || fail "systemd-analyze verify $unit: $verify"
fi
echo "# edited" >>"$conf"
cmake --install "$build" --prefix "$prefix" >"$tmp/install2.log" 2>&1 || fail "second install failed"
grep -q '^# edited$' "$conf" || fail "a second install overwrote the edited $conf"
sock=$tmp/gwd.sock
env -i PATH="$PATH" "$gwd" --config "$conf" --socket "$sock" >"$tmp/gwd.log" 2>&1 ||
  fail "the installed gradwired did not start with $conf: $(cat "$tmp/gwd.log")"
pid=$(sed -n 's/.*pid \([0-9]*\)).*/\1/p' "$tmp/gwd.log")
[ -n "$pid" ] || fail "no pid in: $(cat "$tmp/gwd.log")"
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
out=$(env -i PATH="$PATH" "$gwctl" config --socket "$sock") || fail "gradwirectl config: $out"
grep -Eq "^GW_LOG_LEVEL +info +$conf:[0-9]+ " <<<"$out" ||
  fail "gradwirectl config does not show log_level from $conf: $out"
kill "$pid"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "gradwired $pid did not stop on SIGTERM"
[ ! -e "$sock" ] || fail "gradwired left $sock behind"
echo "install_test: daemon: $gwd, $gwctl, $unit, $conf"
echo "install_test: ok"
