#!/usr/bin/env python3
"""Tiny random-weight models of the families beyond Llama/Qwen2 (and RoPE scalings) with goldens.

    python3 scripts/make-family-fixtures.py OUT_DIR [--only NAME ...]

Run where torch and transformers are installed (the GPU machine). For each model it writes
OUT_DIR/NAME/ (save_pretrained, bf16 safetensors, config.json as transformers writes it) and
OUT_DIR/NAME.golden.safetensors in the layout of the existing conformance goldens (the repo keeps
them as tests/fixtures/models-families.tar.xz, for llama-rope-* models-rope.tar.xz, and for
mistral-hd32 and llama-hd80 models-headdims.tar.xz):

    tokens_{0,1,2}             int32, 7 / 33 / 200 random ids
    nextlogprob_{V}_{i}        log-softmax at position t of token t+1 (n-1 values)
    logits_{V}_{i}             all rows of sequence 0, the last 4 rows of sequences 1 and 2
    greedy_{V}_from_1          24 greedy tokens continuing tokens_1

V = f32 (weights upcast to float32) and bf16 (bf16 weights and compute), both eager attention on
the GPU when there is one. Weights: N(0, 0.05) for matrices and embeddings, norm weights 1 +
0.2 N(0, 1) (Gemma's (1 + w) norms: 0.2 N(0, 1)), biases 0.1 N(0, 1); the lm_head (or the tied
table) is scaled so that the logits' std over tokens_2 is about 0.6. A summary line per model
(tensor names, logits std, bf16-vs-f32 distance) goes to stdout.
"""
import argparse
import json
import math
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

VOCAB = 512


def families():
    t = transformers
    common = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    out = {}
    # Gemma 2: head_dim 256 (> hidden / heads), soft-capping, query_pre_attn_scalar, sliding window
    # on every other layer (layer 0 sliding), GeGLU tanh, (1 + w) norms before and after each block
    out["gemma2-hd256-softcap"] = (t.Gemma2Config, dict(
        common, num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=64,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=16,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, rope_theta=10000.0))
    # Gemma 3 text: q/k norms, sliding/global pattern, local rope base beside the global one
    out["gemma3-qknorm-window"] = (t.Gemma3TextConfig, dict(
        common, num_attention_heads=4, num_key_value_heads=2, head_dim=64, query_pre_attn_scalar=64,
        sliding_window=16, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        layer_types=["sliding_attention", "full_attention"]))
    # Phi-3: fused qkv_proj and gate_up_proj, head_dim 96, LongRoPE
    hd = 96
    out["phi3-longrope-hd96"] = (t.Phi3Config, dict(
        common, hidden_size=192, num_attention_heads=2, num_key_value_heads=2,
        original_max_position_embeddings=64, rope_theta=10000.0,
        rope_scaling=dict(type="longrope", short_factor=[1.0 + 0.05 * i for i in range(hd // 2)],
                          long_factor=[1.0 + 0.5 * i for i in range(hd // 2)])))
    # Mixtral: 4 experts, top-2
    out["mixtral-moe"] = (t.MixtralConfig, dict(
        common, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        intermediate_size=128, rope_theta=1000000.0))
    # Qwen2-MoE: shared expert with its sigmoid gate, q/k/v bias
    out["qwen2moe-shared"] = (t.Qwen2MoeConfig, dict(
        common, num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=64, shared_expert_intermediate_size=128, decoder_sparse_step=1,
        norm_topk_prob=False, rope_theta=1000000.0))
    # Qwen3-MoE: q/k norms, normalized top-k weights
    out["qwen3moe-topk"] = (t.Qwen3MoeConfig, dict(
        common, num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1, norm_topk_prob=True,
        rope_theta=1000000.0))
    # RoPE scalings on the Llama decoder: YaRN (original context 64, factor 4) and dynamic NTK
    # (max_position_embeddings 64: the 200-token sequence rescales)
    out["llama-rope-yarn"] = (t.LlamaConfig, dict(
        common, num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
        rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64)))
    # head dims the other fixtures lack: 32 (a Mistral with 4 heads of 32) and 80 (4 heads of 80)
    out["mistral-hd32"] = (t.MistralConfig, dict(
        common, num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=None,
        rope_theta=10000.0))
    out["llama-hd80"] = (t.LlamaConfig, dict(
        common, hidden_size=320, num_attention_heads=4, num_key_value_heads=2, head_dim=80, rope_theta=10000.0))
    out["llama-rope-dynamic"] = (t.LlamaConfig, dict(
        common, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rope_theta=10000.0,
        rope_scaling=dict(rope_type="dynamic", factor=2.0)))
    return out


def init_weights(model, gemma_norms):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:  # norm weights
                base = 0.0 if gemma_norms else 1.0
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))


def head_weight(model):
    return model.get_output_embeddings().weight


def run(model, tokens, dev):
    with torch.no_grad():
        return model(torch.tensor([tokens], device=dev)).logits[0].float().cpu()


def greedy(model, tokens, dev, n=24):
    with torch.no_grad():
        out = model.generate(torch.tensor([tokens], device=dev), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(tokens):].cpu().to(torch.int32)


def rel(a, b):
    return float((a - b).norm() / b.norm())


def make(name, cls, kw, out_dir, dev):
    cfg = cls(**kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    init_weights(model, name.startswith("gemma"))
    g = torch.Generator().manual_seed(1)
    toks = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (7, 33, 200)]
    model.to(dev).eval()
    # scale the output projection for logits with std ~0.6 (the tied table scales the input too)
    std = run(model, toks[2], dev).std().item()
    with torch.no_grad():
        head_weight(model).mul_(0.6 / max(std, 1e-6))
    model.to(torch.bfloat16).save_pretrained(os.path.join(out_dir, name), safe_serialization=True)
    del model

    # each variant loaded from the saved folder as a user would (a dtype round trip of the live
    # model would also round its non-persistent buffers, e.g. the rotary inv_freq, to bf16)
    gold = {}
    for v, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.join(out_dir, name), dtype=dtype, attn_implementation="eager").to(dev).eval()
        for i, t in enumerate(toks):
            lg = run(model, t, dev)
            lp = torch.log_softmax(lg, dim=-1)
            gold[f"nextlogprob_{v}_{i}"] = lp[:-1].gather(1, torch.tensor(t[1:])[:, None])[:, 0].contiguous()
            gold[f"logits_{v}_{i}"] = (lg if i == 0 else lg[-4:]).contiguous()
        gold[f"greedy_{v}_from_1"] = greedy(model, toks[1], dev)
    for i, t in enumerate(toks):
        gold[f"tokens_{i}"] = torch.tensor(t, dtype=torch.int32)
    save_file(gold, os.path.join(out_dir, name + ".golden.safetensors"),
              metadata={"transformers": transformers.__version__, "torch": torch.__version__})
    from safetensors import safe_open
    names = []
    for f in sorted(os.listdir(os.path.join(out_dir, name))):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(out_dir, name, f), "pt") as h:
                names += list(h.keys())
    layer0 = sorted(n for n in names if ".layers.0." in n)
    print(json.dumps({"model": name, "logits_std": round(gold["logits_f32_2"].std().item(), 3),
                      "bf16_vs_f32_logits_0": round(rel(gold["logits_bf16_0"], gold["logits_f32_0"]), 5),
                      "tensors": len(names), "layer0": layer0,
                      "other": sorted(n for n in names if ".layers." not in n)}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {dev}", flush=True)
    bad = 0
    for name, (cls, kw) in families().items():
        if a.only and name not in a.only:
            continue
        try:
            make(name, cls, kw, a.out, dev)
        except Exception as e:  # report and go on with the other families
            bad += 1
            print(json.dumps({"model": name, "error": f"{type(e).__name__}: {e}"}), flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
