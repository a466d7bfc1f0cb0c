"""gradwire.kv (the parameter server, issue 30): each mode's rule with a held-back worker, the
servers' sgd, bad input refused, PSOptimizer training a small model, a killed worker under asp
(the job goes on) and bsp (the others raise), gradwire-run --servers, and the rules again in
daemon mode (the job's gradwired as the server), PSOptimizer there ending where direct mode does.

The rules are checked inside the workers (tests/python/workers/kv_rules.py): exact values where
the rule is exact, its bounds and waits where it gives bounds."""
import contextlib
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import PYTHON, ROOT, env, launch, launch_cmd, private_gradwired, worker

import gradwire
from gradwire import _lib

needs_kv = pytest.mark.skipif(not _lib.has("gw_kv_create"),
                              reason=f"{_lib.path} has no gw_kv_* (issue 30's C API)")


def _run(np_: int, case: str, servers: int = 0, timeout: float = 40,
         extra_env: dict | None = None) -> str:
    args = ("--servers", str(servers)) if servers else ()
    p = launch(np_, worker("kv_rules.py"), case, timeout=timeout, launcher_args=args,
               extra_env=extra_env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert out.count(f"kv {case} ok") == np_, out
    return out


# ---- the strings and the launcher (no library call) -------------------------------------------
def test_mode_and_update_strings():
    from gradwire.kv import parse_mode, parse_update
    assert parse_mode("bsp") == (_lib.GW_KV_BSP, 0, 0)
    assert parse_mode(" SSP:2 ") == (_lib.GW_KV_SSP, 2, 0)
    assert parse_mode("asp") == (_lib.GW_KV_ASP, 0, 0)
    assert parse_mode("sync:3", 4) == (_lib.GW_KV_SYNC, 0, 3)
    assert parse_update("sum") == (_lib.GW_KV_UPDATE_SUM, 0.0, 0.0)
    assert parse_update("sgd:0.1,momentum=0.9") == (_lib.GW_KV_UPDATE_SGD, 0.1, 0.9)
    assert parse_update("sgd:lr=0.5") == (_lib.GW_KV_UPDATE_SGD, 0.5, 0.0)
    bad_modes = {"ssp": "needs its staleness", "ssp:-1": "must be >= 0", "sync:0": "must be >= 1",
                 "sync:x": "is not an integer", "bsp:2": "takes no argument",
                 "allreduce": "is not one of bsp, ssp:S, asp, sync:K"}
    for spec, why in bad_modes.items():
        with pytest.raises(gradwire.InvalidArgument, match=why):
            parse_mode(spec, 4)
    with pytest.raises(gradwire.InvalidArgument, match="K=5 exceeds the 4 workers"):
        parse_mode("sync:5", 4)
    bad_updates = {"sgd": "needs a learning rate", "sgd:0": "lr must be > 0",
                   "sgd:-1": "lr must be > 0", "sgd:0.1,momentum=1": r"momentum must be in \[0, 1\)",
                   "sgd:0.1,nesterov=1": "unknown option 'nesterov'", "sgd:abc": "is not a number",
                   "sgd:inf": "must be finite", "adam": "is not one of sum, sgd"}
    for spec, why in bad_updates.items():
        with pytest.raises(gradwire.InvalidArgument, match=why):
            parse_update(spec)
    with pytest.raises(gradwire.InvalidArgument, match="mode must be a string"):
        parse_mode(3)


def test_launcher_starts_the_servers():
    show = "sh -c 'echo srv $GW_ROLE $GW_KV_SERVERS $GW_KV_SERVER_RANK $WORLD_SIZE; sleep 30'"
    p = launch_cmd(2, "sh", "-c", "echo w $RANK $GW_KV_SERVERS ${GW_ROLE:-none}", timeout=30,
                   launcher_args=("--servers", "2", "--grace", "1", "--server-command", show))
    assert p.returncode == 0, p.stderr
    lines = sorted(p.stdout.splitlines())
    assert lines == ["[0] w 0 2 none", "[1] w 1 2 none", "[s0] srv server 2 0 2",
                     "[s1] srv server 2 1 2"], p.stdout
    # A failing server ends the job with its status.
    p = launch_cmd(2, "sh", "-c", "sleep 20", timeout=30,
                   launcher_args=("--servers", "1", "--server-command", "sh -c 'exit 3'"))
    assert p.returncode == 3 and "server 0 exited with status 3" in p.stderr, p.stderr


def test_server_role_refuses_a_store(comm, monkeypatch):
    import gradwire.kv
    monkeypatch.setenv("GW_ROLE", "server")
    with pytest.raises(gradwire.InvalidArgument, match="GW_ROLE=server"):
        gradwire.kv.KVStore(comm)


# ---- one rank: bad input --------------------------------------------------------------------
@needs_kv
def test_bad_input_refused(comm):
    import torch

    import gradwire.kv
    with pytest.raises(gradwire.InvalidArgument, match="comm must be a gradwire.Comm"):
        gradwire.kv.KVStore("comm")
    with pytest.raises(gradwire.InvalidArgument, match="partition_bytes must be a positive"):
        gradwire.kv.KVStore(comm, partition_bytes=0)
    with gradwire.kv.KVStore(comm, mode="bsp") as kv:
        kv.init(1, np.zeros(4, np.float32))
        with pytest.raises(gradwire.InvalidArgument, match="key 1 holds 4 elements of float32, "
                           "got 5 of float32"):
            kv.push(1, np.zeros(5, np.float32))
        with pytest.raises(gradwire.InvalidArgument, match="got 4 of float64"):
            kv.push(1, np.zeros(4, np.float64))
        with pytest.raises(gradwire.InvalidArgument, match="key must be an int"):
            kv.push("w", np.zeros(4, np.float32))
        with pytest.raises(gradwire.InvalidArgument, match="outside 0 .. 2\\*\\*64-1"):
            kv.push(-1, np.zeros(4, np.float32))
        with pytest.raises(gradwire.InvalidArgument, match="priority must be an int"):
            kv.push(1, np.zeros(4, np.float32), priority=0.5)
        with pytest.raises(gradwire.InvalidArgument, match="not C-contiguous"):
            kv.push(1, np.zeros((4, 2), np.float32)[:, 0])
        with pytest.raises(gradwire.InvalidArgument, match="not contiguous"):
            kv.push(1, torch.zeros(2, 2).t())
        with pytest.raises(gradwire.InvalidArgument, match="expected a numpy.ndarray"):
            kv.push(1, [0.0] * 4)
        with pytest.raises(gradwire.InvalidArgument, match="read-only"):
            ro = np.zeros(4, np.float32)
            ro.flags.writeable = False
            kv.pull(1, ro)
        with pytest.raises(gradwire.InvalidArgument, match="was not initialised here; pass out="):
            kv.pull(2)
        # Keys nobody initialised: the servers refuse them (the library's error), nothing applied.
        with pytest.raises(gradwire.InvalidArgument):
            kv.push(99, np.zeros(4, np.float32))
        with pytest.raises(gradwire.InvalidArgument):
            kv.pull(99, np.zeros(4, np.float32))
        # A second push of a key in one bsp clock is refused, not added.
        kv.push(1, np.ones(4, np.float32))
        with pytest.raises(gradwire.InvalidArgument):
            kv.push(1, np.ones(4, np.float32))
        kv.clock()
        assert np.all(kv.pull(1) == 1)
        if torch.cuda.is_available():
            with pytest.raises(gradwire.InvalidArgument, match="takes CPU tensors"):
                kv.push(1, torch.zeros(4, device="cuda"))
    with pytest.raises(gradwire.InvalidArgument, match="the store is closed"):
        kv.push(1, np.zeros(4, np.float32))


@needs_kv
def test_one_rank_torch_values_and_requests(comm):
    import torch

    import gradwire.kv
    with gradwire.kv.KVStore(comm, mode="bsp", update="sum", partition_bytes=64) as kv:
        big = torch.arange(1000, dtype=torch.float32)  # 4000 B in 64-byte partitions
        kv.init(5, torch.zeros(1000))
        out = kv.ipushpull(5, big, torch.empty(1000)).wait()
        assert torch.equal(out, big)
        kv.clock()
        reqs = [kv.ipush(5, big * 2)]
        reqs[0].wait()
        kv.clock()
        got = kv.ipull(5).wait()
        assert isinstance(got, torch.Tensor) and torch.equal(got, big * 2)
        s = kv.stats()
        assert s.clock == 2 and s.min_clock <= s.clock and s.dropped_pushes == 0


@needs_kv
def test_one_rank_fp16_pushes_arrive_as_their_fp16_rounding(comm):
    import gradwire.kv
    with gradwire.kv.KVStore(comm, mode="bsp", codec="fp16", partition_bytes=256) as kv:
        v = (np.arange(300, dtype=np.float32) * np.float32(0.1)) + np.float32(1e-4)
        kv.init(3, np.zeros(300, np.float32))
        out = kv.pushpull(3, v, np.empty(300, np.float32))
        # One worker, sum: the value is the push as fp16 carried it (exactly).
        assert np.array_equal(out, v.astype(np.float16).astype(np.float32))
        assert not np.array_equal(out, v)  # the rounding is visible: the push was encoded
        kv.clock()
        with pytest.raises(gradwire.InvalidArgument, match="floating values only .* not int32"):
            kv.init(4, np.zeros(4, np.int32))
        # A float16 key is converted at the worker: fp16 of float16 values arrives exactly.
        h = (np.arange(40, dtype=np.float16) * np.float16(0.125))
        kv.init(5, np.zeros(40, np.float16))
        assert np.array_equal(kv.pushpull(5, h, np.empty(40, np.float16)), h)
    for spec, why in {"powersgd:2": "not a byte codec", "zstd": "", "topk:2": ""}.items():
        with pytest.raises(gradwire.InvalidArgument, match=why):
            gradwire.kv.KVStore(comm, codec=spec)


# ---- the modes' rules at 2-3 ranks, a worker held back ---------------------------------------
@needs_kv
@pytest.mark.parametrize("case", ["bsp", "ssp", "asp", "sync"])
def test_mode_rule_with_a_held_back_worker(case):
    _run(3, case)


@needs_kv
def test_mode_rule_with_dedicated_servers():
    # The same bsp rule, the store on 2 server processes (gradwire-run --servers 2).
    _run(3, "bsp", servers=2)


@needs_kv
@pytest.mark.parametrize("servers", [0, 2])
def test_streamed_partitions_sum_exactly(servers):
    # Partitions of 1024 bytes streamed in chunks of 256 (GW_KV_CHUNK_BYTES), co-located and on
    # 2 server processes.
    _run(3, "stream", servers=servers, extra_env={"GW_KV_CHUNK_BYTES": "256"})


@needs_kv
def test_server_sgd_values():
    _run(2, "sgd")


@contextlib.contextmanager
def _private_gradwired(tmp_path: Path):
    """A gradwired of its own (conftest.private_gradwired); yields the environment that makes a
    trainer its client, and a function giving its accepted trainers."""
    with private_gradwired(tmp_path) as (daemon, sock):
        def accepted() -> int:
            st = subprocess.run([str(daemon.parent / "gradwirectl"), "status", "--json",
                                 "--socket", str(sock)], env=env(), capture_output=True,
                                text=True, timeout=30)
            assert st.returncode == 0, st.stdout + st.stderr
            return json.loads(st.stdout)["accepted"]

        yield {"GW_DAEMON": f"unix:{sock}", "GW_DAEMON_ARENA": "4M"}, accepted


@needs_kv
@pytest.mark.parametrize("case", ["bsp", "sync"])
def test_mode_rule_in_daemon_mode(tmp_path, case):
    # The same rules with the job's daemon as the server (GW_DAEMON): its kv server holds the keys.
    with _private_gradwired(tmp_path) as (daemon_env, accepted):
        _run(3, case, extra_env=daemon_env)
        assert accepted() == 3  # the ranks were the daemon's clients (not direct mode)


@needs_kv
def test_ps_optimizer_in_daemon_mode_ends_where_direct_mode_does(tmp_path):
    # PSOptimizer (bsp, sum) with 2 trainers: once with the job's gradwired as the server, once in
    # direct mode (a server thread in each worker). Each clock's sum of two gradients is exact in
    # any order, so every rank's parameters agree with direct mode's to float tolerance.
    def train(save: Path, extra_env: dict) -> None:
        p = launch(2, worker("kv_train.py"), "bsp", "sum", str(save), timeout=60,
                   extra_env=extra_env)
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        assert len(re.findall(r"final loss ([0-9.]+)", out)) == 2, out

    with _private_gradwired(tmp_path) as (daemon_env, accepted):
        train(tmp_path / "daemon", daemon_env)
        assert accepted() == 2  # daemon mode, not direct
    train(tmp_path / "direct", {})
    n = 16 * 32 + 32 + 32 * 4 + 4  # kv_train.py's model
    start = None
    for r in range(2):
        d = np.fromfile(tmp_path / f"daemon.{r}", np.float32)
        ref = np.fromfile(tmp_path / f"direct.{r}", np.float32)
        assert d.size == n and ref.size == n
        np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-6, err_msg=f"rank {r}")
        start = ref if start is None else start
        np.testing.assert_array_equal(ref, start)  # bsp with sum: the ranks agree


# ---- faults -----------------------------------------------------------------------------------
def _free_port() -> int:
    from gradwire._ports import free_ports
    return free_ports(1, "127.0.0.1")[0]


def _job(case: str, n: int = 3, servers: int = 1) -> tuple[list, list]:
    """n workers and `servers` server processes started directly (not by gradwire-run, which
    would end the survivors when the killed rank exits)."""
    port = _free_port()
    common = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GW_TIMEOUT_MS="6000",
                  GW_KV_SERVERS=str(servers), GW_JOB_TOKEN="kvtest" * 4)
    srv = [subprocess.Popen([PYTHON, "-m", "gradwire.kv"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env=env(GW_ROLE="server", GW_KV_SERVER_RANK=str(i),
                                    WORLD_SIZE=str(n), **common))
           for i in range(servers)]
    wk = [subprocess.Popen([PYTHON, worker("kv_rules.py"), case], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), **common))
          for r in range(n)]
    return wk, srv


def _finish(procs: list) -> list[str]:
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=40)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n(killed: did not end)")
    return outs


@pytest.mark.slow
@needs_kv
def test_killed_worker_under_asp_the_job_goes_on():
    wk, srv = _job("kill_asp")
    outs = _finish(wk)
    souts = _finish(srv)
    assert wk[-1].returncode == -9
    for r in range(2):
        assert wk[r].returncode == 0, outs[r] + "".join(souts)
        m = re.search(r"kv kill_asp went on, lost_workers=(\d+)", outs[r])
        assert m and int(m.group(1)) >= 1, outs[r]


@pytest.mark.slow
@needs_kv
def test_killed_worker_under_bsp_the_others_raise_naming_it():
    wk, srv = _job("kill_bsp")
    outs = _finish(wk)
    for p in srv:
        p.kill()
    _finish(srv)
    assert wk[-1].returncode == -9
    for r in range(2):
        m = re.search(r"kv kill_bsp raised PeerError after ([0-9.]+) s: (.*)", outs[r])
        assert m, outs[r]
        assert float(m.group(1)) < 8, outs[r]  # within the deadline (GW_TIMEOUT_MS 6000)
        assert re.search(r"\b(rank|worker) 2\b", m.group(2)), m.group(2)  # names the dead one


# ---- PSOptimizer ------------------------------------------------------------------------------
@pytest.mark.slow
@needs_kv
@pytest.mark.parametrize("mode,update", [("bsp", "sum"), ("asp", "server"), ("ssp:1", "sum")])
def test_ps_optimizer_trains_a_small_model(mode, update):
    p = launch(2, worker("kv_train.py"), mode, update, timeout=60)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    losses = [float(x) for x in re.findall(r"final loss ([0-9.]+)", out)]
    firsts = [float(x) for x in re.findall(r"first loss ([0-9.]+)", out)]
    assert len(losses) == 2 and len(firsts) == 2, out
    assert max(losses) < 0.5 * min(firsts), out


def test_ps_optimizer_refusals(comm):
    import torch

    import gradwire.torch.kv
    model = torch.nn.Linear(4, 2)
    with pytest.raises(TypeError, match="wraps a torch.optim.Optimizer"):
        gradwire.torch.kv.PSOptimizer("sgd", comm=comm)
    adam = torch.optim.Adam(model.parameters())
    with pytest.raises(ValueError, match="takes lr and momentum from a torch.optim.SGD"):
        gradwire.torch.kv.PSOptimizer(adam, model.named_parameters(), update="server", comm=comm)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="lacks 1 of the optimizer's parameters"):
        gradwire.torch.kv.PSOptimizer(sgd, [("weight", model.weight)], comm=comm)
    with pytest.raises(ValueError, match="sequence of \\(name, parameter\\)"):
        gradwire.torch.kv.PSOptimizer(sgd, [model.weight], comm=comm)
