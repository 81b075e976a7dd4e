#!/usr/bin/env python3
"""Reference token ids for the tokenizer test cases, by HF tokenizers and
transformers' chat template. Run where they are installed (the GPU machine).

Usage: make_tokenizer_goldens.py TOKENIZER_DIR CASES.json OUT.json
Also prints HF tokenizers' single-threaded encode speed on English prose.
"""
import json, os, sys, time
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
import tokenizers, transformers
from tokenizers import Tokenizer
from transformers import AutoTokenizer

tdir, cases_path, out_path = sys.argv[1:4]
tok = Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
hf = AutoTokenizer.from_pretrained(tdir)
data = json.load(open(cases_path))
for c in data["cases"]:
    enc = tok.encode(c["text"], add_special_tokens=False)
    c["ids"] = enc.ids
    c["decoded"] = tok.decode(enc.ids, skip_special_tokens=False)
for c in data["chats"]:
    kw = {}
    if "enable_thinking" in c:
        kw["enable_thinking"] = c["enable_thinking"]
    text = hf.apply_chat_template(c["messages"], tokenize=False, add_generation_prompt=c["add_generation_prompt"], **kw)
    c["rendered"] = text
    c["ids"] = tok.encode(text, add_special_tokens=False).ids
data["reference"] = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__}
json.dump(data, open(out_path, "w"), ensure_ascii=False, indent=0)
print(f"{len(data['cases'])} strings, {len(data['chats'])} chats -> {out_path}")

prose = " ".join(c["text"] for c in data["cases"] if c["cat"] == "prose")
big = (prose + "\n") * max(1, (8 << 20) // len(prose.encode()))
t0 = time.perf_counter(); ids = tok.encode(big, add_special_tokens=False).ids; dt = time.perf_counter() - t0
print(f"HF tokenizers encode, one call, {len(big.encode())/1e6:.1f} MB English prose: {len(big.encode())/dt/1e6:.1f} MB/s, {len(ids)} ids")
