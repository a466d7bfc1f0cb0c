"""The installed package: docs/python.md's plain `pip install ./python` (pip's default build
isolation, no index: the in-tree backend needs nothing fetched) into a fresh virtual environment
(with the system's site packages, for Debian's torch), offline, then used from outside the source
tree: imports, the bundled library, the gradwire-run console script."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT

ALLREDUCE = """\
import numpy as np, gradwire
c = gradwire.init()
a = np.full(1000, c.rank + 1, dtype=np.float32)
c.allreduce(a)
assert (a == 3).all(), a[:4]
print("installed allreduce ok", flush=True)
c.close()
"""


def _clean_env(**extra: str) -> dict:
    """No source tree on the path; no index to fetch from (offline); no launcher variables."""
    e = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "GW_STORE", "GW_RANK", "GW_WORLD_SIZE", "VIRTUAL_ENV")}
    # PIP_CONFIG_FILE: no machine's pip.conf (an index or find-links) takes part.
    e.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONWARNINGS="ignore",
             PIP_CONFIG_FILE=os.devnull)
    e.setdefault("GW_TIMEOUT_MS", "10000")
    e.update(extra)
    return e


def _run(cmd: list, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"{cmd}: exit {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p


def _tree(d: Path) -> set:
    return {p.relative_to(d) for p in d.rglob("*") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("venv") / "env"
    r = subprocess.run([PYTHON, "-c", "import venv, ensurepip, tomllib"], capture_output=True,
                       timeout=60)
    if r.returncode != 0:  # scripts/install-deps.sh installs python3-venv
        pytest.skip(f"{PYTHON} lacks venv or ensurepip (Debian: python3-venv), or is older than "
                    "3.11 (the offline build needs tomllib)")
    env = _clean_env()
    _run([PYTHON, "-m", "venv", "--system-site-packages", d], ROOT, env, 180)
    # The documented command, from the repository root, with pip's build isolation (its default)
    # and no index (PIP_NO_INDEX; no find-links either). GRADWIRE_LIBRARY, where the run sets it,
    # names the library to bundle; else build/release/capi's.
    before = _tree(ROOT / "python")
    _run([d / "bin" / "pip", "install", "./python"], ROOT, env, 300)
    assert _tree(ROOT / "python") == before, "the build wrote into the source tree"
    return d


def test_the_installed_package_imports_outside_the_source_tree(venv, tmp_path):
    env = _clean_env()
    env.pop("GRADWIRE_LIBRARY", None)  # the installed package must find its own copy
    code = ("import gradwire, gradwire.torch, os\n"
            "print(gradwire.__file__); print(gradwire.library_path)\n"
            "print(os.path.isfile(os.path.join(os.path.dirname(gradwire.__file__), 'py.typed')))\n")
    out = _run([venv / "bin" / "python", "-c", code], tmp_path, env, 120).stdout.split()
    assert out[0].startswith(str(venv)), out  # not the source tree's python/gradwire
    assert out[1].startswith(str(venv)) and out[1].endswith("/gradwire/libgradwire.so"), out
    assert out[2] == "True", "py.typed is not installed"


def test_the_installed_package_still_honours_gradwire_library(venv, tmp_path):
    env = _clean_env(GRADWIRE_LIBRARY="/nonexistent/libgradwire.so")
    p = subprocess.run([str(venv / "bin" / "python"), "-c", "import gradwire"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "GRADWIRE_LIBRARY=/nonexistent/libgradwire.so" in p.stderr


def test_the_console_script_runs_an_allreduce_on_two_ranks(venv, tmp_path):
    env = _clean_env()
    env.pop("GRADWIRE_LIBRARY", None)
    (tmp_path / "allreduce.py").write_text(ALLREDUCE)
    p = _run([venv / "bin" / "gradwire-run", "-np", "2", "--", venv / "bin" / "python",
              "allreduce.py"], tmp_path, env, 120)
    assert p.stdout.count("installed allreduce ok") == 2, p.stdout + p.stderr


def _build_dir() -> Path:
    lib = os.environ.get("GRADWIRE_LIBRARY")
    if lib:  # <build>/capi/libgradwire.so
        return Path(lib).resolve().parent.parent
    return ROOT / "build" / "release"


def test_cmake_install_installs_the_package(tmp_path):
    rules = _build_dir() / "python" / "cmake_install.cmake"
    if not shutil.which("cmake") or not rules.is_file() or "gradwire Python package" not in \
            rules.read_text():
        pytest.skip(f"no install rule for the Python package in {rules.parent} (GW_INSTALL_PYTHON "
                    "off, or the interpreter lacks pip)")
    prefix = tmp_path / "prefix"
    _run(["cmake", "--install", _build_dir(), "--component", "python", "--prefix", prefix],
         ROOT, _clean_env(), 300)
    inits = list(prefix.glob("lib/python3*/*-packages/gradwire/__init__.py"))
    assert len(inits) == 1, list(prefix.rglob("*"))[:20]
    env = _clean_env(PYTHONPATH=str(inits[0].parent.parent))
    env.pop("GRADWIRE_LIBRARY", None)
    p = _run([prefix / "bin" / "gradwire-run", "-np", "2", "--no-prefix", "--", PYTHON, "-c",
              "import gradwire; print(gradwire.library_path)"], tmp_path, env, 120)
    assert p.stdout.split() == [str(inits[0].parent / "libgradwire.so")] * 2, p.stdout
