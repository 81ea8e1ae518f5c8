#!/usr/bin/env python3
"""NF4/FP4 goldens for a conformance model without bitsandbytes: transformers on the weights as a
bitsandbytes 4-bit checkpoint dequantizes them.

    python3 scripts/make-quant-goldens.py MODEL_DIR BNB_DIR GOLDEN VARIANT

MODEL_DIR: the bf16 fixture folder; BNB_DIR: the same model written by `nf4flash quantize` (the
bitsandbytes layout: packed codes, absmax, nested absmax for double quant, quant_state JSON);
GOLDEN: MODEL.golden.safetensors, whose tokens_{0,1,2} are run and to which nextlogprob_{VARIANT}_i
and logits_{VARIANT}_i are added (VARIANT nf4 or fp4, layout as make-family-fixtures.py writes).

Each 4-bit weight is dequantized as bitsandbytes does before its bf16 matmul (dequantize_4bit with
compute dtype bf16): the absmax of double quant decoded first (nested code * nested absmax + offset,
f32), then code[nibble] * absmax in f32, rounded to bf16; the high nibble is the even element. The
dequantized folder is loaded with transformers in bf16 (eager attention), which is what
transformers + bitsandbytes compute: the 4-bit linears as bf16 matmuls of those weights, every
other tensor as stored. Run where torch and transformers are installed (the GPU machine).
"""
import json
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file


def dequantize(t, name):
    """t: every tensor of the checkpoint; returns the bf16 weight `name` (a 4-bit packed tensor)."""
    qs_key = next(k for k in t if k.startswith(name + ".quant_state.bitsandbytes__"))
    st = json.loads(bytes(t[qs_key].tolist()).decode())
    shape, bs = st["shape"], st["blocksize"]
    qmap = t[name + ".quant_map"].float()
    if name + ".nested_absmax" in t:
        nb = st["nested_blocksize"]
        codes8 = t[name + ".absmax"].long()
        nested = t[name + ".nested_absmax"].float()
        nqmap = t[name + ".nested_quant_map"].float()
        idx = torch.arange(codes8.numel()) // nb
        absmax = (nqmap[codes8] * nested[idx]) + torch.tensor(st["nested_offset"], dtype=torch.float32)
    else:
        absmax = t[name + ".absmax"].float()
    packed = t[name].flatten()
    n = 1
    for d in shape:
        n *= d
    nib = torch.stack([packed >> 4, packed & 15], dim=1).flatten()[:n].long()
    vals = qmap[nib] * absmax[torch.arange(n) // bs]
    return vals.to(torch.bfloat16).reshape(shape)


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    model_dir, bnb_dir, golden, variant = sys.argv[1:]
    t = {}
    for f in sorted(os.listdir(bnb_dir)):
        if f.endswith(".safetensors"):
            t.update(load_file(os.path.join(bnb_dir, f)))
    quantized = [k for k in t if any(j.startswith(k + ".quant_state.bitsandbytes__") for j in t)]
    aux = (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", ".quant_state.")
    sd = {k: v for k, v in t.items() if k not in quantized and not any(a in k for a in aux)}
    for k in quantized:
        sd[k] = dequantize(t, k)
    gold = load_file(golden)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        for f in os.listdir(model_dir):  # config, generation config (not the weights)
            if not f.endswith(".safetensors"):
                shutil.copy(os.path.join(model_dir, f), tmp)
        save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(tmp, "model.safetensors"),
                  metadata={"format": "pt"})
        model = transformers.AutoModelForCausalLM.from_pretrained(
            tmp, dtype=torch.bfloat16, attn_implementation="eager").to(dev).eval()
        for i in range(3):
            toks = gold[f"tokens_{i}"].tolist()
            with torch.no_grad():
                lg = model(torch.tensor([toks], device=dev)).logits[0].float().cpu()
            lp = torch.log_softmax(lg, dim=-1)
            gold[f"nextlogprob_{variant}_{i}"] = lp[:-1].gather(1, torch.tensor(toks[1:])[:, None])[:, 0].contiguous()
            gold[f"logits_{variant}_{i}"] = (lg if i == 0 else lg[-4:]).contiguous()
    save_file(gold, golden, metadata={"transformers": transformers.__version__, "torch": torch.__version__})
    d = float((gold[f"logits_{variant}_1"] - gold["logits_f32_1"]).norm() / gold["logits_f32_1"].norm())
    print(json.dumps({"golden": os.path.basename(golden), "variant": variant, "quantized_tensors": len(quantized),
                      f"{variant}_vs_f32_logits_1": round(d, 4)}), flush=True)


if __name__ == "__main__":
    main()
