"""python/gradwire/_lib.py copies the C ABI by hand: hold it to include/gradwire/gradwire.h.

The header's enumerators and struct members are read from its text; their values, offsets and
sizes come from a small C program compiled against the header (the compiler's answer, not a
second reading of the types), and both are compared with what _lib declares.
"""
import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gradwire import _lib

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "include" / "gradwire" / "gradwire.h"
ENUMS = ("gw_status_t", "gw_dtype_t", "gw_op_t")
STRUCTS = {"gw_config_t": _lib.ConfigV2, "gw_comm_stats_t": _lib.CommStats}
# The parameter server's (issue 30), held to the header once it has them.
if "gw_kv_config_t" in HEADER.read_text():
    ENUMS += ("gw_kv_mode_t", "gw_kv_update_t")
    STRUCTS.update({"gw_kv_config_t": _lib.KVConfig, "gw_kv_stats_t": _lib.KVStats})


def _header_text() -> str:
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _enumerators(name: str) -> list[str]:
    m = re.search(r"typedef\s+enum\s*\{([^}]*)\}\s*" + name + r"\s*;", _header_text())
    assert m, f"no enum {name} in {HEADER}"
    return [e.split("=")[0].strip() for e in m.group(1).split(",") if e.strip()]


def _members(name: str) -> list[str]:
    m = re.search(r"typedef\s+struct\s*\{([^}]*)\}\s*" + name + r"\s*;", _header_text())
    assert m, f"no struct {name} in {HEADER}"
    return [re.findall(r"\w+", d)[-1] for d in m.group(1).split(";") if d.strip()]


@pytest.fixture(scope="module")
def c_values(tmp_path_factory) -> dict:
    """NAME -> value for every enumerator; sizeof:T, offsetof:T.member and sizeof:T.member for
    the structs."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to read the header's layout")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "gradwire/gradwire.h"',
             "int main(void) {"]
    for enum in ENUMS:
        for e in _enumerators(enum):
            lines.append(f'  printf("{e} %ld\\n", (long){e});')
    for struct in STRUCTS:
        lines.append(f'  printf("sizeof:{struct} %zu\\n", sizeof({struct}));')
        for m in _members(struct):
            lines.append(f'  printf("offsetof:{struct}.{m} %zu\\n", offsetof({struct}, {m}));')
            lines.append(f'  printf("sizeof:{struct}.{m} %zu\\n", sizeof((({struct}*)0)->{m}));')
    lines += ["  return 0;", "}"]
    d = tmp_path_factory.mktemp("abi")
    (d / "abi.c").write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-std=c11", "-I", str(ROOT / "include"), "-o", str(d / "abi"),
                    str(d / "abi.c")], check=True, timeout=60)
    out = subprocess.run([str(d / "abi")], check=True, capture_output=True, text=True,
                         timeout=30).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


@pytest.mark.parametrize("enum", ENUMS)
def test_enum_values_match_the_header(enum, c_values):
    names = _enumerators(enum)
    assert names, enum
    for name in names:
        assert hasattr(_lib, name), f"{enum}'s {name} is missing from gradwire/_lib.py"
        assert getattr(_lib, name) == c_values[name], (name, getattr(_lib, name), c_values[name])


@pytest.mark.parametrize("struct", sorted(STRUCTS))
def test_struct_layout_matches_the_header(struct, c_values):
    py = STRUCTS[struct]
    assert [f[0] for f in py._fields_] == _members(struct), f"{struct}'s members differ"
    assert ctypes.sizeof(py) == c_values[f"sizeof:{struct}"], struct
    for name, _ in py._fields_:
        assert getattr(py, name).offset == c_values[f"offsetof:{struct}.{name}"], (struct, name)
        assert getattr(py, name).size == c_values[f"sizeof:{struct}.{name}"], (struct, name)


def test_config_v1_is_v2_without_its_size():
    # gw_config_t of C ABI 0.1 (no header of it remains): the same members after the size.
    assert [f[0] for f in _lib.ConfigV1._fields_] == _members("gw_config_t")[1:]


def test_package_version_is_the_headers():
    text = HEADER.read_text()
    header = ".".join(re.search(rf"#define GW_VERSION_{p} (\d+)", text).group(1)
                      for p in ("MAJOR", "MINOR", "PATCH"))
    project = (ROOT / "python" / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', project, re.M).group(1) == header
