#!/usr/bin/env bash
# Run here (not on the GPU machine), after a build: real text for GPU runs that need it (the pipeline GPT-2 check),
# carried with .deps: Debian's fortunes corpus, a byte-level BPE of 8192 tokens trained on it with the
# `tokenizers` package (vocab.json + merges.txt), and preprocess_data's .bin/.idx (about 0.8 M tokens, 2 MB) in
# .deps/data/. Without a local build of preprocess_data the jsonl stays in .deps/data and the GPU scripts
# tokenise it there (scripts/gpu/pp_bench.sh does, after building preprocess_data).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
[ -d /usr/share/games/fortunes ] || apt-get install -y -qq fortunes >/dev/null
mkdir -p .deps/data
python3 - .deps/data <<'PY'
import glob, json, os, random, sys
out = sys.argv[1]
docs = []
for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if path.endswith(".dat") or os.path.islink(path) or os.path.isdir(path):
        continue
    text = open(path, encoding="utf-8", errors="replace").read()
    docs += [d.strip() for d in text.split("\n%\n") if d.strip()]
random.Random(1234).shuffle(docs)
with open(os.path.join(out, "fortunes.jsonl"), "w") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")
from tokenizers import ByteLevelBPETokenizer
tok = ByteLevelBPETokenizer()
tok.train([os.path.join(out, "fortunes.jsonl")], vocab_size=8192, min_frequency=2, special_tokens=["<|endoftext|>"])
tok.save_model(out)
PY
if [ -x "$BUILD_DIR"/tools/preprocess_data ]; then
  "$BUILD_DIR"/tools/preprocess_data --input .deps/data/fortunes.jsonl --output-prefix .deps/data/fortunes \
    --tokenizer-type GPT2BPETokenizer --vocab-file .deps/data/vocab.json --merge-file .deps/data/merges.txt \
    --append-eod --workers "$(nproc)" | tail -1
  rm .deps/data/fortunes.jsonl
else
  echo "no $BUILD_DIR/tools/preprocess_data: .deps/data/fortunes.jsonl is left for the GPU machine to tokenise"
fi
du -sh .deps/data
