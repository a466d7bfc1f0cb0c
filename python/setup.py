"""The build step pyproject.toml cannot say: bundle the C++ build's libgradwire.so into the package.

The library bundled is GRADWIRE_LIBRARY's, else the release build of the checkout this file sits
in (build/release/capi/libgradwire.so); the DPDK port module beside it (libgradwire_dpdk.so) goes
too where it was built, so the installed library finds it beside itself. The wheel is tagged for
this platform (it holds a native library) but not for a Python version (the package is pure
Python over ctypes).
"""

import os
import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent


def _library() -> Path:
    env = os.environ.get("GRADWIRE_LIBRARY")
    lib = Path(env) if env else HERE.parent / "build" / "release" / "capi" / "libgradwire.so"
    if not lib.is_file():
        why = f"GRADWIRE_LIBRARY={env} does not name a file" if env else f"no {lib}"
        raise SystemExit(
            f"gradwire: {why}. Build the C++ library first (cmake --preset release && cmake "
            "--build --preset release --target gradwire), or set GRADWIRE_LIBRARY to the "
            "libgradwire.so to bundle.")
    return lib


class BuildPyWithLibrary(build_py):
    def run(self) -> None:
        lib = _library()
        out = Path(self.build_lib) / "gradwire"
        super().run()
        # Copied, not linked: the file behind the libgradwire.so -> .so.0 -> .so.0.4.0 chain.
        self.copy_file(str(lib.resolve()), str(out / "libgradwire.so"))
        dpdk = lib.parent / "libgradwire_dpdk.so"
        if dpdk.is_file():
            self.copy_file(str(dpdk.resolve()), str(out / "libgradwire_dpdk.so"))


class PlatformWheel(bdist_wheel):
    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple:
        _, _, plat = super().get_tag()
        return "py3", "none", plat


# pip builds in the source folder: the build and egg-info folders go to a fresh temporary folder
# instead (removed at exit), so a build writes nothing into the source tree, two builds at once
# (pip and cmake --install) do not share one, and no file of an earlier build is shipped.
_scratch = tempfile.TemporaryDirectory(prefix="gradwire-build-")
setup(cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel},
      options={"build": {"build_base": os.path.join(_scratch.name, "build")},
               "egg_info": {"egg_base": _scratch.name}})
