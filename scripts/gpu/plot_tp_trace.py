#!/usr/bin/env python3
"""Draws a window of a --tp-comm-overlap profile (the merged Chrome trace pretrain_gpt writes with --profile
--profile-dir, every TP rank profiled: --profile-ranks 0 1) as a picture: per rank, the GEMM chunks on the compute
stream (row tp-gemm) above the transfers on the side stream (row tp-comm), so what runs beside what is visible.

    python3 scripts/gpu/plot_tp_trace.py trace.json out.png [--start-us T] [--window-us 3000]
                                         [--rows cp-attention,cp-comm]

--rows names the compute row and the transfer row (default tp-gemm,tp-comm; the copy-engine CP ring's are
cp-attention,cp-comm).

The window starts at --start-us after the first tp-comm span (default 0: at it) and lasts --window-us.
Prints each row's busy time inside the window, and how much of the tp-comm time had a tp-gemm span beside it on
the same rank. A trace recorded with --use-pytorch-profiler also holds what each GPU itself ran (rows
"gpu stream N"): those rows are drawn under the rank's spans (GEMM kernels blue, copies orange, other kernels
grey), and the share of the copy time during which a GEMM or attention kernel ran on the same GPU is printed -- the overlap
as the GPU saw it, not as the spans' events bracket it."""
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


def gpu_rows(events, pid, lo, hi):
    """The rank's "gpu stream N" rows inside [lo, hi): {category: [(start, end, name)]}, in stream order."""
    cats = sorted({e["cat"] for e in events if e.get("ph") == "X" and e.get("pid") == pid
                   and str(e.get("cat", "")).startswith("gpu stream")}, key=lambda c: int(c.split()[-1]))
    rows = {c: intervals(events, pid, c, lo, hi) for c in cats}
    return {c: spans for c, spans in rows.items() if spans}  # streams idle in the window are left out


def is_gemm(name):
    """Matrix-multiply kernels: cuBLAS's and cuDNN's attention (the compute a transfer should hide behind)."""
    return (name.startswith(("nvjet", "sm90_", "cutlass", "ampere_", "sm80_", "cudnn_generated"))
            or "gemm" in name.lower())


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
    p.add_argument("--rows", default="tp-gemm,tp-comm")
    a = p.parse_args()
    rows = a.rows.split(",")
    if len(rows) != 2 or not all(rows):
        sys.exit(f"--rows {a.rows!r}: give the compute row and the transfer row, comma-separated "
                 f"(tp-gemm,tp-comm or cp-attention,cp-comm)")
    compute_row, comm_row = rows
    try:
        with open(a.trace) as f:
            events = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{a.trace}: cannot read a Chrome trace ({e})")
    comm = [e for e in events if e.get("ph") == "X" and e.get("cat") == comm_row]
    gemm = [e for e in events if e.get("ph") == "X" and e.get("cat") == compute_row]
    if not gemm:
        sys.exit(f"{a.trace}: no {compute_row} spans (profile a run with --tp-comm-overlap --sequence-parallel, or "
                 f"--context-parallel-size 2 --cp-comm-transport copy-engine for cp-attention)")
    first = min(e["ts"] for e in (comm or gemm))
    lo = first + a.start_us
    hi = lo + a.window_us
    pids = sorted({e["pid"] for e in gemm})
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n_rows = sum(2 + len(gpu_rows(events, pid, lo, hi)) for pid in pids)
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.45 * n_rows))
    colours = {compute_row: "#4c72b0", comm_row: "#dd8452"}
    labels, y = [], 0
    for pid in pids:
        rows = {cat: intervals(events, pid, cat, lo, hi) for cat in (compute_row, comm_row)}
        for cat in (comm_row, compute_row):
            for s, t, name in rows[cat]:
                ax.broken_barh([(s - lo, t - s)], (y + 0.1, 0.8), facecolors=colours[cat], edgecolor="white",
                               linewidth=0.5)
            busy = sum(t - s for s, t, _ in rows[cat])
            print(f"rank {pid} {cat}: {len(rows[cat])} spans, busy {busy:.0f} of {hi - lo:.0f} us")
            labels.append(f"rank {pid} {cat}")
            y += 1
        comm_us = sum(t - s for s, t, _ in rows[comm_row])
        if comm_us > 0:
            print(f"rank {pid}: {100 * covered(rows[comm_row], rows[compute_row]) / comm_us:.0f}% of the transfer "
                  f"time had a {compute_row} span beside it")
        streams = gpu_rows(events, pid, lo, hi)
        copies, gemms = [], []
        for cat, spans in streams.items():
            for s, t, name in spans:
                colour = "#dd8452" if name.startswith("memcpy") else "#4c72b0" if is_gemm(name) else "#999999"
                ax.broken_barh([(s - lo, t - s)], (y + 0.1, 0.8), facecolors=colour, edgecolor="white", linewidth=0.3)
                (copies if name.startswith("memcpy") else gemms if is_gemm(name) else []).append((s, t, name))
            labels.append(f"rank {pid} {cat}")
            y += 1
        copy_us = sum(t - s for s, t, _ in copies)
        if copy_us > 0:
            print(f"rank {pid} (the GPU's own record): {len(copies)} copies, {copy_us:.0f} us, "
                  f"{100 * covered(copies, gemms) / copy_us:.0f}% of it with a GEMM kernel running beside it")
    ax.set_yticks([i + 0.5 for i in range(len(labels))])
    ax.set_yticklabels(labels)
    ax.set_xlabel("microseconds")
    ax.set_xlim(0, hi - lo)
    ax.set_title(f"{compute_row} (compute stream) and {comm_row} (side stream); the GPUs' own rows: GEMM/attention "
                 "kernels blue, copies orange")
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
