#!/usr/bin/env python3
"""Make tiny qwen3_moe and qwen3_next fixtures and their golden outputs with transformers.

Run on the GPU machine (torch 2.11, transformers 5.17.0, CPU float32) in
session 12 of issue 31: every "doc check" OK, exit 0; two runs wrote the
same bytes. Its outputs are tests/data/tiny-qwen3moe, tests/data/
tiny-qwen3next and tests/data/goldens/tiny-qwen3{moe,next}.json. Note:
transformers 5.17 saves qwen3_moe's expert count as "num_local_experts"
(released configs say "num_experts"); coli reads both.

Usage: make_tiny_fixture_families.py OUTDIR

Writes, under OUTDIR (laid out like tests/data/):

  tiny-qwen3moe/          Qwen3MoeForCausalLM (model_type qwen3_moe): 8 layers,
                          attention only (q/k norm, plain-w RMSNorm, full rotary,
                          no output gate), head_dim 32 != hidden/heads, 16 experts
                          top-4 with norm_topk_prob, no shared expert.
                          decoder_sparse_step 2 and mlp_only_layers [5] make
                          layers 1, 3, 7 sparse and 0, 2, 4, 5, 6 dense
                          (mlp.gate_proj / up_proj / down_proj, intermediate 96).
  tiny-qwen3next/         Qwen3NextForCausalLM (model_type qwen3_next): 8 layers,
                          3 Gated DeltaNet (fused in_proj_qkvz / in_proj_ba) + 1
                          gated attention, twice; 16 experts top-4, a shared
                          expert with its sigmoid gate; zero-centred (1 + w)
                          RMSNorm; partial rotary 0.25; an mtp.* tensor that
                          readers must ignore, as the published checkpoint has.
  goldens/tiny-qwen3moe.json, goldens/tiny-qwen3next.json
                          float32 reference outputs computed by transformers
                          from the stored bf16 weights, in the format of
                          tests/data/goldens/tiny-qwen35moe.json (see
                          scripts/make_tiny_fixture.py): per prompt (1, 10 and
                          60 tokens) "ids", "last_logits", "router_topk" (per
                          layer, per position, the top-k expert ids in
                          transformers' order; an EMPTY LIST for a dense
                          layer), "greedy" (16 tokens, prefill then cached
                          decode), "step_logits" (logits of every decode
                          step), and "hidden_states" (prompts of <= 10 tokens;
                          [0] is the embedding). Extra top-level keys:
                          "fixture", "model_type".

Both checkpoints: one model.safetensors, bf16, experts per expert
(mlp.experts.E.{gate,up,down}_proj.weight, the published layout) whatever
layout transformers saved; the rewrite must load back to the same weights or
the script keeps transformers' own layout and says so.

Conventions follow scripts/make_tiny_fixture.py: the weights are random
(seeded); norm weights are moved off their init values so a w vs (1 + w)
error cannot hide (plain-w norms get 1 + 0.2 N(0,1), zero-centred ones
0.2 N(0,1), the DeltaNet gated norm, which is plain w in both families, gets
1 + 0.2 N(0,1)); A_log, dt_bias and conv taps moved off init; embeddings
x20 (std 1.2), routers and lm_head x16 (std 0.96) so the fixture is
residual-dominated, decisively routed and peaked, i.e. not chaotic under
small weight errors. rope_theta is set off the 10000 default (1e6 for
qwen3_moe as Qwen3-30B-A3B, 1e7 for qwen3_next) so a hard-coded theta shows.

After the goldens, the script re-derives every layer (norm, token mixer,
MLP/MoE), the final norm and lm_head from the stored tensors with the
formulas of docs/design/qwen3-families.md (float64, independent of
transformers' modules; the qwen3_next DeltaNet via the row permutation of
in_proj_qkvz / in_proj_ba into the split qwen3_5_moe layout) on the 10-token
prompt and compares with transformers' own intermediate outputs:
"doc check OK/MISMATCH" lines. A mismatch leaves the
fixtures and goldens valid (transformers is the reference) but means the
note is wrong somewhere; the script then exits with status 3.
"""
import json, os, sys, shutil
import torch
import torch.nn.functional as F

OUT = sys.argv[1] if len(sys.argv) > 1 else "tiny-out"

import transformers
from transformers import (Qwen3MoeConfig, Qwen3MoeForCausalLM,
                          Qwen3NextConfig, Qwen3NextForCausalLM)
from safetensors.torch import load_file, save_file

VOCAB = 512
N_GREEDY = 16
INIT_STD = 0.06

COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    rms_norm_eps=1e-6, initializer_range=INIT_STD, max_position_embeddings=4096,
    attention_bias=False, hidden_act="silu",
    tie_word_embeddings=False, bos_token_id=None, eos_token_id=VOCAB - 1,
)

QWEN3MOE_CFG = dict(
    COMMON, num_hidden_layers=8, intermediate_size=96,
    moe_intermediate_size=32, num_experts=16, num_experts_per_tok=4, norm_topk_prob=True,
    decoder_sparse_step=2, mlp_only_layers=[5],
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
)

NEXT_LAYER_TYPES = (["linear_attention"] * 3 + ["full_attention"]) * 2
QWEN3NEXT_CFG = dict(
    COMMON, num_hidden_layers=8, intermediate_size=96,
    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4,
    moe_intermediate_size=32, shared_expert_intermediate_size=48,
    num_experts=16, num_experts_per_tok=4, norm_topk_prob=True,
    decoder_sparse_step=1, mlp_only_layers=[],
    layer_types=list(NEXT_LAYER_TYPES),
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
)

# What the note says about each family (checked below against transformers).
FAMILIES = [
    dict(name="tiny-qwen3moe", seed=1234, cls_cfg=Qwen3MoeConfig, cls=Qwen3MoeForCausalLM,
         cfg=QWEN3MOE_CFG, one_plus=False, gated_attn=False, rotary_factor=1.0,
         shared_expert=False, fused_gdn=False, sparse_layers=[1, 3, 7], extra={}),
    dict(name="tiny-qwen3next", seed=1235, cls_cfg=Qwen3NextConfig, cls=Qwen3NextForCausalLM,
         cfg=QWEN3NEXT_CFG, one_plus=True, gated_attn=True, rotary_factor=0.25,
         shared_expert=True, fused_gdn=True, sparse_layers=list(range(8)),
         extra={"mtp.fc.weight": (64, 128)}),
]

doc_failures = []


def doc_check(what, ok, detail=""):
    print(f"  doc check {'OK' if ok else 'MISMATCH'}: {what} {detail}", flush=True)
    if not ok:
        doc_failures.append(what)


def perturb(model, one_plus):
    """Move the parameters whose init hides conventions; set the trained-like scales."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.is_floating_point() and p.numel() > 1 and float(p.abs().max()) == 0.0 \
                    and not name.endswith("norm.weight"):
                # e.g. a router created with torch.zeros and not re-initialised
                print(f"  note: {name} was all zeros after init; drawing N(0, {INIT_STD})", flush=True)
                p.normal_(0.0, INIT_STD)
            if name.endswith("layernorm.weight") or name.endswith("q_norm.weight") \
                    or name.endswith("k_norm.weight") or name == "model.norm.weight":
                if one_plus:
                    p.copy_(torch.randn_like(p) * 0.2)            # zero-centred: y * (1 + w)
                else:
                    p.copy_(1.0 + torch.randn_like(p) * 0.2)      # plain: y * w
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + torch.randn_like(p) * 0.2)          # gated RMSNorm uses w
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


def split_fused(tensors, I, H):
    """Per-expert names for every fused mlp.experts.{gate_up_proj,down_proj}; others unchanged."""
    out, fused = {}, 0
    for n, t in tensors.items():
        if n.endswith("mlp.experts.gate_up_proj"):
            fused += 1
            if tuple(t.shape[1:]) != (2 * I, H):
                raise SystemExit(f"{n}: shape {tuple(t.shape)}, expected [E, {2 * I}, {H}] (gate rows then up rows)")
            pre = n[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = t[e, :I].contiguous()
                out[f"{pre}{e}.up_proj.weight"] = t[e, I:].contiguous()
        elif n.endswith("mlp.experts.down_proj"):
            fused += 1
            if tuple(t.shape[1:]) != (H, I):
                raise SystemExit(f"{n}: shape {tuple(t.shape)}, expected [E, {H}, {I}]")
            pre = n[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[n] = t
    return out, fused


def loads_back(ref, model):
    rsd = ref.state_dict()
    return all(n in rsd and torch.equal(rsd[n].float(), t.float()) for n, t in model.state_dict().items())


def print_layout(tensors, layer_ids):
    for li in layer_ids:
        pre = f"model.layers.{li}."
        names = sorted(n for n in tensors if n.startswith(pre)
                       and not any(f"experts.{e}." in n for e in range(1, 1000)))
        print(f"  layer {li} tensors:", flush=True)
        for n in names:
            print(f"    {n} {list(tensors[n].shape)}", flush=True)
    for n in sorted(tensors):
        if not n.startswith("model.layers."):
            print(f"    {n} {list(tensors[n].shape)}", flush=True)


# ---------------------------------------------------------------- references
def rms(x, w, eps, one_plus):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * ((1.0 + w) if one_plus else w)


def mlp_ref(x, W, pre):
    return (F.silu(x @ W(pre + "gate_proj.weight").T) * (x @ W(pre + "up_proj.weight").T)) @ W(pre + "down_proj.weight").T


def attn_ref(x, W, fam):
    c = fam["cfg"]
    T = x.shape[0]
    nh, nkv, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    qp = x @ W("self_attn.q_proj.weight").T
    gate = None
    if fam["gated_attn"]:
        qp = qp.view(T, nh, 2 * hd)                       # per head: [query (hd) | gate (hd)]
        gate = qp[..., hd:].reshape(T, nh * hd)
        q = qp[..., :hd]
    else:
        q = qp.view(T, nh, hd)
    k = (x @ W("self_attn.k_proj.weight").T).view(T, nkv, hd)
    v = (x @ W("self_attn.v_proj.weight").T).view(T, nkv, hd)
    q = rms(q, W("self_attn.q_norm.weight"), eps, fam["one_plus"])
    k = rms(k, W("self_attn.k_norm.weight"), eps, fam["one_plus"])
    rd = int(hd * fam["rotary_factor"])
    theta = c["rope_parameters"]["rope_theta"]
    inv = 1.0 / (theta ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
    fr = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([fr, fr], -1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]

    def rope(t):
        r, keep = t[..., :rd], t[..., rd:]
        h = rd // 2
        rot = torch.cat([-r[..., h:], r[..., :h]], -1)    # rotate_half over the first rd dims
        return torch.cat([r * cos + rot * sin, keep], -1)

    q, k = rope(q), rope(k)
    grp = nh // nkv
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    out = torch.zeros(T, nh, hd, dtype=torch.float64)
    for h in range(nh):
        s = (q[:, h] @ k[:, h // grp].T) * hd ** -0.5
        s = s.masked_fill(~causal, float("-inf"))
        out[:, h] = torch.softmax(s, -1) @ v[:, h // grp]
    o = out.reshape(T, nh * hd)
    if gate is not None:
        o = o * torch.sigmoid(gate)
    return o @ W("self_attn.o_proj.weight").T


def gdn_ref(x, W, fam):
    """qwen3_next Gated DeltaNet, via the row permutation of in_proj_qkvz / in_proj_ba
    into the split qwen3_5_moe layout, then the recurrent form."""
    c = fam["cfg"]
    T, H = x.shape
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, eps = c["linear_key_head_dim"], c["linear_value_head_dim"], c["rms_norm_eps"]
    r = nv // nk
    Wf = W("linear_attn.in_proj_qkvz.weight").view(nk, 2 * dk + 2 * r * dv, H)
    Wq = Wf[:, :dk].reshape(nk * dk, H)
    Wk = Wf[:, dk:2 * dk].reshape(nk * dk, H)
    Wv = Wf[:, 2 * dk:2 * dk + r * dv].reshape(nv * dv, H)
    Wz = Wf[:, 2 * dk + r * dv:].reshape(nv * dv, H)
    Wba = W("linear_attn.in_proj_ba.weight").view(nk, 2 * r, H)
    Wb, Wa = Wba[:, :r].reshape(nv, H), Wba[:, r:].reshape(nv, H)
    mixed = x @ torch.cat([Wq, Wk, Wv]).T                 # [T, C], channels q | k | v
    conv = W("linear_attn.conv1d.weight")[:, 0, :]        # [C, K]
    K = conv.shape[1]
    xp = torch.cat([torch.zeros(K - 1, mixed.shape[1], dtype=mixed.dtype), mixed])
    y = F.silu(torch.stack([(xp[t:t + K] * conv.T).sum(0) for t in range(T)]))
    q, k, v = y.split([nk * dk, nk * dk, nv * dv], -1)
    l2 = lambda t: t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6)
    q = l2(q.view(T, nk, dk)).repeat_interleave(r, 1) * dk ** -0.5
    k = l2(k.view(T, nk, dk)).repeat_interleave(r, 1)
    v = v.view(T, nv, dv)
    beta = torch.sigmoid(x @ Wb.T)
    g = -W("linear_attn.A_log").exp() * F.softplus(x @ Wa.T + W("linear_attn.dt_bias"))
    S = torch.zeros(nv, dk, dv, dtype=torch.float64)
    outs = []
    for t in range(T):
        S = S * g[t].exp()[:, None, None]
        delta = (v[t] - torch.einsum("hkv,hk->hv", S, k[t])) * beta[t][:, None]
        S = S + torch.einsum("hk,hv->hkv", k[t], delta)
        outs.append(torch.einsum("hkv,hk->hv", S, q[t]))
    o = torch.stack(outs)
    z = (x @ Wz.T).view(T, nv, dv)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * W("linear_attn.norm.weight") * F.silu(z)
    return o.reshape(T, nv * dv) @ W("linear_attn.out_proj.weight").T


def moe_ref(x, W, fam):
    c = fam["cfg"]
    k = c["num_experts_per_tok"]
    logits = x @ W("mlp.gate.weight").T
    srt = logits.sort(-1, descending=True).values
    margin = float((srt[:, k - 1] - srt[:, k]).min())
    p = torch.softmax(logits, -1)
    w, idx = torch.topk(p, k, -1)
    if c["norm_topk_prob"]:
        w = w / w.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(k):
            out[t] += w[t, j] * mlp_ref(x[t:t + 1], W, f"mlp.experts.{int(idx[t, j])}.")[0]
    if fam["shared_expert"]:
        out = out + torch.sigmoid(x @ W("mlp.shared_expert_gate.weight").T) * mlp_ref(x, W, "mlp.shared_expert.")
    return out, margin


def close(a, b, tol=2e-4):
    d = float((a - b).abs().max())
    scale = max(1e-6, float(b.abs().max()))
    return d / scale < tol, f"(max |diff| {d:.3g}, max |ref| {scale:.3g})"


def check_doc(fam, ref, tensors, ids):
    c = fam["cfg"]
    pt = split_fused(tensors, c["moe_intermediate_size"], c["hidden_size"])[0]
    print(f"{fam['name']}: checking the note's formulas against transformers", flush=True)
    layers = ref.model.layers
    sparse = [i for i, l in enumerate(layers) if hasattr(l.mlp, "experts")]
    doc_check("sparse layers", sparse == fam["sparse_layers"], f"(transformers: {sparse}, note: {fam['sparse_layers']})")
    if fam["fused_gdn"]:
        doc_check("layer_types", list(ref.config.layer_types) == NEXT_LAYER_TYPES
                  and NEXT_LAYER_TYPES == ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                           for i in range(8)], f"({list(ref.config.layer_types)})")
    H, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    full = next(i for i, l in enumerate(layers) if hasattr(l, "self_attn"))
    qshape = list(pt[f"model.layers.{full}.self_attn.q_proj.weight"].shape)
    doc_check("q_proj shape", qshape == [(2 if fam["gated_attn"] else 1) * nh * hd, H], str(qshape))
    if fam["fused_gdn"]:
        nk, nv, dk, dv = (c["linear_num_key_heads"], c["linear_num_value_heads"],
                          c["linear_key_head_dim"], c["linear_value_head_dim"])
        doc_check("in_proj_qkvz shape", list(pt["model.layers.0.linear_attn.in_proj_qkvz.weight"].shape)
                  == [2 * nk * dk + 2 * nv * dv, H])
        doc_check("in_proj_ba shape", list(pt["model.layers.0.linear_attn.in_proj_ba.weight"].shape) == [2 * nv, H])
        doc_check("conv1d shape", list(pt["model.layers.0.linear_attn.conv1d.weight"].shape)
                  == [2 * nk * dk + nv * dv, 1, c["linear_conv_kernel_dim"]])

    cap, handles = {}, []

    def grab(key):
        def hook(mod, args, kwargs, out):
            xin = kwargs.get("hidden_states", args[0] if args else None)
            o = out[0] if isinstance(out, (tuple, list)) else out
            cap[key] = (xin.detach().double()[0], o.detach().double()[0])
        return hook

    for li, layer in enumerate(layers):
        handles.append(layer.input_layernorm.register_forward_hook(grab((li, "norm")), with_kwargs=True))
        mixer = layer.self_attn if hasattr(layer, "self_attn") else layer.linear_attn
        handles.append(mixer.register_forward_hook(grab((li, "mixer")), with_kwargs=True))
        handles.append(layer.mlp.register_forward_hook(grab((li, "mlp")), with_kwargs=True))
    handles.append(ref.model.norm.register_forward_hook(grab(("final", "norm")), with_kwargs=True))
    with torch.no_grad():
        out = ref(torch.tensor([ids]), use_cache=False)
    for h in handles:
        h.remove()

    eps = c["rms_norm_eps"]
    min_margin = float("inf")
    for li, layer in enumerate(layers):
        W = lambda n, li=li: pt[f"model.layers.{li}.{n}"].double()
        xin, xo = cap[(li, "norm")]
        ok, d = close(rms(xin, W("input_layernorm.weight"), eps, fam["one_plus"]), xo)
        doc_check(f"layer {li} input_layernorm ({'1 + w' if fam['one_plus'] else 'w'})", ok, d)
        xin, xo = cap[(li, "mixer")]
        if hasattr(layer, "self_attn"):
            ok, d = close(attn_ref(xin, W, fam), xo)
            doc_check(f"layer {li} attention", ok, d)
        else:
            ok, d = close(gdn_ref(xin, W, fam), xo)
            doc_check(f"layer {li} gated deltanet (fused qkvz/ba permuted to the split layout)", ok, d)
        xin, xo = cap[(li, "mlp")]
        if li in fam["sparse_layers"]:
            y, margin = moe_ref(xin, W, fam)
            min_margin = min(min_margin, margin)
            ok, d = close(y, xo)
            doc_check(f"layer {li} moe{' + shared expert' if fam['shared_expert'] else ''}", ok, d)
        else:
            ok, d = close(mlp_ref(xin, W, "mlp."), xo)
            doc_check(f"layer {li} dense mlp", ok, d)
    xin, xo = cap[("final", "norm")]
    ok, d = close(rms(xin, pt["model.norm.weight"].double(), eps, fam["one_plus"]), xo)
    doc_check("final norm", ok, d)
    ok, d = close(xo @ pt["lm_head.weight"].double().T, out.logits[0].double())
    doc_check("lm_head", ok, d)
    print(f"  smallest router logit gap between the k-th and (k+1)-th expert: {min_margin:.3g}", flush=True)


# ---------------------------------------------------------------- one family
def make(fam):
    name, c = fam["name"], fam["cfg"]
    print(f"== {name}", flush=True)
    torch.manual_seed(fam["seed"])
    cfg = fam["cls_cfg"](**c)
    model = fam["cls"](cfg).eval()
    if hasattr(cfg, "layer_types"):
        print("  layer_types", cfg.layer_types, flush=True)
    print("  sparse layers", [i for i, l in enumerate(model.model.layers) if hasattr(l.mlp, "experts")], flush=True)
    perturb(model, fam["one_plus"])
    model = model.to(torch.bfloat16)

    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d)
    print("  saved", sorted(os.listdir(d)), flush=True)
    st_path = os.path.join(d, "model.safetensors")
    if not os.path.exists(st_path):
        raise SystemExit(f"{d}: expected one model.safetensors, found {sorted(os.listdir(d))}")
    saved = load_file(st_path)
    print("  expert names as transformers saved them:", [n for n in sorted(saved) if "experts" in n][:4], flush=True)
    extra = {n: torch.randn(*shape).to(torch.bfloat16) for n, shape in fam["extra"].items()}
    per_expert, fused = split_fused(saved, c["moe_intermediate_size"], c["hidden_size"])
    print(f"  {'split ' + str(fused) + ' fused tensors' if fused else 'already per expert'}", flush=True)
    save_file({**per_expert, **extra}, st_path, metadata={"format": "pt"})

    ref = fam["cls"].from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    if loads_back(ref, model):
        print("  per-expert layout loads back exactly", flush=True)
        stored = {**per_expert, **extra}
    else:
        print("  WARNING: transformers does not load per-expert names; keeping its own layout", flush=True)
        save_file({**saved, **extra}, st_path, metadata={"format": "pt"})
        ref = fam["cls"].from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        assert loads_back(ref, model)
        stored = {**saved, **extra}
    print_layout(split_fused(stored, c["moe_intermediate_size"], c["hidden_size"])[0],
                 sorted({0, fam["sparse_layers"][0],
                         next(i for i, l in enumerate(ref.model.layers) if hasattr(l, "self_attn"))}))

    # Goldens.
    k = c["num_experts_per_tok"]
    router_idx, hooks = {}, []
    for li, layer in enumerate(ref.model.layers):
        if not hasattr(layer.mlp, "gate") or not hasattr(layer.mlp, "experts"):
            continue                                      # dense layer: no router

        def hook(mod, inp, out, li=li):
            if isinstance(out, (tuple, list)):
                idx = [o for o in out if torch.is_tensor(o) and not torch.is_floating_point(o)][-1]
            else:                                         # a plain linear router: logits
                idx = torch.topk(torch.softmax(out.float(), -1), k, -1).indices
            router_idx[li] = idx.reshape(-1, k).detach().cpu().tolist()
        hooks.append(layer.mlp.gate.register_forward_hook(hook))

    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (1, 10, 60)]
    goldens = {"transformers": transformers.__version__, "torch": torch.__version__,
               "dtype": "float32 from stored bf16", "n_greedy": N_GREEDY,
               "fixture": name, "model_type": cfg.model_type, "prompts": []}
    n_layers = c["num_hidden_layers"]
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            router_idx.clear()
            out = ref(x, use_cache=False, output_hidden_states=True)
            last = out.logits[0, -1].float()
            topk = [router_idx.get(li, []) for li in range(n_layers)]
            hidden = [h[0].tolist() for h in out.hidden_states] if len(ids) <= 10 else None
            # Greedy, prefill then decode with the cache (the path generate() takes).
            out = ref(x, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1]
            d0 = (logits.float() - last).abs().max().item()
            print(f"  prompt len {len(ids)}: |cached prefill - uncached| logits max diff {d0:.3g}", flush=True)
            toks, step_logits = [], []
            for _ in range(N_GREEDY):
                step_logits.append(logits.float().tolist())
                t = int(torch.argmax(logits))
                toks.append(t)
                out = ref(torch.tensor([[t]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1]
            gen = ref.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=N_GREEDY, do_sample=False,
                               min_new_tokens=N_GREEDY, eos_token_id=None, pad_token_id=0)
            gen_toks = gen[0, len(ids):].tolist()
            print("  greedy", toks, "generate() agrees" if gen_toks == toks else f"generate() {gen_toks}", flush=True)
            entry = {"ids": ids, "last_logits": last.tolist(), "router_topk": topk,
                     "greedy": toks, "step_logits": step_logits}
            if hidden is not None:
                entry["hidden_states"] = hidden
            goldens["prompts"].append(entry)
    for h in hooks:
        h.remove()
    gdir = os.path.join(OUT, "goldens")
    os.makedirs(gdir, exist_ok=True)
    with open(os.path.join(gdir, name + ".json"), "w") as f:
        json.dump(goldens, f)
    print("  wrote", os.path.join(gdir, name + ".json"), flush=True)

    check_doc(fam, ref, stored, prompts[1])


os.makedirs(OUT, exist_ok=True)
for fam in FAMILIES:
    make(fam)
print("wrote", OUT, flush=True)
if doc_failures:
    print(f"{len(doc_failures)} doc check(s) MISMATCHED (fixtures and goldens are still transformers' own):",
          doc_failures, flush=True)
    sys.exit(3)
print("all doc checks OK", flush=True)
