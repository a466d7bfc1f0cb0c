"""GW_TIMELINE (core/timeline.h): one Chrome trace per rank, checked against the trace-event
format, with the phases of every collective; perf/merge_timeline.py merges the ranks."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, launch, worker

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
