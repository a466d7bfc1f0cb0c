"""Helpers for the gradwire Python tests: launch a worker on N ranks with the package's launcher.

The tests run with Debian's /usr/bin/python3 (its torch 1.13) unless GW_PYTHON names another
interpreter, against build/release/capi/libgradwire.so unless GRADWIRE_LIBRARY is set. They test
the package of the source tree: pytest.ini puts python/ on this process's path, and env() on the
workers' (PYTHONPATH).
"""
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
PYTHON = os.environ.get("GW_PYTHON", "/usr/bin/python3" if Path("/usr/bin/python3").exists()
                        else sys.executable)


def env(**extra: str) -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT / "python") + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("GW_TIMEOUT_MS", "10000")
    e["PYTHONWARNINGS"] = "ignore"
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GW_STORE", "GW_RANK",
              "GW_WORLD_SIZE"):
        e.pop(k, None)
    e.update(extra)
    return e


def launch(np_: int, *args: str, timeout: float = 60, extra_env: dict | None = None,
           launcher_args: tuple = ()) -> subprocess.CompletedProcess:
    """Runs `gradwire-run -np np_ -- PYTHON args...`; returns the finished process (text)."""
    return launch_cmd(np_, PYTHON, *args, timeout=timeout, extra_env=extra_env,
                      launcher_args=launcher_args)


def launch_cmd(np_: int, *cmd_args: str, timeout: float = 60, extra_env: dict | None = None,
               launcher_args: tuple = ()) -> subprocess.CompletedProcess:
    """Runs `gradwire-run -np np_ [launcher_args] -- cmd_args...`."""
    cmd = [PYTHON, "-m", "gradwire.run", "-np", str(np_), *launcher_args, "--", *cmd_args]
    return subprocess.run(cmd, cwd=ROOT, env=env(**(extra_env or {})), capture_output=True,
                          text=True, timeout=timeout)


def worker(name: str) -> str:
    return str(WORKERS / name)


def gradwired_path() -> Path | None:
    """The build's gradwired, or None: beside GRADWIRE_LIBRARY's build when it is set (the
    project's build, capi/ beside daemon/, or a standalone one, perf/gpu/), else build/release."""
    daemon = ROOT / "build" / "release" / "daemon" / "gradwired"
    lib = os.environ.get("GRADWIRE_LIBRARY", "")
    if lib:
        here = Path(lib).resolve().parent
        daemon = here / "gradwired"
        if not daemon.exists():
            daemon = here.parent / "daemon" / "gradwired"
    return daemon if daemon.exists() else None


@contextlib.contextmanager
def private_gradwired(tmp_path: Path):
    """A gradwired of its own (unprivileged) on tmp_path/gwd.sock, skipping the test without one
    in the build; yields (its path, its socket) and stops it on the way out."""
    daemon = gradwired_path()
    if daemon is None:
        pytest.skip("no gradwired in the build")
    sock = tmp_path / "gwd.sock"
    d = subprocess.Popen([str(daemon), "--foreground", "--socket", str(sock)], env=env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield daemon, sock
    finally:
        d.terminate()
        try:
            d.wait(timeout=10)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait()


@pytest.fixture(scope="module")
def comm():
    """A gradwire.Comm of one rank (a world of one needs no store)."""
    import gradwire
    for k in ("MASTER_ADDR", "MASTER_PORT", "GW_STORE"):
        os.environ.pop(k, None)
    c = gradwire.Comm(0, 1)
    yield c
    c.close()


@pytest.fixture
def run_ranks():
    return launch
