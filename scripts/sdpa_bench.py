#!/usr/bin/env python3
"""Yardstick for nf4flash's prefill attention kernels: time PyTorch's
torch.nn.functional.scaled_dot_product_attention (is_causal=True, enable_gqa=True, bf16) on the
Llama-3-8B layer shape (q [1,32,seq,128], k/v [1,8,seq,128]) or, with --shape gemma2, Gemma-2-9B's
(q [1,16,seq,256], k/v [1,8,seq,256]; SDPA has no soft-capping) with each SDPA backend forced in turn
(FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION) and with torch's default choice.
CUDA events, warm-up, median of >= 20 calls. FLOP convention as `nf4flash-kernel-bench`:
4 * seq^2 / 2 * head_dim * n_heads (causal). PyTorch runs only here (GPU machine), never in nf4flash.

usage: python3 scripts/sdpa_bench.py [--shape llama3|gemma2] [--seq 4096 16384] [--iters 20] [--json out.json]
"""
import argparse
import json
import statistics
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default="")
    ap.add_argument("--shape", choices=["llama3", "gemma2"], default="llama3")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = torch.device("cuda")
    nh, nkv, hd = (32, 8, 128) if args.shape == "llama3" else (16, 8, 256)
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(),
           "shape": {"name": args.shape, "n_heads": nh, "n_kv_heads": nkv, "head_dim": hd},
           "dtype": "bf16", "causal": True, "flop_convention": "4 * seq^2 / 2 * head_dim * n_heads (causal)",
           "iters": max(20, args.iters), "results": []}
    backends = [("default", None), ("FLASH_ATTENTION", SDPBackend.FLASH_ATTENTION),
                ("EFFICIENT_ATTENTION", SDPBackend.EFFICIENT_ATTENTION),
                ("CUDNN_ATTENTION", getattr(SDPBackend, "CUDNN_ATTENTION", None))]
    print(f"{out['gpu']}  torch {torch.__version__}")
    print(f"{'backend':<22}{'seq':>7}{'ms':>10}{'TFLOP/s':>10}")
    for seq in args.seq:
        g = torch.Generator(device=dev).manual_seed(seq)
        q = torch.randn(1, nh, seq, hd, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, nkv, seq, hd, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, nkv, seq, hd, device=dev, dtype=torch.bfloat16, generator=g)
        flops = 4.0 * seq * seq / 2 * hd * nh
        for name, be in backends:
            row = {"backend": name, "seq": seq, "flops": flops}
            try:
                if name == "CUDNN_ATTENTION" and be is None:
                    raise RuntimeError("this torch has no SDPBackend.CUDNN_ATTENTION")

                def call():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

                ctx = sdpa_kernel([be]) if be is not None else None
                if ctx is not None:
                    ctx.__enter__()
                try:
                    ref = call()  # warm-up (and the error, if this backend cannot serve it)
                    for _ in range(3):
                        call()
                    torch.cuda.synchronize()
                    times = []
                    for _ in range(out["iters"]):
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        call()
                        e.record()
                        e.synchronize()
                        times.append(s.elapsed_time(e))
                finally:
                    if ctx is not None:
                        ctx.__exit__(None, None, None)
                ms = statistics.median(times)
                row.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12, ok=True)
                if name == "default":
                    # which backend the default picked: the forced one with the closest time (profiler-free guess)
                    row["note"] = "torch's own choice; compare with the forced rows"
                del ref
                print(f"{name:<22}{seq:>7}{ms:>10.3f}{row['tflops']:>10.1f}")
            except Exception as ex:  # noqa: BLE001 - report and go on with the next backend
                row.update(ok=False, error=str(ex).splitlines()[0][:300])
                print(f"{name:<22}{seq:>7}{'n/a':>10}{'':>10}  ({row['error'][:100]})")
            out["results"].append(row)
        del q, k, v
        torch.cuda.empty_cache()
    # name the default's backend by the profiler's kernel names, when it can tell
    try:
        from torch.profiler import profile, ProfilerActivity
        seq = args.seq[0]
        q = torch.randn(1, nh, seq, hd, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, nkv, seq, hd, device=dev, dtype=torch.bfloat16)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
            torch.cuda.synchronize()
        names = sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})
        out["default_kernels"] = names[:10]
        print("default backend kernels:", "; ".join(n[:80] for n in names[:4]))
    except Exception as ex:  # noqa: BLE001
        out["default_kernels_error"] = str(ex)[:200]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
