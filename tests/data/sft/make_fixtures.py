#!/usr/bin/env python3
"""Makes the SFT test fixtures in this folder (run from anywhere; nothing is downloaded).

tokenizer.json, tokenizer_config.json: a byte-level BPE tokenizer (HF tokenizers) trained on
conversations.jsonl's text to 320 ids with the ChatML markers as special tokens, and ChatML's chat template.
chat_template_reference.json: conversations rendered by jinja2 with Llama 3 Instruct's and ChatML's chat
templates (what transformers' apply_chat_template renders), to hold the Jinja-free formats of
src/megatron/data/sft/chat_format.h to them.
Needs: tokenizers, jinja2.
"""
import json
import os

import jinja2
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
          "{% endif %}")


def texts():
    with open(os.path.join(HERE, "conversations.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            for m in j.get("messages", []):
                yield m["content"]
            for k in ("system", "prompt", "response"):
                if k in j:
                    yield j[k]


def make_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(texts()) + ["system\n", "user\n", "assistant\n"], trainer)
    tok.save(os.path.join(HERE, "tokenizer.json"))
    config = {"chat_template": CHATML, "eos_token": "<|im_end|>", "pad_token": "<|pad|>", "bos_token": None}
    with open(os.path.join(HERE, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)


def make_references():
    conversations = [
        [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": "Hi\nthere"},
         {"role": "assistant", "content": " Hello! \n"}],
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
         {"role": "user", "content": "\tand 3+3?"}, {"role": "assistant", "content": "6."},
         {"role": "tool", "content": "ok"}],
    ]
    env = jinja2.Environment()
    out = []
    for c in conversations:
        out.append({"messages": c,
                    "chatml": env.from_string(CHATML).render(messages=c, add_generation_prompt=False),
                    "llama3": env.from_string(LLAMA3).render(messages=c, add_generation_prompt=False,
                                                             bos_token="<|begin_of_text|>")})
    with open(os.path.join(HERE, "chat_template_reference.json"), "w") as f:
        json.dump({"llama3_template": LLAMA3, "chatml_template": CHATML, "cases": out}, f, indent=1)


if __name__ == "__main__":
    make_tokenizer()
    make_references()
