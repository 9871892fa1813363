#!/usr/bin/env python3
"""The lm losses of two pretrain_gpt logs, iteration by iteration: the largest and mean relative difference.

    scripts/gpu/compare_losses.py REFERENCE.log RUN.log "label" [--max-rel TOL]

Prints one line: the label, the common iterations, the reference's first and last loss, the largest relative
difference (and where) and the mean. Used by the scripts/gpu/*_bench.sh scripts that hold a layout to another.
With --max-rel the line ends in "ok" or "FAILED" and the exit status is 1 when the largest difference is above
TOL, when a loss is not a number, or when the run logged fewer iterations than the reference (it stopped early).
"""
import math
import re
import sys


def losses(path):
    out = {}
    try:
        f = open(path, errors="replace")
    except OSError as e:
        sys.exit(f"compare_losses.py: cannot read the log {path}: {e.strerror}")
    with f:
        for line in f:
            m = re.search(r"iteration +(\d+)/.*lm loss: ([0-9.EeNAnaIif+-]+)", line)
            if m:
                try:
                    out[int(m.group(1))] = float(m.group(2))
                except ValueError:
                    out[int(m.group(1))] = math.nan
    return out


def main():
    args = sys.argv[1:]
    tol = None
    if "--max-rel" in args:
        i = args.index("--max-rel")
        try:
            tol = float(args[i + 1])
        except (IndexError, ValueError):
            sys.exit(f"compare_losses.py: --max-rel needs a number (got {args[i + 1:i + 2] or 'nothing'})")
        del args[i:i + 2]
    if len(args) != 3:
        sys.exit(__doc__)
    a, b, label = losses(args[0]), losses(args[1]), args[2]
    common = sorted(set(a) & set(b))
    if not common:
        print(f"{label}: no common iterations" + (" FAILED" if tol is not None else ""))
        sys.exit(1 if tol is not None else 0)
    rel = [abs(a[i] - b[i]) / abs(a[i]) for i in common]
    finite = all(math.isfinite(r) for r in rel)
    worst = max(range(len(rel)), key=lambda j: rel[j] if math.isfinite(rel[j]) else math.inf)
    line = (f"{label}: {len(common)} iterations, loss {a[common[0]]:.4f} -> {a[common[-1]]:.4f}; max relative "
            f"difference {rel[worst]:.2e} (iteration {common[worst]}), mean {sum(rel) / len(rel):.2e}")
    if tol is None:
        print(line)
        return
    short = len(b) < len(a)
    failed = not finite or rel[worst] > tol or short
    why = "; stopped early" if short else ""
    print(f"{line}{why} {'FAILED' if failed else 'ok'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
