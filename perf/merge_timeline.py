#!/usr/bin/env python3
"""Merges the per-rank timelines of GW_TIMELINE into one Chrome trace (Perfetto, chrome://tracing).

    GW_TIMELINE=/tmp/tl/rank%r.json gradwire-run -np 4 -- python3 train.py
    python3 perf/merge_timeline.py -o /tmp/tl/all.json /tmp/tl/rank*.json

Each rank's events keep their pid (the rank), so every rank is a process row; times are the
ranks' wall clocks in microseconds, so ranks on hosts with synchronised clocks line up. A file
cut short (a rank that crashed: no closing "]", maybe a partial last event) is read up to its last
complete event. --zero shifts the times so that the earliest event starts at 0.

Daemons' traces (`gradwirectl trace JOB -o FILE`) merge beside them: their pid is 1000000 + the
daemon's host index, a range of its own (a trace from a gradwired that still used the bare host
index is moved there). Two files that claim the same pid (two jobs' rank 0, two traces of one
daemon) are kept apart: the later file's process gets the next free pid, said on stderr.
"""
import argparse
import json
import sys


DAEMON_PID_BASE = 1_000_000  # a daemon's trace: this + its host index (daemon/job_trace.cc)


def load(path: str) -> list:
    """The events of one file (a JSON array, possibly missing its end, or a trace object)."""
    return load_trace(path)[0]


def load_trace(path: str) -> tuple:
    """(events, otherData) of one file; otherData is {} for the ranks' arrays."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        # Cut short: keep the complete lines ("{...}," one event per line as gradwire writes).
        data = []
        for line in text.splitlines():
            line = line.strip().rstrip(",")
            if line.startswith("{") and line.endswith("}"):
                try:
                    data.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    other = {}
    if isinstance(data, dict):
        other = data.get("otherData", {})
        data = data.get("traceEvents", [])
        if not isinstance(other, dict):
            other = {}
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        raise ValueError(f"{path}: not a trace-event array")
    return data, other


def is_daemon_trace(events: list, other: dict) -> bool:
    """A gradwired's trace: its otherData names a host index, or a process is "gradwired host"."""
    if "host_index" in other:
        return True
    return any(e.get("ph") == "M" and e.get("name") == "process_name"
               and str(e.get("args", {}).get("name", "")).startswith("gradwired host")
               for e in events)


def merge(paths: list, zero: bool = False, notes: list | None = None) -> dict:
    """The files' events in one trace, each file's processes on pids of their own. notes (when
    given) gets a line per pid moved."""
    events = []
    owner = {}  # pid -> the file whose process it is
    for p in paths:
        evs, other = load_trace(p)
        pids = sorted({e["pid"] for e in evs if isinstance(e.get("pid"), int)})
        move = {}
        if is_daemon_trace(evs, other):
            move = {pid: DAEMON_PID_BASE + pid for pid in pids if 0 <= pid < DAEMON_PID_BASE}
        for pid in pids:
            want = move.get(pid, pid)
            if want in owner and owner[want] != p:
                # The next pid after every one taken in want's range (ranks, or daemons).
                daemon = want >= DAEMON_PID_BASE
                taken = [q for q in list(owner) + [move.get(q, q) for q in pids]
                         if (q >= DAEMON_PID_BASE) == daemon]
                free = max(taken) + 1
                if notes is not None:
                    notes.append(f"{p}: pid {want} is {owner[want]}'s too; shown as pid {free}")
                want = free
            move[pid] = want
            owner[want] = p
        for e in evs:
            if e.get("pid") in move:
                e["pid"] = move[e["pid"]]
        events.extend(evs)
    if zero:
        t0 = min((e["ts"] for e in events if "ts" in e), default=0)
        for e in events:
            if "ts" in e:
                e["ts"] -= t0
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="the ranks' timeline files")
    ap.add_argument("-o", "--output", default="-", help="merged trace (default: stdout)")
    ap.add_argument("--zero", action="store_true", help="start the merged times at 0")
    a = ap.parse_args()
    notes = []
    try:
        merged = merge(a.files, a.zero, notes)
    except (OSError, ValueError) as e:
        print(f"merge_timeline: {e}", file=sys.stderr)
        return 1
    for n in notes:
        print(f"merge_timeline: {n}", file=sys.stderr)
    out = sys.stdout if a.output == "-" else open(a.output, "w", encoding="utf-8")
    json.dump(merged, out)
    if out is not sys.stdout:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
