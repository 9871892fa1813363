#!/usr/bin/env python3
"""Seed corpora of the tokenizer fuzz targets, from the tests' own fixture builder.

Usage: make_tokenizer_seeds.py OUT_DIR MAKE_FIXTURES_PY
Imports tests/data/tokenizers/make_fixtures.py (the file the tokenizer parity test trains its tokenizers with)
and builds the same kinds of files with small vocabularies, so that the fuzzer mutates inputs of a few KB:
GPT-2 vocab.json + merges.txt, HF tokenizer.json files (byte-level with Llama 3's split, NFC; metaspace with
byte fallback), tiktoken ranks (text and Megatron's JSON list), sentencepiece models. Each seed file is the
target's parts joined by the separator of fuzz/fuzz_support.h. Needs tokenizers, tiktoken and sentencepiece.
"""
import base64
import importlib.util
import io
import json
import os
import sys
import tempfile

SEPARATOR = b"\n--megatron-fuzz-part--\n"
TEXTS = [b"Hello, world! It's 2024.", "Caf\u00e9 \u4f60\u597d \U0001F600\n\t  x".encode(), b"\xff\xfe ill-formed \xc3"]


def load_fixtures(path):
    spec = importlib.util.spec_from_file_location("make_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_seed(out, target, name, parts):
    os.makedirs(os.path.join(out, target), exist_ok=True)
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(SEPARATOR.join(parts))


def main():
    out, fixtures_path = sys.argv[1], sys.argv[2]
    fx = load_fixtures(fixtures_path)
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    import sentencepiece as spm

    lines = fx.corpus(repeat=1)
    vocab, merges = fx.train_byte_level(lines, 300)
    with tempfile.TemporaryDirectory() as work:
        fx.write_gpt2_files(work, vocab, merges)
        files = [open(os.path.join(work, n), "rb").read() for n in ("vocab.json", "merges.txt")]
    for i, text in enumerate(TEXTS):
        write_seed(out, "tokenizer_gpt2", f"gpt2_{i}", files + [text])

    hf = {
        "llama3": fx.byte_level_hf(
            vocab, merges,
            pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(fx.LLAMA3_PATTERN), behavior="isolated", invert=False),
                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            ignore_merges=True, specials=["<|begin_of_text|>", "<|end_of_text|>"]),
        "neox_nfc": fx.byte_level_hf(vocab, merges, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                                     normalizer=normalizers.NFC(), specials=["<|endoftext|>"]),
    }
    config = json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}}).encode()
    for name, tok in hf.items():
        write_seed(out, "tokenizer_hf", name, [tok.to_str().encode(), config, TEXTS[0]])
    metaspace = fx.metaspace_model(lines[:4])
    write_seed(out, "tokenizer_hf", "metaspace", [json.dumps(metaspace).encode(), b"", TEXTS[1]])

    to_byte = fx.byte_alphabet()
    ranked = sorted(((t, i) for t, i in vocab.items() if t != "<|endoftext|>"), key=lambda kv: kv[1])
    ranks = [(bytes(to_byte[c] for c in t), r) for r, (t, _) in enumerate(ranked)]
    text_format = "".join(f"{base64.b64encode(b).decode()} {r}\n" for b, r in ranks).encode()
    json_format = json.dumps([{"rank": r, "token_bytes": base64.b64encode(b).decode()}
                              for b, r in ranks]).encode()
    for i, text in enumerate(TEXTS):
        write_seed(out, "tokenizer_tiktoken", f"text_{i}", [text_format, text])
    write_seed(out, "tokenizer_tiktoken", "json_list", [json_format, TEXTS[0]])

    for name, kwargs in (("unigram", dict(model_type="unigram", vocab_size=300)),
                         ("bpe_bytes", dict(model_type="bpe", vocab_size=600, byte_fallback=True))):
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, hard_vocab_limit=False,
                                       minloglevel=2, character_coverage=0.98,
                                       normalization_rule_name="identity", **kwargs)
        write_seed(out, "tokenizer_sentencepiece", name, [model.getvalue(), TEXTS[1]])


if __name__ == "__main__":
    main()
