#!/usr/bin/env python3
"""Draws a run's TensorBoard scalars (pretrain_gpt --tensorboard-dir DIR) into a PNG, as TensorBoard's scalar
dashboard shows them: one panel per tag, value over step.

  scripts/tensorboard_png.py DIR OUT.png [--tags "lm loss" "learning-rate" ...]

Reads the event files with the `tensorboard` package's EventAccumulator (the reader `tensorboard --logdir`
uses) and draws with matplotlib (pip install tensorboard matplotlib). docs/observability.md's picture is made
with it (the command is there).
"""
import argparse
import math
import sys

DEFAULT_TAGS = ["lm loss", "lm loss validation", "learning-rate", "grad-norm", "iteration-time",
                "forward-backward-time", "params-norm", "mem-max-allocated-bytes"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logdir")
    parser.add_argument("out")
    parser.add_argument("--tags", nargs="+", default=DEFAULT_TAGS, help="the tags to draw (those present)")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        sys.exit(f"tensorboard_png.py needs the tensorboard and matplotlib packages ({e}): "
                 "pip install tensorboard matplotlib")
    events = EventAccumulator(args.logdir, size_guidance={"scalars": 0})
    events.Reload()
    present = set(events.Tags()["scalars"])
    tags = [t for t in args.tags if t in present]
    if not tags:
        sys.exit(f"none of {args.tags} is in {args.logdir} (it has: {sorted(present)})")
    columns = 2 if len(tags) > 1 else 1
    rows = math.ceil(len(tags) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 2.8 * rows), squeeze=False)
    for ax, tag in zip(axes.flat, tags):
        scalars = events.Scalars(tag)
        ax.plot([s.step for s in scalars], [s.value for s in scalars], color="#e8710a", linewidth=1.5)
        ax.set_title(tag, fontsize=10)
        ax.set_xlabel("iteration", fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(tags):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}: {', '.join(tags)}")


if __name__ == "__main__":
    main()
