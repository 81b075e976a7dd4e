#!/usr/bin/env python3
"""Check, with transformers, that the committed tiny checkpoints load and
reproduce the committed goldens (last-position logits of every prompt).

The multimodal fixture's experts were fused by scripts/fuse_experts.py after
transformers wrote them; this confirms transformers reads that layout to the
same model. Run on the GPU machine (its python has torch + transformers).
Usage: check_fixtures_in_transformers.py [tests/data]
"""
import json, os, sys
import torch
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration

data = sys.argv[1] if len(sys.argv) > 1 else "tests/data"
g = json.load(open(os.path.join(data, "goldens", "tiny-qwen35moe.json")))
ok = True
for sub, cls in (("tiny-qwen35moe-text", Qwen3_5MoeForCausalLM),
                 ("tiny-qwen35moe-vl", Qwen3_5MoeForConditionalGeneration)):
    m = cls.from_pretrained(os.path.join(data, sub), dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in g["prompts"]:
            out = m(torch.tensor([p["ids"]]), use_cache=False)
            d = (out.logits[0, -1] - torch.tensor(p["last_logits"])).abs().max().item()
            print(f"{sub}: {len(p['ids'])}-token prompt, max |logit - golden| = {d:.3g}")
            ok &= d < 1e-4
print("transformers fixture check:", "OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
