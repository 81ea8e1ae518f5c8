#!/usr/bin/env python3
"""Write a Hugging Face Llama folder of random bf16 weights (config.json, sharded safetensors and
model.safetensors.index.json), for load-time measurements on machines with no network.

    scripts/make-synthetic-folder.py OUT_DIR [--shape llama3-8b|llama3.2-1b] [--shard-gb 5]

The values are N(0, 0.02) bf16 (norm weights 1), one 1 MiB random tile repeated: what is timed
is reading and converting the bytes, not their content. Python's standard library only.
"""
import argparse
import json
import os
import math
import random
import struct

SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
    "llama3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
}


def tensors(c):
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", (v, h)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (q, h)
        yield p + "self_attn.k_proj.weight", (kv, h)
        yield p + "self_attn.v_proj.weight", (kv, h)
        yield p + "self_attn.o_proj.weight", (h, q)
        yield p + "mlp.gate_proj.weight", (i, h)
        yield p + "mlp.up_proj.weight", (i, h)
        yield p + "mlp.down_proj.weight", (h, i)
    yield "model.norm.weight", (h,)
    if not c["tie_word_embeddings"]:
        yield "lm_head.weight", (v, h)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--shard-gb", type=float, default=5.0)
    a = ap.parse_args()
    c = dict(SHAPES[a.shape])
    c.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", rms_norm_eps=1e-5,
             rope_theta=500000.0, max_position_embeddings=8192, torch_dtype="bfloat16", bos_token_id=128000,
             eos_token_id=128001)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)

    rng = random.Random(0)
    bits = [struct.unpack("<I", struct.pack("<f", rng.gauss(0.0, 0.02)))[0] for _ in range(1 << 19)]
    tile = struct.pack(f"<{len(bits)}H", *(((b + 0x7FFF + ((b >> 16) & 1)) >> 16) for b in bits))  # bf16, RNE
    ones = struct.pack("<H", 0x3F80) * (1 << 16)

    shards, cur, size = [], [], 0
    for name, shape in tensors(c):
        n = math.prod(shape) * 2
        if cur and size + n > a.shard_gb * 1e9:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape))
        size += n
    shards.append(cur)

    weight_map = {}
    for k, group in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in group:
            n = math.prod(shape) * 2
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(os.path.join(a.out, fname), "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb)
            for name, shape in group:
                n = math.prod(shape) * 2
                src = ones if len(shape) == 1 else tile
                while n > 0:
                    m = min(n, len(src))
                    f.write(src[:m])
                    n -= m
        print(f"{fname}: {off / 1e9:.2f} GB", flush=True)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(math.prod(s) * 2 for _, s in tensors(c))},
                   "weight_map": weight_map}, f, indent=1)


if __name__ == "__main__":
    main()
