#!/usr/bin/env python3
"""Merges the per-rank timelines of GW_TIMELINE into one Chrome trace (Perfetto, chrome://tracing).

    GW_TIMELINE=/tmp/tl/rank%r.json gradwire-run -np 4 -- python3 train.py
    python3 perf/merge_timeline.py -o /tmp/tl/all.json /tmp/tl/rank*.json

Each rank's events keep their pid (the rank), so every rank is a process row; times are the
ranks' wall clocks in microseconds, so ranks on hosts with synchronised clocks line up. A file
cut short (a rank that crashed: no closing "]", maybe a partial last event) is read up to its last
complete event. --zero shifts the times so that the earliest event starts at 0.
"""
import argparse
import json
import sys


def load(path: str) -> list:
    """The events of one rank's file (a JSON array, possibly missing its end)."""
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
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    if not isinstance(data, list):
        raise ValueError(f"{path}: not a trace-event array")
    return data


def merge(paths: list, zero: bool = False) -> dict:
    events = []
    for p in paths:
        events.extend(load(p))
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
    try:
        merged = merge(a.files, a.zero)
    except (OSError, ValueError) as e:
        print(f"merge_timeline: {e}", file=sys.stderr)
        return 1
    out = sys.stdout if a.output == "-" else open(a.output, "w", encoding="utf-8")
    json.dump(merged, out)
    if out is not sys.stdout:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
