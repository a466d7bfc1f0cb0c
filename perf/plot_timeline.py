#!/usr/bin/python3
"""Draws GW_TIMELINE traces as a PNG: one row per rank and thread, one bar per event, coloured by
event name (the collective and its phases).

    GW_TIMELINE=/tmp/tl/rank%r.json gradwire-run -np 4 -- python3 train.py
    python3 perf/merge_timeline.py --zero -o /tmp/tl/all.json /tmp/tl/rank*.json
    python3 perf/plot_timeline.py /tmp/tl/all.json -o timeline.png --from-ms 900 --to-ms 1400

FILES are merged traces (perf/merge_timeline.py) or the ranks' own files (merged here the same
way). Complete events ("ph": "X") are drawn; a row is one (pid, tid), labelled with the
process_name / thread_name metadata ("rank 0 / gw-worker"). Collectives (category "collective")
are the full-height bars, their phases and the codec's steps narrower bars over them (shorter
over longer), so a phase shows where it lies in its call. --from-ms / --to-ms cut a window
(milliseconds from the earliest event); --min-us leaves out events shorter than that (default 0: every event; a bar is
at least one pixel wide). Rows with no event in the window are left out. Needs
python3-matplotlib.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import merge_timeline  # noqa: E402  (perf/merge_timeline.py)

# Fixed colours for the phases gradwire writes (docs/horovod.md, "Timeline"); others get the
# colour cycle's next one.
COLOURS = {
    "allreduce": "#9ecae1", "broadcast": "#c6dbef", "allgather": "#bcbddc", "alltoall": "#dadaeb",
    "reduce_scatter": "#a1d99b", "barrier": "#d9d9d9",
    "queued": "#fdd0a2", "connect": "#756bb1", "wait for peers": "#e6550d",
    "transfer": "#3182bd", "reduce": "#31a354",
    "encode": "#de2d26", "exchange": "#08519c", "decode": "#fc9272",
}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("files", nargs="+", help="merged trace(s) or the ranks' timeline files")
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    ap.add_argument("--from-ms", type=float, default=None)
    ap.add_argument("--to-ms", type=float, default=None)
    ap.add_argument("--min-us", type=float, default=0.0)
    ap.add_argument("--title", default="gradwire timeline")
    ap.add_argument("--width", type=float, default=11.0, help="inches (default 11)")
    ap.add_argument("--dpi", type=int, default=90)
    a = ap.parse_args()
    if a.from_ms is not None and a.to_ms is not None and a.to_ms <= a.from_ms:
        ap.error("--to-ms must be after --from-ms")
    return a


def rows_of(events: list) -> tuple:
    """(rows, labels): the complete events by (pid, tid), and each row's label."""
    pname, tname = {}, {}
    for e in events:
        if e.get("ph") == "M":
            n = e.get("args", {}).get("name", "")
            if e.get("name") == "process_name":
                pname[e["pid"]] = n
            elif e.get("name") == "thread_name":
                tname[(e["pid"], e["tid"])] = n
    rows = {}
    for e in events:
        if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)):
            rows.setdefault((e["pid"], e["tid"]), []).append(e)
    labels = {k: f"{pname.get(k[0], f'pid {k[0]}')} / {tname.get(k, f'tid {k[1]}')}"
              for k in rows}
    return rows, labels


def main() -> int:
    a = parse()
    try:
        events = merge_timeline.merge(a.files, zero=True)["traceEvents"]
    except (OSError, ValueError) as e:
        print(f"plot_timeline: {e}", file=sys.stderr)
        return 1
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        print("plot_timeline: matplotlib missing (apt-get install python3-matplotlib)",
              file=sys.stderr)
        return 3
    lo = (a.from_ms or 0.0) * 1000
    hi = a.to_ms * 1000 if a.to_ms is not None else float("inf")
    rows, labels = rows_of(events)
    keep = {}
    for k, evs in rows.items():
        sel = [e for e in evs if e["ts"] < hi and e["ts"] + e.get("dur", 0) > lo
               and e.get("dur", 0) >= a.min_us]
        if sel:
            keep[k] = sel
    if not keep:
        print("plot_timeline: no complete event in the window", file=sys.stderr)
        return 1
    order = sorted(keep)
    end = max(e["ts"] + e.get("dur", 0) for evs in keep.values() for e in evs)
    hi = min(hi, end)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colours = dict(COLOURS)
    fig, ax = plt.subplots(figsize=(a.width, 0.9 + 0.42 * len(order)))
    used = []
    for y, k in enumerate(order):
        # Collectives first, their phases over them; longer bars first, so that a chunk's
        # reduction shows over the transfer that holds it.
        for full in (True, False):
            for e in sorted(keep[k], key=lambda e: -e.get("dur", 0)):
                if (e.get("cat") == "collective") != full:
                    continue
                name = e["name"]
                if name not in colours:
                    colours[name] = cycle[len(colours) % len(cycle)]
                if name not in used:
                    used.append(name)
                x0 = max(e["ts"], lo)
                x1 = min(e["ts"] + e.get("dur", 0), hi)
                h = 0.8 if full else 0.44
                ax.broken_barh([((x0 - lo) / 1000, max((x1 - x0) / 1000, 1e-3))], (y - h / 2, h),
                               facecolors=colours[name], edgecolor="none")
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([labels[k] for k in order], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, (hi - lo) / 1000)
    ax.set_xlabel(f"ms (from {lo / 1000:.1f} ms after the earliest event)")
    ax.set_title(a.title, fontsize=10)
    ax.legend(handles=[Patch(color=colours[n], label=n) for n in used], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(a.output, dpi=a.dpi)
    print(f"plot_timeline: {a.output}: {len(order)} rows, "
          f"{sum(len(v) for v in keep.values())} events, {(hi - lo) / 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
