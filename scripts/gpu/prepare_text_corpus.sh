#!/usr/bin/env bash
# Run here (not on the GPU machine), after a build: a real-text corpus large enough for convergence runs
# (about 10 M tokens, so 500 iterations of 16 k tokens see most of it once), carried with .deps:
#   - the text: the Python 3.11 documentation's reST sources, the Linux 6.1 kernel documentation and the
#     fortunes (Debian packages python3.11-doc, linux-doc-6.1, fortunes), one document per file / fortune,
#     shuffled with a fixed seed;
#   - a byte-level BPE of 32000 tokens trained on it with the `tokenizers` package (vocab.json + merges.txt, so
#     our GPT2BPETokenizer reads it), the Llama-style 0.89B's vocabulary size;
#   - preprocess_data's .bin/.idx in .deps/docs/ (documents kept up to MAX_MB of text).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
MAX_MB=${MAX_MB:-40}  # text kept, in MB of UTF-8 (~4 bytes a token)
for pkg in python3.11-doc linux-doc-6.1 fortunes; do
  dpkg -s "$pkg" >/dev/null 2>&1 || apt-get install -y -qq "$pkg" >/dev/null
done
mkdir -p .deps/docs
python3 - .deps/docs "$MAX_MB" <<'PY'
import glob, gzip, json, os, random, sys
out, max_bytes = sys.argv[1], int(sys.argv[2]) << 20
docs = []
for path in sorted(glob.glob("/usr/share/doc/python3.11/html/_sources/**/*.txt", recursive=True)):
    docs.append(open(path, encoding="utf-8", errors="replace").read())
for path in sorted(glob.glob("/usr/share/doc/linux-doc-6.1/Documentation/**/*.rst.gz", recursive=True)):
    docs.append(gzip.open(path, "rt", encoding="utf-8", errors="replace").read())
for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if path.endswith(".dat") or os.path.islink(path) or os.path.isdir(path):
        continue
    docs += open(path, encoding="utf-8", errors="replace").read().split("\n%\n")
docs = [d.strip() for d in docs if len(d.strip()) > 32]
random.Random(1234).shuffle(docs)
kept, size = [], 0
for d in docs:
    if size >= max_bytes:
        break
    kept.append(d)
    size += len(d.encode())
with open(os.path.join(out, "docs.jsonl"), "w") as f:
    for d in kept:
        f.write(json.dumps({"text": d}) + "\n")
print(f"{len(kept)} documents, {size / 2**20:.1f} MB of text")
from tokenizers import ByteLevelBPETokenizer
tok = ByteLevelBPETokenizer()
tok.train([os.path.join(out, "docs.jsonl")], vocab_size=32000, min_frequency=2, special_tokens=["<|endoftext|>"],
          show_progress=False)
tok.save_model(out)
PY
"$BUILD_DIR"/tools/preprocess_data --input .deps/docs/docs.jsonl --output-prefix .deps/docs/docs \
  --tokenizer-type GPT2BPETokenizer --vocab-file .deps/docs/vocab.json --merge-file .deps/docs/merges.txt \
  --append-eod --workers "$(nproc)" | tail -1
rm .deps/docs/docs.jsonl
du -sh .deps/docs
