"""GW_TIMELINE (core/timeline.h): one Chrome trace per rank, checked against the trace-event
format, with the phases of every collective; perf/merge_timeline.py merges the ranks."""
import bisect
import json
import subprocess
import sys
import time

import pytest

from conftest import PYTHON, ROOT, env, launch, private_gradwired, worker

PH = set("BEXiIbnesftPCMNODRcp()")  # the trace-event format's phase letters


def check_event(e: dict) -> None:
    """The trace-event format's requirements for the events gradwire writes."""
    assert isinstance(e.get("name"), str) and e["name"], e
    assert e.get("ph") in PH, e
    assert isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
    if e["ph"] == "M":
        assert e["name"] in ("process_name", "thread_name", "process_sort_index",
                             "thread_sort_index"), e
        assert isinstance(e["args"].get("name"), str), e
        return
    assert isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0, e
    if e["ph"] == "X":
        assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
    assert isinstance(e.get("args", {}), dict), e


@pytest.mark.slow
def test_every_rank_writes_a_valid_trace_with_the_phases(tmp_path):
    p = launch(2, worker("timeline.py"), timeout=60,
               extra_env={"GW_TIMELINE": str(tmp_path / "tl.%r.json")})
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(2):
        events = json.loads((tmp_path / f"tl.{r}.json").read_text())
        assert isinstance(events, list)
        for e in events:
            check_event(e)
        assert {e["pid"] for e in events} == {r}
        names = [e["name"] for e in events]
        assert names.count("allreduce") >= 5, names  # 3 + iallreduce + the codec's exchange
        for phase in ("connect", "wait for peers", "transfer", "reduce", "queued", "broadcast",
                      "allgather", "encode", "exchange", "decode"):
            assert phase in names, (phase, names)
        calls = [e for e in events if e.get("cat") == "collective"]
        assert all(e["args"]["bytes"] > 0 for e in calls), calls
        big = [e for e in calls if e["name"] == "allreduce" and e["args"]["bytes"] == 1_200_000]
        assert len(big) >= 4, calls
        # Phases lie inside their call.
        for c in big:
            inside = [e for e in events if e.get("cat") == "phase" and e["tid"] == c["tid"]
                      and c["ts"] <= e["ts"] <= c["ts"] + c["dur"]]
            assert {"wait for peers", "transfer"} <= {e["name"] for e in inside}, inside
    out = tmp_path / "merged.json"
    m = subprocess.run([sys.executable, str(ROOT / "perf" / "merge_timeline.py"), "--zero", "-o",
                        str(out), str(tmp_path / "tl.0.json"), str(tmp_path / "tl.1.json")],
                       capture_output=True, text=True, timeout=60)
    assert m.returncode == 0, m.stderr
    merged = json.loads(out.read_text())
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}
    assert min(e["ts"] for e in merged["traceEvents"] if "ts" in e) == 0
    for e in merged["traceEvents"]:
        check_event(e)


def test_cut_short_file_merges(tmp_path):
    # A file without its "]" (a rank that crashed) still merges, up to its last whole event.
    sys.path.insert(0, str(ROOT / "perf"))
    import merge_timeline

    f = tmp_path / "cut.json"
    f.write_text('[\n{"name":"process_name","ph":"M","pid":3,"tid":0,"args":{"name":"r"}},\n'
                 '{"name":"allreduce","ph":"X","ts":5,"dur":2,"pid":3,"tid":1,"args":{}},\n'
                 '{"name":"allre')
    events = merge_timeline.merge([str(f)])["traceEvents"]
    assert [e["name"] for e in events] == ["process_name", "allreduce"]


@pytest.mark.slow
def test_path_without_rank_marker(tmp_path):
    p = launch(2, worker("timeline.py"), timeout=60,
               extra_env={"GW_TIMELINE": str(tmp_path / "trace.json")})
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(2):
        assert json.loads((tmp_path / f"trace.{r}.json").read_text())


# ---- daemon mode (capi/daemon_session_trace.h) and the daemons' traces -------------------------

def _merge(*paths, extra=()):
    return subprocess.run([sys.executable, str(ROOT / "perf" / "merge_timeline.py"), *extra,
                           *map(str, paths)], capture_output=True, text=True, timeout=60)


def test_daemon_traces_merge_on_pids_of_their_own(tmp_path):
    # Two ranks' files (pid = rank), a daemon trace of today (pid 1000000 + host index) and one
    # of a gradwired that used the bare host index (pid 0, rank 0's): every process keeps a row
    # of its own, and its name; a second file of rank 0 (another job) is moved, and said so.
    def rank_file(name, r):
        f = tmp_path / name
        f.write_text(json.dumps([
            {"name": "process_name", "ph": "M", "pid": r, "tid": 0,
             "args": {"name": f"rank {r} (pid 7)"}},
            {"name": "allreduce", "cat": "collective", "ph": "X", "ts": 100 + r, "dur": 5,
             "pid": r, "tid": 1, "args": {"bytes": 4}}]))
        return f

    def daemon_file(name, pid, host):
        f = tmp_path / name
        f.write_text(json.dumps({"traceEvents": [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
             "args": {"name": f"gradwired host {host} of 2, job j (pid 9)"}},
            {"name": "allreduce", "cat": "collective", "ph": "X", "ts": 102, "dur": 3,
             "pid": pid, "tid": 0, "args": {"bytes": 4}}],
            "displayTimeUnit": "ms", "otherData": {"job": "j", "host_index": host}}))
        return f

    files = [rank_file("r0.json", 0), rank_file("r1.json", 1), daemon_file("d0.json", 0, 0),
             daemon_file("d1.json", 1000001, 1), rank_file("again0.json", 0)]
    out = tmp_path / "all.json"
    m = _merge(*files, extra=("-o", str(out)))
    assert m.returncode == 0, m.stderr
    assert "again0.json: pid 0 is" in m.stderr and "shown as pid 2" in m.stderr, m.stderr
    events = json.loads(out.read_text())["traceEvents"]
    for e in events:
        check_event(e)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names) == [0, 1, 2, 1000000, 1000001], names
    assert names[0].startswith("rank 0") and names[1].startswith("rank 1"), names
    assert names[2].startswith("rank 0"), names  # the second job's rank 0, moved
    assert names[1000000].startswith("gradwired host 0"), names
    assert names[1000001].startswith("gradwired host 1"), names
    # Every process's events went with it.
    for pid in names:
        assert sum(1 for e in events if e["pid"] == pid and e["ph"] == "X") == 1, (pid, events)


DAEMON_WORKER = """
import os, time
import numpy as np
import gradwire
comm = gradwire.init()
x = np.ones(300_000, dtype=np.float32)   # several of the daemon's chunks
until = time.time() + float(os.environ["TL_SECONDS"])
n = 0
go = np.ones(1, dtype=np.float32)
while go[0] > 0:  # every rank stops at the same call: when one's time is up
    for _ in range(3):
        comm.allreduce(x)
        n += 1
    go[0] = 1.0 if time.time() < until else 0.0
    comm.allreduce(go, op="min")
comm.broadcast(x, root=0)
comm.allgather(np.ones(10, dtype=np.float32))
comm.iallreduce(x).wait()
g = np.ones(4096, dtype=np.float32)
comm.allreduce_compressed(g, "topk:0.1", key="g")
print(f"rank {comm.rank}: {n} allreduces", flush=True)
comm.close()
"""


@pytest.mark.slow
def test_daemon_mode_trainers_write_their_side_beside_the_daemons_trace(tmp_path):
    # Two trainers of one gradwired with GW_TIMELINE: each writes its calls with the phases it
    # sees; the daemon's trace of the job (gradwirectl trace), taken meanwhile, merges beside them,
    # and every collective it holds is a submission of a call in rank 0's file (local rank 0).
    with private_gradwired(tmp_path) as (daemon, sock):
        ctl = str(daemon.parent / "gradwirectl")
        job_env = env(GW_DAEMON=f"unix:{sock}", GW_DAEMON_ARENA="16M", TL_SECONDS="6",
                      GW_TIMELINE=str(tmp_path / "tl.%r.json"))
        ranks = subprocess.Popen([PYTHON, "-m", "gradwire.run", "-np", "2", "--", PYTHON, "-c",
                                  DAEMON_WORKER], cwd=ROOT, env=job_env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        job = None
        for _ in range(200):
            j = subprocess.run([ctl, "jobs", "--json", "--socket", str(sock)], env=env(),
                               capture_output=True, text=True, timeout=30)
            jobs = json.loads(j.stdout) if j.returncode == 0 and j.stdout.strip() else []
            if jobs and jobs[0].get("state") == "running":
                job = jobs[0]["job"]
                break
            if ranks.poll() is not None:
                break
            time.sleep(0.05)
        assert job is not None, ranks.communicate()[0] if ranks.poll() is not None else "no job"
        daemon_trace = tmp_path / "daemon.json"
        t = subprocess.run([ctl, "trace", job, "--seconds", "1", "-o", str(daemon_trace),
                            "--socket", str(sock)], env=env(), capture_output=True, text=True,
                           timeout=60)
        out = ranks.communicate(timeout=120)[0]
        assert ranks.returncode == 0, out
        assert t.returncode == 0, t.stdout + t.stderr

    calls0 = []
    for r in range(2):
        events = json.loads((tmp_path / f"tl.{r}.json").read_text())
        for e in events:
            check_event(e)
        assert {e["pid"] for e in events} == {r}
        assert any(e["name"] == "process_name" and e["args"]["name"].startswith(f"rank {r}")
                   for e in events), events[:3]
        calls = [e for e in events if e.get("cat") == "collective"]
        phases = [e for e in events if e.get("cat") == "phase"]
        names = {e["name"] for e in calls}
        for want in ("allreduce", "broadcast", "allgather", "iallreduce", "allreduce_compressed"):
            assert want in names, (want, names)
        assert all(e["args"]["mode"] == "daemon" for e in calls), calls
        big = [e for e in calls if e["name"] == "allreduce" and e["args"]["bytes"] == 1_200_000]
        assert len(big) >= 3, calls
        # The phases of each thread in the order they began: a call's phases are found by
        # bisection, not by a scan of every phase per call (thousands of calls in 6 s).
        by_tid = {}
        for e in sorted(phases, key=lambda e: e["ts"]):
            by_tid.setdefault(e["tid"], ([], []))
            by_tid[e["tid"]][0].append(e["ts"])
            by_tid[e["tid"]][1].append(e)
        for c in big:
            assert c["args"]["dtype"] == "float32" and c["args"]["op"] == "sum", c
            assert c["args"]["submissions"] >= 1 and c["args"]["seq"] >= 1, c
            starts, tid_phases = by_tid.get(c["tid"], ([], []))
            lo = bisect.bisect_left(starts, c["ts"])
            hi = bisect.bisect_right(starts, c["ts"] + c["dur"])
            inside = {e["name"] for e in tid_phases[lo:hi]
                      if e["ts"] + e["dur"] <= c["ts"] + c["dur"]}
            # numpy buffers are not in the arena: copied in, waited for, copied back.
            assert {"copy to arena", "wait for daemon", "copy from arena"} <= inside, (c, inside)
        # Submission numbers count up, call after call.
        seqs = [c["args"]["seq"] for c in calls if c["tid"] == big[0]["tid"] and "seq" in c["args"]]
        assert seqs == sorted(seqs), seqs
        if r == 0:
            calls0 = calls

    # The daemon's trace beside the trainers': pids apart, and its collectives are rank 0's.
    trace = json.loads(daemon_trace.read_text())
    dcalls = [e for e in trace["traceEvents"] if e.get("cat") == "collective"]
    assert dcalls and {e["pid"] for e in trace["traceEvents"]} == {1_000_000}
    spans = sorted((c["args"]["seq"], c["args"]["seq"] + c["args"]["submissions"])
                   for c in calls0 if "seq" in c["args"])
    starts = [a for a, _ in spans]
    for dc in dcalls:
        s = dc["args"]["seq"]
        # Submission numbers count up call after call: the span that holds s is the last to
        # start at or before it (the scan of them all only where spans overlap).
        i = bisect.bisect_right(starts, s) - 1
        assert (i >= 0 and s < spans[i][1]) or any(a <= s < b for a, b in spans), (dc, spans[:5])
    out = tmp_path / "all.json"
    m = _merge(tmp_path / "tl.0.json", tmp_path / "tl.1.json", daemon_trace,
               extra=("--zero", "-o", str(out)))
    assert m.returncode == 0 and m.stderr == "", m.stderr
    merged = json.loads(out.read_text())["traceEvents"]
    assert {e["pid"] for e in merged} == {0, 1, 1_000_000}
    for e in merged:
        check_event(e)
