"""The stall inspector (GW_STALL_WARN_S, collectives/stall.h): one rank sleeps before an allreduce;
the ranks waiting in it warn, naming it and the op, within GW_STALL_WARN_S + 1 s, and repeat."""
import re

import pytest

from conftest import launch, worker

WARN = re.compile(r"\[(\d)\] .*stall: rank (\d): (\w+) of (\d+) bytes has waited ([0-9.]+) s "
                  r"for ranks \[([0-9,]+)\]")


@pytest.mark.slow
def test_waiting_ranks_name_the_sleeper():
    p = launch(3, worker("stall.py"), "2.6", timeout=60,
               extra_env={"GW_STALL_WARN_S": "1", "GW_TIMEOUT_MS": "20000"})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    warns = [m.groups() for m in WARN.finditer(out)]
    for r in (0, 1):
        mine = [w for w in warns if w[1] == str(r)]
        assert len(mine) >= 2, out  # repeated every GW_STALL_WARN_S
        _, _, op, nbytes, waited, missing = mine[0]
        assert op == "allreduce" and nbytes == "4000" and missing == "2", mine[0]
        assert float(waited) <= 2.0, mine[0]  # within GW_STALL_WARN_S + 1 s
    assert not [w for w in warns if w[1] == "2"], out  # the sleeper waits for no one
    assert out.count("stall done") == 3


@pytest.mark.slow
def test_off_and_quiet_when_in_time():
    # 0 turns it off; a wait shorter than the period is not reported.
    for warn_s, sleep_s in (("0", "1.5"), ("5", "0.5")):
        p = launch(2, worker("stall.py"), sleep_s, timeout=60,
                   extra_env={"GW_STALL_WARN_S": warn_s, "GW_TIMEOUT_MS": "20000"})
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        assert "stall:" not in out, out


@pytest.mark.slow
def test_horovod_api_names_the_tensor():
    p = launch(2, worker("hvd_stall.py"), "2.6", timeout=60,
               extra_env={"GW_STALL_WARN_S": "1", "GW_TIMEOUT_MS": "20000"})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    named = re.findall(r"\[0\] .*stall: rank 0: waited ([0-9.]+) s for allreduce late\.tensor", out)
    assert named and float(named[0]) <= 2.0, out
    assert re.search(r"\[0\] .*stall: rank 0: allreduce of 32 bytes has waited [0-9.]+ s for "
                     r"ranks \[1\]", out), out
    assert "stall: rank 1" not in out, out
    assert out.count("hvd stall done") == 2
