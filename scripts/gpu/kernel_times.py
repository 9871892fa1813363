#!/usr/bin/env python3
"""Sums Nsight Compute's per-launch GPU time (`ncu --csv --page raw --metrics gpu__time_duration.sum`) by
kernel name and prints the names largest first (the first TOP of them), with their launch count and share of
the total.
    python3 scripts/gpu/kernel_times.py ncu.csv [--top TOP]"""
import argparse
import csv
from collections import defaultdict


def main(path, top):
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f)]
    header = next(i for i, r in enumerate(rows) if "Kernel Name" in r and "gpu__time_duration.sum" in r)
    name_col, time_col = rows[header].index("Kernel Name"), rows[header].index("gpu__time_duration.sum")
    unit = rows[header + 1][time_col]  # the units row: "nsecond", "usecond" or "msecond"
    to_us = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1e-3)
    total, count = defaultdict(float), defaultdict(int)
    for r in rows[header + 2:]:
        if len(r) <= max(name_col, time_col) or not r[time_col]:
            continue
        name = r[name_col].split("(")[0][:90]
        total[name] += float(r[time_col].replace(",", "")) * to_us
        count[name] += 1
    grand = sum(total.values())
    print(f"{sum(count.values())} launches, {grand / 1e3:.2f} ms of GPU time")
    print("| kernel | launches | ms | share |")
    print("|---|---|---|---|")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| {name} | {count[name]} | {us / 1e3:.3f} | {100 * us / grand:.1f}% |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=1000)
    a = parser.parse_args()
    main(a.csv, a.top)
