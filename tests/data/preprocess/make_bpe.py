#!/usr/bin/env python3
"""A GPT-2-style byte-level BPE trained at test time, and the ids the `tokenizers` package gives.

Usage: make_bpe.py OUT_DIR INPUT_JSONL VOCAB_SIZE KEY [KEY...]
Trains a byte-level BPE (GPT-2 pre-tokenisation, <|endoftext|> special token) on the values of KEYs in
INPUT_JSONL, writes OUT_DIR/vocab.json and OUT_DIR/merges.txt (GPT2BPETokenizer's files), then reloads
them with ByteLevelBPETokenizer and writes OUT_DIR/expected_<KEY>.txt: one line per valid input line (a
JSON object with every KEY a string), the ids of the value separated by spaces (empty for no tokens).
Lines are read as Megatron does: json.loads on each line (invalid UTF-8 decoded with errors="replace").
Nothing is downloaded. Exits non-zero when the package is missing (the C++ test then fails).
"""
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers.implementations import ByteLevelBPETokenizer


def read_documents(path, keys):
    docs = []
    with open(path, "rb") as f:
        for raw in f:
            try:
                obj = json.loads(raw.decode("utf-8", errors="replace"))
            except ValueError:
                continue
            if isinstance(obj, dict) and all(isinstance(obj.get(k), str) for k in keys):
                docs.append([obj[k] for k in keys])
    return docs


def main():
    out, path, vocab_size, keys = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    docs = read_documents(path, keys)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((t for d in docs for t in d), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(model["vocab"], f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for m in model["merges"]:
            a, b = m.split(" ") if isinstance(m, str) else m
            f.write(f"{a} {b}\n")
    gpt2 = ByteLevelBPETokenizer(os.path.join(out, "vocab.json"), os.path.join(out, "merges.txt"))
    for i, key in enumerate(keys):
        with open(os.path.join(out, f"expected_{key}.txt"), "w") as f:
            for d in docs:
                f.write(" ".join(map(str, gpt2.encode(d[i]).ids)) + "\n")


if __name__ == "__main__":
    main()
