#!/usr/bin/env python3
"""Rewrite a sharded HF checkpoint's per-expert tensors into the fused layout.

  mlp.experts.E.{gate,up}_proj.weight [I,H]  ->  mlp.experts.gate_up_proj [E, 2I, H]
  mlp.experts.E.down_proj.weight      [H,I]  ->  mlp.experts.down_proj    [E, H, I]

This is the layout transformers (>= 5) keeps in memory and that some published
checkpoints store. Only bytes are moved (python stdlib, no torch), so the
weights stay bit-identical and the goldens of the per-expert layout apply.
Usage: fuse_experts.py CHECKPOINT_DIR   (rewrites it in place)
"""
import json, os, re, struct, sys
from collections import OrderedDict

def read_st(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    hdr = json.loads(data[8:8 + n])
    meta = hdr.pop("__metadata__", None)
    base = 8 + n
    out = OrderedDict()
    for name, info in hdr.items():
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[base + b: base + e])
    return out, meta

def write_st(path, tensors, meta):
    hdr, off, blobs = {}, 0, []
    for name, (dt, shape, blob) in tensors.items():
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(blob)]}
        off += len(blob)
        blobs.append(blob)
    if meta:
        hdr["__metadata__"] = meta
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)

def main(d):
    idx_path = os.path.join(d, "model.safetensors.index.json")
    idx = json.load(open(idx_path))
    files = sorted(set(idx["weight_map"].values()))
    shards = {f: read_st(os.path.join(d, f)) for f in files}
    pat = re.compile(r"^(.*mlp\.experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
    groups = {}
    for f, (tens, _) in shards.items():
        for name in list(tens):
            m = pat.match(name)
            if m:
                groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = (f, tens.pop(name))
    for pre, parts in groups.items():
        E = 1 + max(e for e, _ in parts)
        f0 = parts[(0, "gate_proj")][0]
        dt, (I, H), _ = parts[(0, "gate_proj")][1]
        gu = b"".join(parts[(e, "gate_proj")][1][2] + parts[(e, "up_proj")][1][2] for e in range(E))
        dn = b"".join(parts[(e, "down_proj")][1][2] for e in range(E))
        shards[f0][0][pre + "gate_up_proj"] = (dt, [E, 2 * I, H], gu)
        shards[f0][0][pre + "down_proj"] = (dt, [E, H, I], dn)
    wm = {}
    for f, (tens, meta) in shards.items():
        write_st(os.path.join(d, f), tens, meta)
        for name in tens:
            wm[name] = f
    idx["weight_map"] = dict(sorted(wm.items()))
    with open(idx_path, "w") as fh:
        json.dump(idx, fh, indent=2)
    print(f"fused {len(groups)} expert groups in {d}")

if __name__ == "__main__":
    main(sys.argv[1])
