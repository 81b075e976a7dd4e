#!/usr/bin/env python3
"""Write a tiny byte-level BPE tokenizer (stdlib only) whose ids fit the tiny
test model's 512-token vocabulary: 256 byte tokens, a few dozen English
merges, and the Qwen chat tokens at the top (<|im_end|> = 511, the tiny
model's eos). tokenizer_config.json carries the Qwen3 chat template.
Usage: make_tiny_tokenizer.py QWEN3_TOKENIZER_DIR OUT_DIR
"""
import json, os, sys

src, out = sys.argv[1], sys.argv[2]
# GPT-2 byte alphabet.
keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cps, n = {}, 0
for b in range(256):
    if b in keep:
        cps[b] = b
    else:
        cps[b] = 256 + n
        n += 1
vocab = {chr(cps[b]): b for b in range(256)}
pairs = ["h e", "t he", "Ġ the", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "Ġ c", "Ġ w", "a n", "Ġ o", "e n", "Ġ t",
         "Ġ b", "i s", "Ġ in", "o r", "a t", "e s", "Ġ m", "Ġ f", "Ġ p", "in g", "Ġ d", "a l", "e d", "o u", "Ġ h",
         "l l", "Ġa n", "Ġan d", "Ġ o", "Ġo f", "Ġt o", "Ġ is", "Ġ Ġ", "ĠĠ ĠĠ", "Ċ Ċ", "l o", "Ġ he", "Ġhe ll", "Ġhell o", "w or", "Ġ wor", "l d", "Ġwor ld"]
merges = []
for p in pairs:
    a, b = p.split(" ")
    for t in (a, b):
        if t not in vocab:
            raise SystemExit(f"merge {p}: {t} not in vocab yet")
    if a + b not in vocab:
        vocab[a + b] = len(vocab)
    merges.append([a, b])
assert len(vocab) < 500
# Unreachable filler entries make the added tokens' ids follow the vocabulary
# without a gap (HF renumbers added tokens after a gap).
while len(vocab) < 505:
    vocab[f"<unused{len(vocab)}>"] = len(vocab)
added = [(505, "<tool_call>", False), (506, "</tool_call>", False), (507, "<think>", False), (508, "</think>", False),
         (509, "<|endoftext|>", True), (510, "<|im_start|>", True), (511, "<|im_end|>", True)]
tok = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": s} for i, c, s in added],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": json.load(open(os.path.join(src, "tokenizer.json")))["pre_tokenizer"],
    "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
              "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": merges},
}
cfg = json.load(open(os.path.join(src, "tokenizer_config.json")))
cfg["added_tokens_decoder"] = {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                        "single_word": False, "special": s} for i, c, s in added}
cfg["additional_special_tokens"] = ["<|im_start|>", "<|im_end|>"]
os.makedirs(out, exist_ok=True)
json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"), ensure_ascii=False)
json.dump(cfg, open(os.path.join(out, "tokenizer_config.json"), "w"), ensure_ascii=False, indent=2)
print(f"{len(vocab)} vocab + {len(added)} added tokens -> {out}")
