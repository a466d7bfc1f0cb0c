"""gradwire's PEP 517 build backend: the wheel of the pure-Python package with the C++ build's
libgradwire.so bundled beside it, written with the standard library alone.

Why not setuptools: pip builds a package in an isolated environment that holds only what
pyproject.toml's [build-system] requires, fetched from an index. With setuptools required, a
plain `pip install ./python` fails offline (Debian 12's pip 23 included), because the
setuptools installed on the machine is not visible inside that environment. This backend
requires nothing on Python 3.11+ (tomllib reads pyproject.toml; older Pythons ask for tomli), so
the isolated environment needs no index. It builds wheels only from a checkout; it does not
support editable installs (development uses PYTHONPATH=python, docs/python.md).

What goes in the wheel (py3-none-<platform>: pure Python, but a native library inside):
- every .py file under gradwire/ and py.typed;
- libgradwire.so: GRADWIRE_LIBRARY's, else the checkout's build/release/capi/libgradwire.so (the
  file behind the symlinks, copied), and libgradwire_dpdk.so where it was built beside it;
- METADATA from [project], entry_points.txt from [project.scripts], WHEEL and RECORD.
Nothing is written into the source tree.
"""

import base64
import hashlib
import io
import os
import sysconfig
import tarfile
import zipfile
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11: [build-system] requires tomli there
    import tomli as tomllib

PACKAGE = "gradwire"


def _source() -> Path:
    return Path.cwd()  # PEP 517: hooks run in the source tree (python/)


def _project() -> dict:
    with open(_source() / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _library() -> Path:
    env = os.environ.get("GRADWIRE_LIBRARY")
    lib = Path(env) if env else _source().parent / "build" / "release" / "capi" / "libgradwire.so"
    if not lib.is_file():
        why = f"GRADWIRE_LIBRARY={env} does not name a file" if env else f"no {lib}"
        raise SystemExit(
            f"gradwire: {why}. Build the C++ library first (cmake --preset release && cmake "
            "--build --preset release --target gradwire), or set GRADWIRE_LIBRARY to the "
            "libgradwire.so to bundle.")
    return lib


def _dist_info(p: dict) -> str:
    return f"{p['name']}-{p['version']}.dist-info"


def _metadata(p: dict) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p.get('description', '')}"]
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    lines += [f"Classifier: {c}" for c in p.get("classifiers", [])]
    for extra, reqs in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    lines += [f"Requires-Dist: {r}" for r in p.get("dependencies", [])]
    return "\n".join(lines) + "\n"


def _entry_points(p: dict) -> str:
    scripts = p.get("scripts", {})
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())


def _tag() -> str:
    return "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")


def _dist_info_files(p: dict) -> dict:
    return {"METADATA": _metadata(p), "entry_points.txt": _entry_points(p),
            "WHEEL": f"Wheel-Version: 1.0\nGenerator: gradwire_build\nRoot-Is-Purelib: false\n"
                     f"Tag: {_tag()}\n"}


def _package_files() -> dict:
    """Wheel path -> source file: the package's Python files and py.typed, then the library."""
    root = _source() / PACKAGE
    files = {}
    for f in sorted(root.rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts and (f.suffix == ".py" or
                                                             f.name == "py.typed"):
            files[f.relative_to(_source()).as_posix()] = f
    lib = _library()
    files[f"{PACKAGE}/libgradwire.so"] = lib.resolve()
    dpdk = lib.parent / "libgradwire_dpdk.so"
    if dpdk.is_file():
        files[f"{PACKAGE}/libgradwire_dpdk.so"] = dpdk.resolve()
    return files


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


# ---- PEP 517 hooks ----------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None) -> list:
    return []


def get_requires_for_build_sdist(config_settings=None) -> list:
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None) -> str:
    p = _project()
    d = Path(metadata_directory) / _dist_info(p)
    d.mkdir(parents=True, exist_ok=True)
    for name, text in _dist_info_files(p).items():
        (d / name).write_text(text)
    return d.name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    p = _project()
    name = f"{p['name']}-{p['version']}-{_tag()}.whl"
    info = _dist_info(p)
    record = []
    with zipfile.ZipFile(Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as whl:
        def add(path: str, data: bytes, mode: int = 0o644) -> None:
            zi = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(zi, data)
            record.append(_record_line(path, data))

        for path, src in _package_files().items():
            add(path, src.read_bytes(), 0o755 if path.endswith(".so") else 0o644)
        for fname, text in _dist_info_files(p).items():
            add(f"{info}/{fname}", text.encode())
        record.append(f"{info}/RECORD,,")
        whl.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return name


def build_sdist(sdist_directory, config_settings=None) -> str:
    """The package's sources (no library: a wheel built from it needs GRADWIRE_LIBRARY)."""
    p = _project()
    base = f"{p['name']}-{p['version']}"
    src = _source()
    paths = [src / "pyproject.toml", Path(__file__).resolve()]
    paths += [f for f in sorted((src / PACKAGE).rglob("*"))
              if f.is_file() and "__pycache__" not in f.parts]
    name = f"{base}.tar.gz"
    with tarfile.open(Path(sdist_directory) / name, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for f in paths:
            tar.add(f, arcname=f"{base}/{f.relative_to(src).as_posix()}", recursive=False)
        pkg_info = _metadata(p).encode()
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(pkg_info)
        tar.addfile(ti, io.BytesIO(pkg_info))
    return name
