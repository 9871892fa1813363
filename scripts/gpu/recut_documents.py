#!/usr/bin/env python3
"""Writes a Megatron indexed dataset (<out>.bin/.idx) whose documents have lengths drawn log-uniformly from
[--min-tokens, --max-tokens], cut from the token stream of an existing one (its documents back to back, in
order, repeated if the stream runs short), each new document ending with the source's last token id of a
document (its end-of-document token when it was preprocessed with --append-eod). For measuring packed
variable-length training (dynamic context parallelism) on real text when the corpus's own documents are short.

    python3 scripts/gpu/recut_documents.py <source prefix> <out prefix> [--min-tokens 1024] [--max-tokens 65536]
        [--documents N] [--seed 1234]

Prints the document count, the total tokens and the length quartiles."""
import argparse
import os
import struct
import sys

import numpy as np

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}


def read_index(prefix):
    try:
        with open(prefix + ".idx", "rb") as f:
            data = f.read()
    except OSError as e:
        sys.exit(f"{prefix}.idx: cannot read the source index ({e.strerror})")
    if data[:9] != b"MMIDIDX\x00\x00":
        sys.exit(f"{prefix}.idx: not a Megatron index (magic {data[:9]!r})")
    version, code, n, d = struct.unpack_from("<QBQQ", data, 9)
    if version != 1 or code not in DTYPES:
        sys.exit(f"{prefix}.idx: version {version}, dtype code {code}: expected version 1 and a code in 1..8")
    sizes = np.frombuffer(data, np.int32, n, 34)
    return code, sizes


def main():
    p = argparse.ArgumentParser()
    p.add_argument("source")
    p.add_argument("out")
    p.add_argument("--min-tokens", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=65536)
    p.add_argument("--documents", type=int, default=0, help="0: as many as the source's tokens give")
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args()
    if not 1 <= a.min_tokens <= a.max_tokens:
        sys.exit(f"--min-tokens {a.min_tokens} and --max-tokens {a.max_tokens}: need 1 <= min <= max")
    if a.out == a.source:
        sys.exit(f"{a.out}: the output prefix is the source's; give another (the source is read whole first, but "
                 "a failed write would lose it)")
    code, sizes = read_index(a.source)
    try:
        stream = np.fromfile(a.source + ".bin", DTYPES[code])
    except OSError as e:
        sys.exit(f"{a.source}.bin: cannot read the source tokens ({e.strerror})")
    if stream.size != int(sizes.sum()):
        sys.exit(f"{a.source}.bin holds {stream.size} tokens, its index says {int(sizes.sum())}")
    eod = stream[int(sizes[0]) - 1]
    rng = np.random.default_rng(a.seed)
    lengths = []
    total = 0
    while (a.documents and len(lengths) < a.documents) or (not a.documents and total < stream.size):
        length = int(round(np.exp(rng.uniform(np.log(a.min_tokens), np.log(a.max_tokens)))))
        lengths.append(length)
        total += length
    tokens = np.resize(stream, total)  # the stream repeated as far as the lengths need
    ends = np.cumsum(lengths) - 1
    tokens[ends] = eod
    n = len(lengths)
    item = np.dtype(DTYPES[code]).itemsize
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1])]).astype(np.int64) * item
    # Both files are written beside their names and renamed into place only once complete: an interrupted run
    # leaves any earlier output whole.
    tokens.tofile(a.out + ".bin.tmp")
    with open(a.out + ".idx.tmp", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<QBQQ", 1, code, n, n + 1))
        f.write(np.asarray(lengths, np.int32).tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(n + 1, dtype=np.int64).tobytes())
    os.replace(a.out + ".bin.tmp", a.out + ".bin")
    os.replace(a.out + ".idx.tmp", a.out + ".idx")
    q = np.percentile(lengths, [0, 25, 50, 75, 100]).astype(int)
    print(f"{a.out}: {n} documents, {total} tokens, lengths min/25%/median/75%/max {'/'.join(map(str, q))}")


if __name__ == "__main__":
    main()
