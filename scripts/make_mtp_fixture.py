#!/usr/bin/env python3
"""The MTP fixture: an MTP module for tests/data/tiny-qwen35moe-text and its
reference outputs, computed in torch from the module's published structure.

Run on a machine whose python has torch + transformers (>= 5, which
implements qwen3_5_moe), from the repository root:

    python3 scripts/make_mtp_fixture.py tests/data

Writes
  tests/data/tiny-qwen35moe-mtp/mtp.safetensors   the mtp.* tensors (bf16,
      seeded): fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm and one
      full-attention decoder layer with routed experts (transformers' fused
      layout, as the released checkpoints' converters write them) and a
      shared expert
  tests/data/goldens/tiny-qwen35moe-mtp.json      per golden prompt: the ids,
      the token after them (the main model's greedy choice), the MTP layer's
      logits at every row, its first draft, and the logits of the chained
      second draft

The checkpoint the tests load is tiny-qwen35moe-text with mtp.safetensors
added and mtp_num_hidden_layers 1 in its config (tests/mtp_test.cpp builds
it), so the main weights stay those of the transformers fixture.

The MTP forward, as vLLM's Qwen3_5MultiTokenPredictor (and the Qwen3-Next
one) runs it, row q reading the token at position q + 1 and the main
model's final-normed hidden state at position q:
    x = fc(cat(pre_fc_norm_embedding(embed(t)), pre_fc_norm_hidden(h)))
    x = decoder_layer(x)              (full attention at positions 0..)
    logits = lm_head(norm(x))
The norms are Qwen3.5's zero-centred RMSNorm (1 + w); the decoder layer is
transformers' own Qwen3_5MoeDecoderLayer built for layer index
num_hidden_layers with layer type full_attention; embed_tokens and lm_head
are the main model's. A chained draft reads the MTP's own output row
(after its norm) as the hidden state.
"""
import copy, json, os, sys
import torch
import transformers
from transformers import Qwen3_5MoeForCausalLM
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as M
from safetensors.torch import save_file

DATA = sys.argv[1] if len(sys.argv) > 1 else "tests/data"
BASE = os.path.join(DATA, "tiny-qwen35moe-text")
OUT = os.path.join(DATA, "tiny-qwen35moe-mtp")
torch.manual_seed(3333)

ref = Qwen3_5MoeForCausalLM.from_pretrained(BASE, dtype=torch.float32, attn_implementation="eager").eval()
cfg = ref.config
L, H = cfg.num_hidden_layers, cfg.hidden_size

# The MTP decoder layer: transformers' class, one layer past the model's.
cfg2 = copy.deepcopy(cfg)
cfg2.num_hidden_layers = L + 1
cfg2.layer_types = list(cfg.layer_types) + ["full_attention"]
layer = M.Qwen3_5MoeDecoderLayer(cfg2, L).eval()
norm_cls = M.Qwen3_5MoeRMSNorm
pre_e, pre_h, post = (norm_cls(H, eps=cfg.rms_norm_eps) for _ in range(3))
fc = torch.nn.Linear(2 * H, H, bias=False)

# Trained-like scales, as the main fixture's (scripts/make_tiny_fixture.py):
# norms away from their init so that (w) against (1 + w) cannot hide, a
# decisive router, projections at 1/sqrt(fan-in).
with torch.no_grad():
    for name, p in layer.named_parameters():
        if name.endswith("layernorm.weight") or name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
            p.copy_(torch.randn_like(p) * 0.2)
        elif name.endswith("mlp.gate.weight"):
            p.copy_(torch.randn_like(p) * 0.96)
        else:
            p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    for n in (pre_e, pre_h, post):
        n.weight.copy_(torch.randn(H) * 0.2)
    fc.weight.copy_(torch.randn(H, 2 * H) / (2 * H) ** 0.5)
# bf16 as stored, float32 to compute.
for mod in (layer, pre_e, pre_h, post, fc):
    mod.to(torch.bfloat16).to(torch.float32)

tensors = {"mtp.fc.weight": fc.weight, "mtp.pre_fc_norm_embedding.weight": pre_e.weight,
           "mtp.pre_fc_norm_hidden.weight": pre_h.weight, "mtp.norm.weight": post.weight}
for name, p in layer.state_dict().items():
    tensors["mtp.layers.0." + name] = p
os.makedirs(OUT, exist_ok=True)
save_file({k: v.detach().to(torch.bfloat16).contiguous() for k, v in tensors.items()},
          os.path.join(OUT, "mtp.safetensors"), metadata={"format": "pt"})
print("mtp tensors:", sorted(tensors)[:8], "...", len(tensors), flush=True)


def rotary(x, pos):
    try:
        return ref.model.rotary_emb(x, pos)
    except Exception:  # an mrope implementation that wants [3, batch, T]
        return ref.model.rotary_emb(x, pos[None].expand(3, pos.shape[0], -1))


def mtp_rows(tokens, hidden):
    """Rows q = 0..T-1 at positions 0..T-1: (tokens[q], hidden[q])."""
    T = len(tokens)
    e = ref.model.embed_tokens(torch.tensor([tokens]))
    x = fc(torch.cat([pre_e(e), pre_h(hidden[None])], dim=-1))
    pos = torch.arange(T)[None]
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    out = layer(x, position_embeddings=rotary(x, pos), attention_mask=mask, position_ids=pos)
    if isinstance(out, tuple):
        out = out[0]
    y = post(out)[0]
    return ref.lm_head(y), y


goldens = {"transformers": transformers.__version__, "torch": torch.__version__,
           "dtype": "float32 from stored bf16", "prompts": []}
main = json.load(open(os.path.join(DATA, "goldens", "tiny-qwen35moe.json")))
with torch.no_grad():
    for p in main["prompts"]:
        ids = p["ids"]
        nxt = p["greedy"][0]
        h = ref.model(torch.tensor([ids])).last_hidden_state[0]  # after the final norm
        logits, y = mtp_rows(ids[1:] + [nxt], h)
        draft = int(torch.argmax(logits[-1]))
        # The chained draft: one more row reading (draft, the MTP's own last row).
        chain, _ = mtp_rows(ids[1:] + [nxt, draft], torch.cat([h, y[-1:]], dim=0))
        goldens["prompts"].append({"ids": ids, "next": nxt, "mtp_logits": logits.tolist(), "draft": draft,
                                   "chain_logits": chain[-1].tolist()})
        print(f"prompt len {len(ids)}: next {nxt}, draft {draft}, chained {int(torch.argmax(chain[-1]))}", flush=True)
with open(os.path.join(DATA, "goldens", "tiny-qwen35moe-mtp.json"), "w") as f:
    json.dump(goldens, f)
print("wrote", OUT, flush=True)
