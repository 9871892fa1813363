#!/usr/bin/env python3
"""Plots training-loss curves of pretrain_gpt runs (the FP8 convergence check) from their logs or from the CSV
this script writes, so the figure can be made again without the logs.

  bench/plot_fp8_convergence.py --csv out.csv --png out.png bf16=run1.log "FP8 delayed"=run2.log ...
  bench/plot_fp8_convergence.py --from-csv out.csv --png out.png

Each curve is the per-iteration lm loss (thin) and its 25-iteration moving mean (thick); validation losses are
dots. The legend gives each run's mean lm loss over its last 50 iterations and its difference from the first run's.
"""
import argparse
import csv
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TRAIN = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*\| lm loss: ([0-9.E+-]+) \|")
VALID = re.compile(r"validation loss at iteration (\d+) \| lm loss value: ([0-9.E+-]+)")


def read_log(path):
    train, valid = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if (m := TRAIN.search(line)):
                train.append((int(m.group(1)), float(m.group(2))))
            elif (m := VALID.search(line)):
                valid.append((int(m.group(1)), float(m.group(2))))
    if not train:
        raise SystemExit(f"{path}: no 'iteration ... | lm loss: ...' lines")
    return train, valid


def moving_mean(values, width):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= width:
            total -= values[i - width]
        out.append(total / min(i + 1, width))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="NAME=LOG")
    p.add_argument("--csv", help="write the curves here (run, kind, iteration, loss)")
    p.add_argument("--from-csv", help="read the curves from this CSV instead of logs")
    p.add_argument("--png", required=True)
    p.add_argument("--title", default="Llama-style 0.89B on real text: bf16 vs FP8")
    a = p.parse_args()
    runs = {}  # name -> (train, valid)
    if a.from_csv:
        with open(a.from_csv) as f:
            for row in csv.DictReader(f):
                train, valid = runs.setdefault(row["run"], ([], []))
                (train if row["kind"] == "train" else valid).append((int(row["iteration"]), float(row["loss"])))
    else:
        for spec in a.runs:
            name, _, path = spec.partition("=")
            if not path:
                raise SystemExit(f"'{spec}': expected NAME=LOG")
            runs[name] = read_log(path)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["run", "kind", "iteration", "loss"])
            for name, (train, valid) in runs.items():
                w.writerows([name, "train", i, v] for i, v in train)
                w.writerows([name, "valid", i, v] for i, v in valid)
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    reference = None
    for k, (name, (train, valid)) in enumerate(runs.items()):
        color = f"C{k}"
        its, losses = [i for i, _ in train], [v for _, v in train]
        tail = sum(losses[-50:]) / len(losses[-50:])
        reference = tail if reference is None else reference
        label = f"{name}: last-50 mean {tail:.4f} ({100 * (tail - reference) / reference:+.2f}%)"
        ax.plot(its, losses, color=color, alpha=0.18, linewidth=0.7)
        ax.plot(its, moving_mean(losses, 25), color=color, linewidth=1.8, label=label)
        if valid:
            ax.plot([i for i, _ in valid], [v for _, v in valid], "o", color=color, markersize=4)
    ax.set_xlabel("iteration")
    ax.set_ylabel("lm loss (thin: per iteration; thick: 25-iteration mean; dots: validation)")
    ax.set_ylim(top=min(8.0, ax.get_ylim()[1]))
    ax.set_title(a.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.png)
    print(f"wrote {a.png}" + (f" and {a.csv}" if a.csv else ""))


if __name__ == "__main__":
    main()
