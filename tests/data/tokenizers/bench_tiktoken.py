#!/usr/bin/env python3
"""Encode-throughput reference for TokenizerPerf.DISABLED_EncodeThroughput.

Usage: bench_tiktoken.py OUT_DIR
Writes OUT_DIR/bench_text.txt (~4 MB of local text: the system's license texts and Python's own sources,
nothing downloaded), trains a byte-level BPE (8192 tokens) on it, writes OUT_DIR/ranks.tiktoken and times
tiktoken.Encoding.encode_ordinary (Llama 3 pattern) on ~4 KB documents in one thread (best of 3):
OUT_DIR/bench_result.json = {"mb_per_s", "n_ids"}.
"""
import base64
import glob
import json
import os
import sys
import sysconfig
import time

import tiktoken
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(__file__))
from make_fixtures import LLAMA3_PATTERN, byte_alphabet  # noqa: E402


def main():
    out = sys.argv[1]
    chunks, size = [], 0
    files = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                chunks.append(f.read())
        except (OSError, UnicodeDecodeError):
            continue
        size += len(chunks[-1].encode())
        if size > 4_000_000:
            break
    text = "".join(chunks)
    data = text.encode()
    with open(os.path.join(out, "bench_text.txt"), "wb") as f:
        f.write(data)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=8192, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(chunks, trainer=trainer)
    tok.model.save(out)  # vocab.json + merges.txt for the GPT2BPETokenizer run
    vocab = json.loads(tok.to_str())["model"]["vocab"]
    to_byte = byte_alphabet()
    ranked = sorted(vocab.items(), key=lambda kv: kv[1])
    ranks = {bytes(to_byte[c] for c in t): r for r, (t, _) in enumerate(ranked)}
    with open(os.path.join(out, "ranks.tiktoken"), "w") as f:
        for b, r in ranks.items():
            f.write(f"{base64.b64encode(b).decode()} {r}\n")
    enc = tiktoken.Encoding(name="bench", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|begin_of_text|>": len(ranks), "<|end_of_text|>": len(ranks) + 1})
    # The same ~4 KB byte windows as the C++ side (errors="replace" where a window cuts a character).
    docs = [data[i:i + 4096].decode("utf-8", errors="replace") for i in range(0, len(data), 4096)]
    best, n_ids = 1e30, 0
    for _ in range(3):
        t0 = time.perf_counter()
        n_ids = sum(len(enc.encode_ordinary(d)) for d in docs)
        best = min(best, time.perf_counter() - t0)
    with open(os.path.join(out, "bench_result.json"), "w") as f:
        json.dump({"mb_per_s": len(data) / best / 1e6, "n_ids": n_ids}, f)


if __name__ == "__main__":
    main()
