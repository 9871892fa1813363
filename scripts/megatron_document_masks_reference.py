#!/usr/bin/env python3
"""Writes tests/data/reference/document_masks.txt: Megatron-core's own masks and position ids for a fixed
set of samples under every combination of --reset-position-ids, --reset-attention-mask and --eod-mask-loss,
which tests/data/test_document_masks.cpp holds our batches to.

megatron-core's function is run from its installed source: `import megatron.core` needs Transformer Engine,
apex and other GPU packages, so the script takes _get_ltor_masks_and_position_ids out of
megatron/core/datasets/gpt_dataset.py (found through the installed distribution's file list) and executes
that definition with torch, then applies GPTDataset.__getitem__'s padding rules (read from the same file):
loss_mask[labels == pad] = 0; tokens and labels equal to pad become 0.

    python3 -m venv --system-site-packages venv     # Debian's python3-torch (1.13) and python3-numpy
    venv/bin/pip install --no-deps megatron-core==0.16.1
    venv/bin/python scripts/megatron_document_masks_reference.py > tests/data/reference/document_masks.txt
"""
import ast
import importlib.metadata
import itertools
import sys

import torch

PAD = -1  # GPTDataset's _PAD_TOKEN_ID when the tokenizer has no pad
EOD = 7
SEQ = 20  # input tokens per sample; a sample holds SEQ + 1


def megatron_function():
    dist = importlib.metadata.distribution("megatron-core")
    path = dist.locate_file("megatron/core/datasets/gpt_dataset.py")
    source = open(path).read()
    tree = ast.parse(source)
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_get_ltor_masks_and_position_ids"]
    namespace = {"torch": torch}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[fn.name], dist.version


def samples():
    """Each SEQ + 1 tokens: EODs in the middle, at the first and last input positions, back to back, only in
    the label position, none at all, and a padded last partial sample."""
    base = [(3 * i + 1) % 11 + 8 for i in range(SEQ + 1)]  # ids 8..18: never EOD

    def with_eod(positions, tokens=None):
        t = list(tokens or base)
        for p in positions:
            t[p] = EOD
        return t

    padded = with_eod([4, 9])
    padded[14:] = [PAD] * (SEQ + 1 - 14)
    return [
        ("no documents end", list(base)),
        ("three documents", with_eod([5, 11])),
        ("EOD first and last", with_eod([0, 8, SEQ - 1])),
        ("EODs back to back", with_eod([3, 4, 5, 15])),
        ("EOD only as the last label", with_eod([SEQ])),
        ("padded last sample", padded),
    ]


def main():
    fn, version = megatron_function()
    out = sys.stdout
    out.write(f"# megatron-core {version} _get_ltor_masks_and_position_ids and GPTDataset padding; eod {EOD} pad {PAD}\n")
    for name, sample in samples():
        text = torch.tensor(sample, dtype=torch.long)
        for reset_pos, reset_attn, eod_mask in itertools.product([False, True], repeat=3):
            tokens, labels = text[:-1].clone(), text[1:].clone()
            attention_mask, loss_mask, position_ids = fn(tokens, EOD, reset_pos, reset_attn, eod_mask, True)
            loss_mask[labels == PAD] = 0.0
            tokens[tokens == PAD] = 0
            labels[labels == PAD] = 0
            out.write(f"sample {name!r} {int(reset_pos)} {int(reset_attn)} {int(eod_mask)}\n")
            out.write("text " + " ".join(str(int(x)) for x in text) + "\n")
            out.write("tokens " + " ".join(str(int(x)) for x in tokens) + "\n")
            out.write("labels " + " ".join(str(int(x)) for x in labels) + "\n")
            out.write("loss_mask " + " ".join(str(int(x)) for x in loss_mask) + "\n")
            out.write("position_ids " + " ".join(str(int(x)) for x in position_ids) + "\n")
            # True where Megatron masks (the key is hidden from the query), one row per query.
            out.write("masked " + " ".join("".join(str(int(v)) for v in row) for row in attention_mask[0]) + "\n")


if __name__ == "__main__":
    main()
