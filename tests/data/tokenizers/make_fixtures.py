#!/usr/bin/env python3
"""Builds tokenizer files with the canonical packages and writes their reference encodings.

Usage: make_fixtures.py OUT_DIR
Reads OUT_DIR/strings.json (a list of hex-encoded byte strings), trains small tokenizers on a corpus written
here (nothing is downloaded), writes their files into OUT_DIR and OUT_DIR/expected.json:
  {name: {"files": {...}, "ids": [[...], ...], "decoded": [hex, ...]}}
Bytes become Python str with errors="replace" (what the C++ side does for ill-formed UTF-8).
Exits non-zero (the C++ test fails) when a package is missing.
"""
import base64
import json
import os
import sys

import sentencepiece as spm
import tiktoken
from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers)
from tokenizers.implementations import ByteLevelBPETokenizer

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def corpus(repeat=1):
    base = [
        "The quick brown fox jumps over the lazy dog. It's a dog's life, isn't it? We're here, they've gone.",
        "I'll say it: you'd better believe the tokenizer's output. Don't stop; won't stop. She'll know.",
        "Café, naïve, résumé, façade, coöperate, Ångström, jalapeño, smörgåsbord, crème brûlée.",
        "Съешь же ещё этих мягких французских булок, да выпей чаю. Привет, мир!",
        "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε, αλφάβητο.",
        "我能吞下玻璃而不伤身体。你好，世界！東京は日本の首都です。한국어 문장도 있습니다.",
        "أنا قادر على أكل الزجاج و هذا لا يؤلمني. مرحبا بالعالم",
        "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती. नमस्ते दुनिया",
        "Emoji: 😀 😃 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷 ✨🚀",
        "Numbers: 0 1 12 123 1234 12345 3.14159 2,718,281 1e10 0xDEADBEEF 2024-01-31 10:45:00",
        "def encode(self, text: str) -> list[int]:\n    return [self.vocab[t] for t in text.split()]\n",
        "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot product\n\tif (x != y) return -1;",
        "    indented line\n\n\nthree newlines\t\ttabs   and   spaces    end   ",
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"key\": [1, 2, 3], \"ok\": true}",
        "Megatron-LM trains transformer models with tensor, pipeline and data parallelism at scale.",
        "Byte pair encoding merges the most frequent pair of symbols, again and again, until the vocabulary is full.",
    ]
    lines = []
    for r in range(repeat):
        for i, line in enumerate(base):
            lines.append(line if r == 0 else f"{line} {r} {i}")
    return lines


def byte_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def train_byte_level(lines, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges


def write_gpt2_files(out, vocab, merges):
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")


def byte_level_hf(vocab, merges, pre, normalizer=None, ignore_merges=False, specials=()):
    tok = Tokenizer(models.BPE(vocab=dict(vocab), merges=list(merges), ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials))
    return tok


def metaspace_model(lines):
    """A Llama 2 / Mistral style BPE (byte_fallback, <unk>, <0xXX> tokens) trained on metaspace text."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=90, show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    j = json.loads(tok.to_str())
    old = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in old:
        if t not in vocab:
            vocab[t] = len(vocab)
    j["model"]["vocab"] = vocab
    j["model"].update(byte_fallback=True, fuse_unk=True, unk_token="<unk>")
    for a in j["added_tokens"]:
        a["id"] = vocab[a["content"]]
    return j


def main():
    out = sys.argv[1]
    with open(os.path.join(out, "strings.json")) as f:
        texts = [bytes.fromhex(h).decode("utf-8", errors="replace") for h in json.load(f)]
    lines = corpus(repeat=3)
    with open(os.path.join(out, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))

    vocab, merges = train_byte_level(lines, 1200)
    write_gpt2_files(out, vocab, merges)
    encoders = {}  # name -> (files, encode(str) -> ids, decode(ids) -> bytes)

    gpt2 = ByteLevelBPETokenizer(os.path.join(out, "vocab.json"), os.path.join(out, "merges.txt"))
    encoders["gpt2"] = ({"type": "GPT2BPETokenizer", "vocab_file": "vocab.json", "merge_file": "merges.txt"},
                        lambda s: gpt2.encode(s).ids, lambda ids: gpt2.decode(ids, skip_special_tokens=False).encode())

    hf = {
        "hf_neox": byte_level_hf(vocab, merges, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                                 normalizer=normalizers.NFC(), specials=["<|endoftext|>", "<|padding|>"]),
        "hf_llama3": byte_level_hf(
            vocab, merges,
            pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                                     pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]),
            ignore_merges=True, specials=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]),
        "hf_qwen2": byte_level_hf(
            vocab, merges,
            pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
                                     pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)]),
            normalizer=normalizers.NFC(), specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
        "hf_digits": byte_level_hf(
            vocab, merges,
            pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                     pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)]),
            specials=["<|endoftext|>"]),
    }
    llama2 = metaspace_model(lines)
    llama2["decoder"] = json.loads(decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]).__getstate__())
    hf["hf_llama2"] = Tokenizer.from_str(json.dumps(llama2))
    mistral = dict(llama2)
    mistral["normalizer"] = None
    mistral["pre_tokenizer"] = json.loads(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False).__getstate__())
    mistral["decoder"] = json.loads(decoders.Metaspace(replacement="▁", prepend_scheme="first").__getstate__())
    hf["hf_mistral"] = Tokenizer.from_str(json.dumps(mistral))
    split_ms = dict(mistral)
    split_ms["pre_tokenizer"] = json.loads(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True).__getstate__())
    hf["hf_metaspace_split"] = Tokenizer.from_str(json.dumps(split_ms))
    for name, tok in hf.items():
        path = f"{name}.json"
        tok.save(os.path.join(out, path))
        encoders[name] = ({"type": "HuggingFaceTokenizer", "tokenizer_model": path},
                          (lambda t: lambda s: t.encode(s, add_special_tokens=False).ids)(tok),
                          (lambda t: lambda ids: t.decode(ids, skip_special_tokens=False).encode())(tok))

    # tiktoken: the byte-level BPE's tokens as bytes, ranked by id (= merge order); specials after the ranks.
    to_byte = byte_alphabet()
    ranked = sorted(((t, i) for t, i in vocab.items() if t != "<|endoftext|>"), key=lambda kv: kv[1])
    ranks = {bytes(to_byte[c] for c in t): r for r, (t, _) in enumerate(ranked)}
    with open(os.path.join(out, "ranks.tiktoken"), "w") as f:
        for b, r in ranks.items():
            f.write(f"{base64.b64encode(b).decode()} {r}\n")
    for name, pattern, pname in (("tiktoken_llama3", LLAMA3_PATTERN, "v2"), ("tiktoken_gpt2", GPT2_PATTERN, "v1"),
                                 ("tiktoken_qwen2", QWEN2_PATTERN, "qwen2")):
        enc = tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks,
                                special_tokens={"<|begin_of_text|>": len(ranks), "<|end_of_text|>": len(ranks) + 1})
        encoders[name] = ({"type": "TikTokenizer", "tokenizer_model": "ranks.tiktoken", "tiktoken_pattern": pname},
                          enc.encode_ordinary, enc.decode_bytes)

    for name, kwargs in (("spm_unigram", dict(model_type="unigram", vocab_size=300, character_coverage=0.98)),
                         ("spm_bpe_bytes", dict(model_type="bpe", vocab_size=600, character_coverage=0.98,
                                                byte_fallback=True))):
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=os.path.join(out, name),
                                       hard_vocab_limit=False, minloglevel=2, **kwargs)
        sp = spm.SentencePieceProcessor(model_file=os.path.join(out, f"{name}.model"))
        encoders[name] = ({"type": "SentencePieceTokenizer", "tokenizer_model": f"{name}.model"},
                          (lambda p: lambda s: p.encode(s))(sp), (lambda p: lambda ids: p.decode(ids).encode())(sp))

    expected = {}
    for name, (files, encode, decode) in encoders.items():
        ids = [list(encode(t)) for t in texts]
        expected[name] = {"files": files, "ids": ids, "decoded": [bytes(decode(i)).hex() for i in ids]}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)


if __name__ == "__main__":
    main()
