"""Loading libgradwire.so and declaring its C ABI (include/gradwire/gradwire.h) for ctypes.

Everything that knows the C ABI's layout lives in this module: the library search, the argument
and result types of every function, and the two structs (gw_config_t, gw_comm_stats_t). A change
of the header is a change here only; tests/python/test_abi.py holds the enums and the structs to
the header.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Optional

# gw_status_t
GW_OK = 0
GW_ERR_INVALID_ARG = 1
GW_ERR_TIMEOUT = 2
GW_ERR_PEER = 3
GW_ERR_SYSTEM = 4
GW_ERR_UNSUPPORTED = 5
GW_ERR_NO_MEMORY = 6
GW_ERR_ABORTED = 7
GW_ERR_INTERNAL = 8

# gw_dtype_t
GW_FLOAT32 = 0
GW_FLOAT64 = 1
GW_FLOAT16 = 2
GW_BFLOAT16 = 3
GW_INT32 = 4
GW_INT64 = 5
GW_UINT8 = 6

# gw_op_t
GW_SUM = 0
GW_PROD = 1
GW_MIN = 2
GW_MAX = 3
GW_AVG = 4

comm_t = ctypes.c_void_p
request_t = ctypes.c_void_p


class CommStats(ctypes.Structure):
    """gw_comm_stats_t."""

    _fields_ = [
        ("bytes_sent", ctypes.c_uint64),
        ("bytes_uncompressed", ctypes.c_uint64),
        ("calls", ctypes.c_uint64),
    ]


_CONFIG_TAIL = [
    ("rank", ctypes.c_int),
    ("world_size", ctypes.c_int),
    ("store_addr", ctypes.c_char_p),
    ("transport", ctypes.c_char_p),
    ("timeout_ms", ctypes.c_int),
    ("job_token", ctypes.c_char_p),
]


class ConfigV1(ctypes.Structure):
    """gw_config_t of C ABI 0.1: no size member."""

    _fields_ = list(_CONFIG_TAIL)


class ConfigV2(ctypes.Structure):
    """gw_config_t of C ABI 0.2 and later: a leading size member (what GW_CONFIG_INIT sets)."""

    _fields_ = [("size", ctypes.c_size_t)] + list(_CONFIG_TAIL)


_SEARCHED: list[str] = []

_HERE = Path(__file__).resolve().parent


def _source_tree() -> Optional[Path]:
    """The checkout this package runs from (python/gradwire/ with PYTHONPATH=python), or None for
    an installed package. Development only: an installed package never looks at a build tree."""
    root = _HERE.parent.parent
    if (_HERE.parent / "pyproject.toml").is_file() and (root / "include" / "gradwire").is_dir():
        return root
    return None


def _candidates() -> list[Path]:
    """Where libgradwire.so is looked for, in order: GRADWIRE_LIBRARY (then only there); beside
    the package (where pip install and cmake --install put it); in a source checkout, its
    build/release/capi and build/debug/capi."""
    env = os.environ.get("GRADWIRE_LIBRARY")
    if env:
        return [Path(env)]
    out = [_HERE / "libgradwire.so"]
    root = _source_tree()
    if root is not None:
        out.append(root / "build" / "release" / "capi" / "libgradwire.so")
        out.append(root / "build" / "debug" / "capi" / "libgradwire.so")
    return out


def _load() -> ctypes.CDLL:
    env = os.environ.get("GRADWIRE_LIBRARY")
    for path in _candidates():
        _SEARCHED.append(str(path))
        if path.is_file():
            return ctypes.CDLL(str(path))
    if env:
        raise OSError(f"GRADWIRE_LIBRARY={env} does not name a file")
    raise OSError(
        "libgradwire.so not found; install the package after the C++ build (pip install "
        "./python), or from a source checkout build it (cmake --preset "
        "release && cmake --build --preset release --target gradwire), or set GRADWIRE_LIBRARY. "
        "Looked in: " + ", ".join(_SEARCHED)
    )


lib = _load()
path: str = lib._name


def _declare(name: str, args: list, res=ctypes.c_int) -> None:
    fn = getattr(lib, name)
    fn.argtypes = args
    fn.restype = res


_P = ctypes.c_void_p
_SZ = ctypes.c_size_t
_I = ctypes.c_int
_declare("gw_version", [], ctypes.c_char_p)
_declare("gw_status_string", [_I], ctypes.c_char_p)
_declare("gw_last_error", [], ctypes.c_char_p)

version: str = lib.gw_version().decode()
_major, _minor = (int(x) for x in version.split(".")[:2])
Config = ConfigV2 if (_major, _minor) >= (0, 2) else ConfigV1

_declare("gw_comm_init_from_env", [ctypes.POINTER(comm_t)])
_declare("gw_comm_init", [ctypes.POINTER(comm_t), ctypes.POINTER(Config)])
_declare("gw_comm_destroy", [comm_t])
_declare("gw_comm_abort", [comm_t])
_declare("gw_comm_rank", [comm_t, ctypes.POINTER(_I)])
_declare("gw_comm_size", [comm_t, ctypes.POINTER(_I)])
_declare("gw_allreduce", [comm_t, _P, _P, _SZ, _I, _I])
_declare("gw_broadcast", [comm_t, _P, _SZ, _I, _I])
_declare("gw_allgather", [comm_t, _P, _P, _SZ, _I])
_declare("gw_reduce_scatter", [comm_t, _P, _P, _SZ, _I, _I])
_declare("gw_alltoall", [comm_t, _P, _P, _SZ, _I])
_declare("gw_barrier", [comm_t])
_declare("gw_iallreduce", [comm_t, _P, _P, _SZ, _I, _I, ctypes.POINTER(request_t)])
_declare("gw_wait", [request_t, _I])
_declare("gw_test", [request_t, ctypes.POINTER(_I)])
_declare("gw_allreduce_compressed", [comm_t, _P, _SZ, _I, ctypes.c_char_p, ctypes.c_char_p])
_declare("gw_comm_stats", [comm_t, ctypes.POINTER(CommStats)])
_declare("gw_comm_reset_stats", [comm_t])
_declare("gw_comm_release_compression", [comm_t])
_declare("gw_mem_alloc", [comm_t, _SZ, ctypes.POINTER(ctypes.c_void_p)])
_declare("gw_mem_free", [comm_t, _P])

# Calls a newer library may have: declared only where the loaded one exports them (has()).
has_split = hasattr(lib, "gw_comm_split")
if has_split:
    _declare("gw_comm_split", [comm_t, _I, _I, ctypes.POINTER(comm_t)])

GW_ANY_SOURCE = -1
_REQ = ctypes.POINTER(request_t)
_PSZ = ctypes.POINTER(ctypes.c_size_t)
# Point-to-point (C ABI 0.3) and the rooted and uneven collectives with every collective's
# non-blocking form (issue 29); each i-form takes its blocking call's arguments and a request.
_OPTIONAL = {
    "gw_send": [comm_t, _P, _SZ, _I, _I, _I],
    "gw_recv": [comm_t, _P, _SZ, _I, _I, _I],
    "gw_isend": [comm_t, _P, _SZ, _I, _I, _I, _REQ],
    "gw_irecv": [comm_t, _P, _SZ, _I, _I, _I, _REQ],
    "gw_wait_recv": [request_t, _I, _PSZ, ctypes.POINTER(_I)],
    "gw_test_recv": [request_t, ctypes.POINTER(_I), _PSZ, ctypes.POINTER(_I)],
    "gw_reduce": [comm_t, _P, _P, _SZ, _I, _I, _I],
    "gw_gather": [comm_t, _P, _P, _SZ, _I, _I],
    "gw_scatter": [comm_t, _P, _P, _SZ, _I, _I],
    "gw_alltoallv": [comm_t, _P, _PSZ, _PSZ, _P, _PSZ, _PSZ, _I],
    "gw_ibroadcast": [comm_t, _P, _SZ, _I, _I, _REQ],
    "gw_iallgather": [comm_t, _P, _P, _SZ, _I, _REQ],
    "gw_ireduce_scatter": [comm_t, _P, _P, _SZ, _I, _I, _REQ],
    "gw_ialltoall": [comm_t, _P, _P, _SZ, _I, _REQ],
    "gw_ialltoallv": [comm_t, _P, _PSZ, _PSZ, _P, _PSZ, _PSZ, _I, _REQ],
    "gw_ireduce": [comm_t, _P, _P, _SZ, _I, _I, _I, _REQ],
    "gw_igather": [comm_t, _P, _P, _SZ, _I, _I, _REQ],
    "gw_iscatter": [comm_t, _P, _P, _SZ, _I, _I, _REQ],
    "gw_ibarrier": [comm_t, _REQ],
    # Registration of buffers used again and again (issue 27; device memory in direct mode).
    "gw_mem_register": [comm_t, _P, _SZ, ctypes.POINTER(ctypes.c_void_p)],
    "gw_mem_deregister": [comm_t, _P],
}
_present = set()
for _name, _args in _OPTIONAL.items():
    if hasattr(lib, _name):
        _declare(_name, _args)
        _present.add(_name)


def has(name: str) -> bool:
    """Whether the loaded library exports the optional call `name` (e.g. "gw_reduce")."""
    return name in _present


def make_config(
    rank: int,
    world_size: int,
    store_addr: Optional[str],
    transport: Optional[str],
    timeout_ms: int,
    job_token: Optional[str],
) -> ctypes.Structure:
    """A gw_config_t of the loaded library's version (GW_CONFIG_INIT's size set where it has one)."""
    cfg = Config()
    if hasattr(cfg, "size"):
        cfg.size = ctypes.sizeof(Config)
    cfg.rank = rank
    cfg.world_size = world_size
    cfg.store_addr = store_addr.encode() if store_addr else None
    cfg.transport = transport.encode() if transport else None
    cfg.timeout_ms = timeout_ms
    cfg.job_token = job_token.encode() if job_token else None
    return cfg
