#!/usr/bin/env python3
"""The lm losses of two pretrain_gpt logs, iteration by iteration: the largest and mean relative difference.

    scripts/gpu/compare_losses.py REFERENCE.log RUN.log "label"

Prints one line: the label, the common iterations, the reference's first and last loss, the largest relative
difference (and where) and the mean. Used by the scripts/gpu/*_bench.sh scripts that hold a layout to another.
"""
import re
import sys


def losses(path):
    out = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = re.search(r"iteration +(\d+)/.*lm loss: ([0-9.E+-]+)", line)
            if m:
                out[int(m.group(1))] = float(m.group(2))
    return out


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    a, b, label = losses(sys.argv[1]), losses(sys.argv[2]), sys.argv[3]
    common = sorted(set(a) & set(b))
    if not common:
        print(f"{label}: no common iterations")
        return
    rel = [abs(a[i] - b[i]) / abs(a[i]) for i in common]
    worst = rel.index(max(rel))
    print(f"{label}: {len(common)} iterations, loss {a[common[0]]:.4f} -> {a[common[-1]]:.4f}; max relative "
          f"difference {max(rel):.2e} (iteration {common[worst]}), mean {sum(rel) / len(rel):.2e}")


if __name__ == "__main__":
    main()
