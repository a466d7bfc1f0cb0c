"""The gradwire package: import, every op and dtype on 1..4 ranks, refusals, error mapping."""
import json
import os
import re
import subprocess

import numpy as np
import pytest

from conftest import PYTHON, ROOT, env, launch, private_gradwired, worker


def test_import_from_source_tree():
    # The README's promise: from the repository root, PYTHONPATH=python is all it takes.
    out = subprocess.run([PYTHON, "-c", "import gradwire; print(gradwire.version())"], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH="python"), capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().count(".") == 2


def test_missing_library_is_a_clear_error():
    out = subprocess.run([PYTHON, "-c", "import gradwire"], cwd=ROOT,
                         env=env(GRADWIRE_LIBRARY="/nonexistent/libgradwire.so"),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "GRADWIRE_LIBRARY=/nonexistent/libgradwire.so" in out.stderr


# 3 and 4 ranks: several seconds each, in the full run only.
@pytest.mark.parametrize("np_", [1, 2, pytest.param(3, marks=pytest.mark.slow),
                                 pytest.param(4, marks=pytest.mark.slow)])
def test_every_op_and_dtype(np_):
    p = launch(np_, worker("ops.py"), timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("ops ok") == np_



def test_wrong_dtype_refused(comm):
    import gradwire
    with pytest.raises(gradwire.InvalidArgument, match="dtype complex64 is not supported"):
        comm.allreduce(np.zeros(4, dtype=np.complex64))
    with pytest.raises(gradwire.InvalidArgument, match="expected a numpy.ndarray or a torch"):
        comm.allreduce([1.0, 2.0])
    with pytest.raises(gradwire.InvalidArgument, match="send and recv dtypes differ"):
        comm.allreduce(np.zeros(4, np.float32), np.zeros(4, np.float64))
    with pytest.raises(gradwire.InvalidArgument, match=r"dtype int32 is not supported \(float32"):
        comm.allreduce_compressed(np.zeros(4, np.int32), "fp16", "k")


def test_non_contiguous_refused(comm):
    import gradwire
    import torch
    with pytest.raises(gradwire.InvalidArgument, match="not C-contiguous"):
        comm.allreduce(np.zeros((4, 4), np.float32)[:, 1])
    with pytest.raises(gradwire.InvalidArgument, match="not contiguous"):
        comm.broadcast(torch.zeros(4, 4).t())
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(gradwire.InvalidArgument, match="read-only"):
        comm.allreduce(ro)


def test_size_mismatch_refused(comm):
    import gradwire
    import torch
    with pytest.raises(gradwire.InvalidArgument, match="recv has 3 elements, send has 4"):
        comm.allreduce(np.zeros(4, np.float32), np.zeros(3, np.float32))
    with pytest.raises(gradwire.InvalidArgument, match="expected size \\* send"):
        comm.allgather(torch.zeros(4), torch.zeros(5))
    with pytest.raises(gradwire.InvalidArgument, match="is not a rank"):
        comm.broadcast(np.zeros(2, np.float32), root=1)


def test_errors_mapped_with_library_message(comm):
    import gradwire
    with pytest.raises(gradwire.InvalidArgument) as e:
        comm.allreduce_compressed(np.zeros(8, np.float32), "topk:7", "k.bad")
    assert e.value.status == 1 and "topk" in str(e.value)  # gw_last_error()'s text
    comm.allreduce_compressed(np.zeros(8, np.float32), "fp16", "k.reuse")
    with pytest.raises(gradwire.InvalidArgument, match="k.reuse"):
        comm.allreduce_compressed(np.zeros(9, np.float32), "fp16", "k.reuse")
    with pytest.raises(gradwire.InvalidArgument, match="op 'xor'"):
        comm.allreduce(np.zeros(2, np.float32), op="xor")
    # The hierarchy: every error is a GradwireError and a RuntimeError.
    assert issubclass(gradwire.PeerError, gradwire.GradwireError)
    assert issubclass(gradwire.TimeoutError, TimeoutError)
    assert issubclass(gradwire.GradwireError, RuntimeError)


def test_abort_raises_aborted():
    import gradwire
    c = gradwire.Comm(0, 1)
    c.abort()
    with pytest.raises(gradwire.Aborted):
        c.barrier()
    c.close()
    with pytest.raises(gradwire.InvalidArgument, match="closed"):
        c.barrier()


def test_split_without_library_support_is_clear(comm):
    import gradwire
    if not gradwire._lib.has_split:
        with pytest.raises(gradwire.Unsupported, match="has no gw_comm_split"):
            comm.split(0)
        return
    assert comm.split(-1) is None
    sub = comm.split(0)
    assert sub.size == 1 and sub.rank == 0
    sub.close()


def test_peer_death_raises_peer_error_within_timeout():
    """Two ranks without the launcher (it would end the survivor): rank 1 exits abruptly; rank 0's
    next allreduce must fail with PeerError or TimeoutError, well within GW_TIMEOUT_MS."""
    code = (
        "import os, sys, time, numpy as np, gradwire\n"
        "c = gradwire.init(); a = np.ones(1 << 16, np.float32)\n"
        "c.allreduce(a)\n"
        "if c.rank == 1: os._exit(3)\n"
        "t0 = time.monotonic()\n"
        "try:\n"
        "    for _ in range(100): c.allreduce(a)\n"
        "except (gradwire.PeerError, gradwire.TimeoutError) as e:\n"
        "    print(type(e).__name__, round(time.monotonic() - t0, 1), e); sys.exit(0)\n"
        "sys.exit(1)\n")
    port = _free_port()
    procs = [subprocess.Popen([PYTHON, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=env(GW_RANK=str(r), GW_WORLD_SIZE="2",
                                      GW_STORE=f"127.0.0.1:{port}", GW_TIMEOUT_MS="4000"))
             for r in range(2)]
    out0, _ = procs[0].communicate(timeout=30)
    procs[1].wait(timeout=30)
    assert procs[0].returncode == 0, out0
    m = re.search(r"^(PeerError|TimeoutError) ([0-9.]+) ", out0, re.M)
    assert m and float(m.group(2)) < 6, out0


def _free_port():
    from gradwire._ports import free_ports
    return free_ports(1)[0]


def test_mem_empty_in_direct_mode(comm):
    import gradwire
    a = comm.mem_empty((3, 5), "float64")
    assert a.shape == (3, 5) and a.dtype == np.float64
    a[:] = 2.0
    comm.allreduce(a, a)
    assert (a == 2.0).all()
    with pytest.raises(gradwire.InvalidArgument, match="negative"):
        comm.mem_empty((-1, 2))
    with pytest.raises(gradwire.InvalidArgument, match="not supported"):
        comm.mem_empty(4, "complex64")
    del a


@pytest.mark.parametrize("np_", [1, 2])
def test_mem_empty_direct_on_ranks(np_):
    p = launch(np_, worker("mem.py"), timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("mem ok") == np_


def test_mem_empty_in_daemon_mode(tmp_path):
    # A real gradwired (unprivileged, socket in tmp_path): the arrays lie in its arena.
    with private_gradwired(tmp_path) as (daemon, sock):
        p = launch(2, worker("mem.py"), timeout=90,
                   extra_env={"GW_DAEMON": f"unix:{sock}", "GW_DAEMON_ARENA": "16M"})
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.count("mem ok") == 2
        # The ranks were the daemon's clients (not direct mode).
        ctl = daemon.parent / "gradwirectl"
        st = subprocess.run([str(ctl), "status", "--json", "--socket", str(sock)], env=env(),
                            capture_output=True, text=True, timeout=30)
        assert st.returncode == 0, st.stdout + st.stderr
        assert json.loads(st.stdout)["accepted"] == 2, st.stdout
