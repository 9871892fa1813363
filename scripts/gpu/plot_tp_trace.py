#!/usr/bin/env python3
"""Draws a window of a --tp-comm-overlap profile (the merged Chrome trace pretrain_gpt writes with --profile
--profile-dir, every TP rank profiled: --profile-ranks 0 1) as a picture: per rank, the GEMM chunks on the compute
stream (row tp-gemm) above the transfers on the side stream (row tp-comm), so what runs beside what is visible.

    python3 scripts/gpu/plot_tp_trace.py trace.json out.png [--start-us T] [--window-us 3000]

The window starts at --start-us after the first tp-comm span (default 0: at it) and lasts --window-us.
Prints each row's busy time inside the window, and how much of the tp-comm time had a tp-gemm span beside it on
the same rank."""
import argparse
import json
import sys


def intervals(events, pid, cat, lo, hi):
    out = []
    for e in events:
        if e.get("ph") == "X" and e.get("pid") == pid and e.get("cat") == cat:
            a, b = e["ts"], e["ts"] + e["dur"]
            if b > lo and a < hi:
                out.append((max(a, lo), min(b, hi), e["name"]))
    return sorted(out)


def covered(spans, by):
    """Microseconds of `spans` that some interval of `by` overlaps."""
    total = 0.0
    for a, b, _ in spans:
        cuts = sorted((max(a, c), min(b, d)) for c, d, _ in by if d > a and c < b)
        end = a
        for c, d in cuts:
            if d > end:
                total += d - max(c, end)
                end = d
    return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--start-us", type=float, default=0.0)
    p.add_argument("--window-us", type=float, default=3000.0)
    a = p.parse_args()
    try:
        with open(a.trace) as f:
            events = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{a.trace}: cannot read a Chrome trace ({e})")
    comm = [e for e in events if e.get("ph") == "X" and e.get("cat") == "tp-comm"]
    gemm = [e for e in events if e.get("ph") == "X" and e.get("cat") == "tp-gemm"]
    if not gemm:
        sys.exit(f"{a.trace}: no tp-gemm spans (profile a run with --tp-comm-overlap --sequence-parallel)")
    first = min(e["ts"] for e in (comm or gemm))
    lo = first + a.start_us
    hi = lo + a.window_us
    pids = sorted({e["pid"] for e in gemm})
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.9 * len(pids)))
    colours = {"tp-gemm": "#4c72b0", "tp-comm": "#dd8452"}
    labels, y = [], 0
    for pid in pids:
        rows = {cat: intervals(events, pid, cat, lo, hi) for cat in ("tp-gemm", "tp-comm")}
        for cat in ("tp-comm", "tp-gemm"):
            for s, t, name in rows[cat]:
                ax.broken_barh([(s - lo, t - s)], (y + 0.1, 0.8), facecolors=colours[cat], edgecolor="white",
                               linewidth=0.5)
            busy = sum(t - s for s, t, _ in rows[cat])
            print(f"rank {pid} {cat}: {len(rows[cat])} spans, busy {busy:.0f} of {hi - lo:.0f} us")
            labels.append(f"rank {pid} {cat}")
            y += 1
        comm_us = sum(t - s for s, t, _ in rows["tp-comm"])
        if comm_us > 0:
            print(f"rank {pid}: {100 * covered(rows['tp-comm'], rows['tp-gemm']) / comm_us:.0f}% of the transfer "
                  f"time had a GEMM chunk beside it")
    ax.set_yticks([i + 0.5 for i in range(len(labels))])
    ax.set_yticklabels(labels)
    ax.set_xlabel("microseconds")
    ax.set_xlim(0, hi - lo)
    ax.set_title("--tp-comm-overlap: GEMM chunks (compute stream) and transfers (side stream)")
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
