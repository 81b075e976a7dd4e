#!/usr/bin/env python3
"""Make the tiny qwen3_5_moe fixtures and their golden outputs with transformers.

Run on a machine whose python has torch + transformers (>= 5, which implements
qwen3_5_moe). Writes, under OUTDIR:

  tiny-qwen35moe-text/   Qwen3_5MoeForCausalLM layout: flat config
                         (model_type qwen3_5_moe_text), model.layers.*,
                         one safetensors file, experts rewritten per expert
                         (mlp.experts.E.gate_proj.weight ...).
  tiny-qwen35moe-vl/     Qwen3_5MoeForConditionalGeneration layout: nested
                         text_config, model.language_model.layers.*,
                         model.visual.*, an mtp.* tensor, sharded with an
                         index, experts as transformers saves them (fused).
  goldens.json           float32 reference outputs computed by transformers
                         from the stored bf16 weights (see README in tests/data).

The weights are random (seeded); norm weights, A_log and dt_bias are moved away
from their init values so that a convention error (w vs 1+w) cannot hide.
Three scales are set like a trained model's rather than like an untrained
init, so that the fixture is not chaotic under small weight errors (a
quantized container must be able to reproduce its greedy tokens): embeddings
large against each layer's update (std 1.2: a residual-dominated stream),
routers decisive (std 0.96: top-k margins well above rounding), and a peaked
lm_head (std 0.96). With init scales, 0.6 % int8 weight noise flipped 20 % of
the router choices and changed the first greedy token.
"""
import json, os, sys, shutil
import torch

OUT = sys.argv[1] if len(sys.argv) > 1 else "tiny-out"
torch.manual_seed(1234)

import transformers
from transformers import (Qwen3_5MoeTextConfig, Qwen3_5MoeConfig,
                          Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration)
from safetensors.torch import load_file, save_file

VOCAB = 512
text_cfg = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=8,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4,
    moe_intermediate_size=32, shared_expert_intermediate_size=48,
    num_experts=16, num_experts_per_tok=4,
    rms_norm_eps=1e-6, initializer_range=0.06, max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                     "partial_rotary_factor": 0.25,
                     "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    tie_word_embeddings=False, bos_token_id=None, eos_token_id=VOCAB - 1,
)

cfg = Qwen3_5MoeTextConfig(**text_cfg)
print("layer_types", cfg.layer_types, flush=True)
model = Qwen3_5MoeForCausalLM(cfg).eval()

# Perturb the parameters whose init hides conventions.
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("layernorm.weight") or name.endswith("q_norm.weight") \
                or name.endswith("k_norm.weight") or name == "model.norm.weight":
            p.copy_(torch.randn_like(p) * 0.2)            # RMSNorm uses (1 + w)
        elif name.endswith("linear_attn.norm.weight"):
            p.copy_(1.0 + torch.randn_like(p) * 0.2)      # gated RMSNorm uses w
        elif name.endswith("A_log"):
            p.copy_(torch.empty_like(p).uniform_(0.05, 1.5).log())
        elif name.endswith("dt_bias"):
            p.copy_(torch.randn_like(p) * 0.5)
        elif name.endswith("conv1d.weight"):
            p.copy_(torch.randn_like(p) * 0.3)
        elif name == "model.embed_tokens.weight":
            p.mul_(20.0)
        elif name.endswith("mlp.gate.weight") or name == "lm_head.weight":
            p.mul_(16.0)
model = model.to(torch.bfloat16)

text_dir = os.path.join(OUT, "tiny-qwen35moe-text")
vl_dir = os.path.join(OUT, "tiny-qwen35moe-vl")
for d in (text_dir, vl_dir):
    shutil.rmtree(d, ignore_errors=True)
model.save_pretrained(text_dir)
print("saved", sorted(os.listdir(text_dir)), flush=True)

# Rewrite the experts of the text layout as per-expert tensors.
st_path = os.path.join(text_dir, "model.safetensors")
sd = load_file(st_path)
names = sorted(sd)
print("text layout expert names:", [n for n in names if "experts" in n][:6], flush=True)
I = text_cfg["moe_intermediate_size"]
new = {}
for n, t in sd.items():
    if n.endswith("mlp.experts.gate_up_proj"):
        pre = n[: -len("gate_up_proj")]
        for e in range(t.shape[0]):
            new[f"{pre}{e}.gate_proj.weight"] = t[e, :I].contiguous()
            new[f"{pre}{e}.up_proj.weight"] = t[e, I:].contiguous()
    elif n.endswith("mlp.experts.down_proj"):
        pre = n[: -len("down_proj")]
        for e in range(t.shape[0]):
            new[f"{pre}{e}.down_proj.weight"] = t[e].contiguous()
    else:
        new[n] = t
save_file(new, st_path, metadata={"format": "pt"})

# Reference model: float32, loaded from what was stored.
ref = Qwen3_5MoeForCausalLM.from_pretrained(text_dir, dtype=torch.float32,
                                            attn_implementation="eager").eval()
# The per-expert rewrite must load to exactly the stored weights.
def loads_back(r):
    rsd = r.state_dict()
    return all(torch.equal(rsd[n].float(), t.float()) for n, t in model.state_dict().items())
if loads_back(ref):
    print("per-expert layout loads back exactly", flush=True)
else:
    print("WARNING: transformers does not load per-expert names; keeping the fused layout", flush=True)
    save_file(sd, st_path, metadata={"format": "pt"})
    ref = Qwen3_5MoeForCausalLM.from_pretrained(text_dir, dtype=torch.float32,
                                                attn_implementation="eager").eval()
    assert loads_back(ref)

# The multimodal layout with the same text weights.
vl_cfg = Qwen3_5MoeConfig(
    text_config=dict(text_cfg),
    vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                       out_hidden_size=64, patch_size=4, num_position_embeddings=16,
                       spatial_merge_size=2, temporal_patch_size=2),
)
vl = Qwen3_5MoeForConditionalGeneration(vl_cfg).eval().to(torch.bfloat16)
with torch.no_grad():
    vl.model.language_model.load_state_dict(model.model.state_dict())
    vl.lm_head.weight.copy_(model.lm_head.weight)
vl.save_pretrained(vl_dir, max_shard_size="1MB")
# Real published checkpoints carry a multi-token-prediction head under mtp.*.
idx_path = os.path.join(vl_dir, "model.safetensors.index.json")
with open(idx_path) as f:
    idx = json.load(f)
save_file({"mtp.fc.weight": torch.randn(64, 128).to(torch.bfloat16)},
          os.path.join(vl_dir, "mtp.safetensors"), metadata={"format": "pt"})
idx["weight_map"]["mtp.fc.weight"] = "mtp.safetensors"
with open(idx_path, "w") as f:
    json.dump(idx, f, indent=2)
vl_names = sorted(idx["weight_map"])
print("vl layout files:", sorted(os.listdir(vl_dir)), flush=True)
print("vl expert names:", [n for n in vl_names if "experts" in n][:4], flush=True)

vl_ref = Qwen3_5MoeForConditionalGeneration.from_pretrained(
    vl_dir, dtype=torch.float32, attn_implementation="eager").eval()

# Goldens.
router_idx = {}
hooks = []
for li, layer in enumerate(ref.model.layers):
    def hook(mod, inp, out, li=li):
        router_idx[li] = out[2].detach().cpu().tolist()
    hooks.append(layer.mlp.gate.register_forward_hook(hook))

g = torch.Generator().manual_seed(7)
prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (1, 10, 60)]
goldens = {"transformers": transformers.__version__, "torch": torch.__version__,
           "dtype": "float32 from stored bf16", "n_greedy": 16, "prompts": []}
with torch.no_grad():
    for ids in prompts:
        x = torch.tensor([ids])
        router_idx.clear()
        out = ref(x, use_cache=False, output_hidden_states=True)
        last = out.logits[0, -1].float()
        topk = [router_idx[li] for li in range(cfg.num_hidden_layers)]
        hidden = [h[0].tolist() for h in out.hidden_states] if len(ids) <= 10 else None
        vl_out = vl_ref(x, use_cache=False)
        vl_diff = (vl_out.logits[0, -1].float() - last).abs().max().item()
        print(f"prompt len {len(ids)}: |vl - text| logits max diff {vl_diff:.3g}", flush=True)
        assert vl_diff < 1e-4, "the two layouts disagree in transformers"
        # Greedy, prefill then decode with the cache (the path generate() takes).
        out = ref(x, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1]
        toks, step_logits = [], []
        for _ in range(16):
            step_logits.append(logits.float().tolist())
            t = int(torch.argmax(logits))
            toks.append(t)
            out = ref(torch.tensor([[t]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1]
        gen = ref.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False,
                           min_new_tokens=16, eos_token_id=None, pad_token_id=0)
        gen_toks = gen[0, len(ids):].tolist()
        print("  greedy", toks, "generate() agrees" if gen_toks == toks else f"generate() {gen_toks}", flush=True)
        entry = {"ids": ids, "last_logits": last.tolist(), "router_topk": topk,
                 "greedy": toks, "step_logits": step_logits}
        if hidden is not None:
            entry["hidden_states"] = hidden
        goldens["prompts"].append(entry)
with open(os.path.join(OUT, "goldens.json"), "w") as f:
    json.dump(goldens, f)
print("wrote", OUT, flush=True)
