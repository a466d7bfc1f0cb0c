#!/usr/bin/env bash
# The Debian packages (cmake/packaging.cmake) build and work once installed (issue 34, item 10):
# `cpack -G DEB` of the (already built) build tree into a temporary folder, then every package is
# unpacked with `dpkg-deb -x` into one throwaway root, and from that root:
#   - each package holds what it should, the daemon's config is a conffile, Depends name the
#     sibling packages at this version, and `apt-get install -s ./*.deb` resolves them (as root);
#   - libgradwire.so.0 and the NCCL plugin load (dlopen) and export their entry points;
#   - pkg-config finds gradwire in the root (PKG_CONFIG_SYSROOT_DIR, PKG_CONFIG_LIBDIR) and
#     examples/hello_allreduce.c compiles, links and runs against the root's header and library,
#     as does a find_package(gradwire) project;
#   - gradwired --help and gradwire-perf --version run; the unit starts /usr/sbin/gradwired with
#     /etc/gradwire/gradwired.toml;
#   - the Python package imports from the root's /usr/lib/python3/dist-packages.
# The temporary folder is removed on every exit.
# usage: deb_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
say() { echo "deb_test: $*"; }
fail() { say "FAIL: $*" >&2; exit 1; }

for t in cpack dpkg-deb dpkg-shlibdeps cc; do
  command -v "$t" >/dev/null || { say "skipped: no $t (Debian: dpkg-dev, cmake, gcc)"; exit 77; }
done
py=/usr/bin/python3
[ -x "$py" ] || py=python3

tmp=$(mktemp -d /tmp/gw_deb_test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
mkdir -p "$root" "$tmp/pkgs"

timeout 600 cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/pkgs" \
  >"$tmp/cpack.log" 2>&1 || {
  cat "$tmp/cpack.log" >&2
  fail "cpack -G DEB failed"
}
version=$(sed -n 's/^project(gradwire VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ -n "$version" ] || fail "no version in $src/CMakeLists.txt"
debs=()
for p in libgradwire0 libgradwire-dev gradwired gradwire-tools python3-gradwire; do
  f=$(ls "$tmp/pkgs/${p}_${version}_"*.deb 2>/dev/null | head -1)
  [ -n "$f" ] || fail "no ${p}_${version}_*.deb among: $(ls "$tmp/pkgs")"
  debs+=("$f")
done
[ -e "$build/capi/libgradwire_dpdk.so" ] && {
  f=$(ls "$tmp/pkgs/gradwire-dpdk_${version}_"*.deb 2>/dev/null | head -1)
  [ -n "$f" ] || fail "the build has the DPDK module but there is no gradwire-dpdk package"
  debs+=("$f")
}
say "built: $(cd "$tmp/pkgs" && ls ./*.deb | tr '\n' ' ')"
for f in "${debs[@]}"; do
  dpkg-deb -x "$f" "$root" || fail "dpkg-deb -x $f"
  # Nothing of the build machine's paths inside a package (a staging folder, the source tree).
  files=$(dpkg-deb -c "$f" | awk '{ print $6 }')
  if [ -n "$(grep -v '^\./\(usr\|etc\)/' <<<"$files" | grep -v '^\./$')" ]; then
    fail "$(basename "$f") installs outside /usr and /etc: $files"
  fi
done
pkg() { ls "$tmp/pkgs/${1}_${version}_"*.deb; }

# Contents and control fields.
for f in usr/lib/libgradwire.so.0 usr/lib/libnccl-net-gradwire.so usr/lib/libnccl-net.so \
  usr/include/gradwire/gradwire.h usr/lib/libgradwire.so usr/lib/pkgconfig/gradwire.pc \
  usr/lib/cmake/gradwire/gradwireConfig.cmake usr/sbin/gradwired usr/bin/gradwirectl \
  usr/lib/systemd/system/gradwired.service etc/gradwire/gradwired.toml \
  etc/gradwire/gradwired.toml.example usr/bin/gradwire-perf usr/bin/gradwire-run \
  usr/lib/python3/dist-packages/gradwire/__init__.py; do
  [ -e "$root/$f" ] || fail "no /$f in the packages"
done
lib_files=$(dpkg-deb -c "$(pkg libgradwire0)")
grep -q 'include/' <<<"$lib_files" && fail "libgradwire0 holds headers"
grep -q 'libgradwire\.so$' <<<"$lib_files" &&
  fail "libgradwire0 holds the libgradwire.so link (libgradwire-dev's)"
grep -qx /etc/gradwire/gradwired.toml <<<"$(dpkg-deb -I "$(pkg gradwired)" conffiles)" ||
  fail "gradwired's /etc/gradwire/gradwired.toml is not a conffile"
for p in libgradwire-dev gradwire-tools; do
  grep -q "libgradwire0 (= $version)" <<<"$(dpkg-deb -f "$(pkg $p)" Depends)" ||
    fail "$p does not depend on libgradwire0 (= $version): $(dpkg-deb -f "$(pkg $p)" Depends)"
done
grep -q libspdlog <<<"$(dpkg-deb -f "$(pkg gradwired)" Depends)" ||
  fail "gradwired has no shared-library dependencies: $(dpkg-deb -f "$(pkg gradwired)" Depends)"
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  (cd "$tmp/pkgs" && timeout 120 apt-get install -s --no-install-recommends ./*.deb) \
    >"$tmp/apt.log" 2>&1 || {
    cat "$tmp/apt.log" >&2
    fail "apt-get install -s ./*.deb does not resolve"
  }
  say "apt-get install -s ./*.deb: $(grep -c '^Inst' "$tmp/apt.log") packages would be installed"
fi

# The libraries load from the root.
"$py" - "$root/usr/lib" <<'EOF' || fail "a library of the root does not load"
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1] + "/libgradwire.so.0")
lib.gw_version.restype = ctypes.c_char_p
print("deb_test: libgradwire.so.0 loads, gw_version() =", lib.gw_version().decode())
plugin = ctypes.CDLL(sys.argv[1] + "/libnccl-net-gradwire.so")
for v in (8, 9, 10, 11):
    getattr(plugin, "ncclNetPlugin_v%d" % v)
print("deb_test: libnccl-net-gradwire.so loads, ncclNetPlugin_v8..v11 exported")
EOF

# pkg-config in the root, and the C example against the root's header and library.
export PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_LIBDIR=$root/usr/lib/pkgconfig
flags=$(pkg-config --cflags --libs gradwire) || fail "pkg-config does not find gradwire in $root"
[ "$(pkg-config --modversion gradwire)" = "$version" ] || fail "gradwire.pc is not version $version"
grep -q -- "-I$root/" <<<"$flags" || fail "pkg-config's -I is not inside the root: $flags"
grep -q -- "-L$root/" <<<"$flags" || fail "pkg-config's -L is not inside the root: $flags"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Werror "$src/examples/hello_allreduce.c" $flags -o "$tmp/hello" ||
  fail "hello_allreduce.c does not build with: $flags"
unset PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_LIBDIR
run_hello() {  # run_hello BINARY WHAT
  local out
  out=$(env -i PATH="$PATH" LD_LIBRARY_PATH="$root/usr/lib" GW_RANK=0 GW_WORLD_SIZE=1 \
    timeout 30 "$1" 2>&1) || fail "$2: hello_allreduce failed: $out"
  grep -q "sum 1 (ok)" <<<"$out" || fail "$2: unexpected output: $out"
  say "$2: $out"
}
run_hello "$tmp/hello" pkg-config
deps=$(LD_LIBRARY_PATH="$root/usr/lib" ldd "$tmp/hello")
grep -q "libgradwire.so.0 => $root/usr/lib/libgradwire.so.0" <<<"$deps" ||
  fail "hello does not use the root's library: $deps"
mkdir -p "$tmp/consumer"
cat >"$tmp/consumer/CMakeLists.txt" <<CML
cmake_minimum_required(VERSION 3.20)
project(consumer C)
find_package(gradwire $version EXACT REQUIRED)
add_executable(hello "$src/examples/hello_allreduce.c")
target_link_libraries(hello PRIVATE gradwire::gradwire)
CML
{ cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$root/usr" &&
  cmake --build "$tmp/consumer/build"; } >"$tmp/consumer.log" 2>&1 || {
  cat "$tmp/consumer.log" >&2
  fail "find_package(gradwire) from $root/usr failed"
}
run_hello "$tmp/consumer/build/hello" find_package

# The daemon and the tools.
out=$(LD_LIBRARY_PATH="$root/usr/lib" timeout 10 "$root/usr/sbin/gradwired" --help 2>&1) ||
  fail "gradwired --help: $out"
grep -q -- "--metrics" <<<"$out" || fail "gradwired --help lacks --metrics: $out"
out=$(LD_LIBRARY_PATH="$root/usr/lib" timeout 10 "$root/usr/bin/gradwirectl" --help 2>&1) ||
  fail "gradwirectl --help: $out"
out=$(LD_LIBRARY_PATH="$root/usr/lib" timeout 10 "$root/usr/bin/gradwire-perf" --version 2>&1) ||
  fail "gradwire-perf --version: $out"
grep -q "$version" <<<"$out" || fail "gradwire-perf --version is not $version: $out"
unit=$root/usr/lib/systemd/system/gradwired.service
exec_start='ExecStart=/usr/sbin/gradwired --foreground --config /etc/gradwire/gradwired.toml '
grep -q "^$exec_start" "$unit" ||
  fail "the unit does not start /usr/sbin/gradwired with /etc/gradwire/gradwired.toml:" \
    "$(grep ExecStart "$unit")"
say "daemon: gradwired --help, gradwirectl --help, gradwire-perf --version ($out), the unit"

# The Python package from the root (not from the source tree nor an installed copy).
out=$(cd "$tmp" && env -i PATH="$PATH" PYTHONPATH="$root/usr/lib/python3/dist-packages" \
  PYTHONDONTWRITEBYTECODE=1 timeout 120 "$py" -c '
import gradwire, sys
print(gradwire.__file__, gradwire.__version__)' 2>&1) || fail "import gradwire from the root: $out"
grep -q "^$root/usr/lib/python3/dist-packages/gradwire/__init__.py $version\$" <<<"$out" ||
  fail "import gradwire did not come from the root at $version: $out"
grep -q '^#!.*python3' <<<"$(head -1 "$root/usr/bin/gradwire-run")" ||
  fail "gradwire-run is not a python3 script: $(head -1 "$root/usr/bin/gradwire-run")"
say "python: $out"
say "ok"
