// kernel-bench: see kernel_bench.h. Timing: each measured kernel is captured `reps` times in one
// CUDA graph (weights rotated over enough copies that the working set is >= 4x the L2), the graph
// is replayed once to warm up, then `trials` replays are timed with CUDA events on the backend
// stream; the median per-kernel time is reported. Bytes are the minimum each kernel must move.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <functional>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernel_bench.h"
#include "backend/cuda/kernel_bench_util.h"
#include "backend/cuda/launchers.h"
#include "io/safetensors.h"

namespace nf4flash {
namespace {

using cuda::to_f32;

using namespace kbench;

}  // namespace

std::string cuda_kernel_bench(const KernelBenchOptions& o) {
  using nlohmann::json;
  CudaBackendOptions bo;
  bo.device_index = o.device;
  auto be = make_cuda_backend(bo);
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, o.device));
  json out;
  out["gpu"] = prop.name;
  out["sms"] = prop.multiProcessorCount;
  out["l2_bytes"] = prop.l2CacheSize;
  out["backend"] = be->name();
  out["reps"] = o.reps;
  out["trials"] = o.trials;
  std::mt19937 g(1234);

  // ---- device-to-device copy: bytes read + bytes written
  const size_t cbytes = size_t(1) << 31;
  auto ca = be->alloc(cbytes), cb = be->alloc(cbytes);
  CUDA_CHECK(cudaMemset(ca->data(), 1, cbytes));
  CUDA_CHECK(cudaMemset(cb->data(), 2, cbytes));
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> ct;
  for (int k = 0; k < 3 + o.trials; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    CUDA_CHECK(cudaMemcpy(cb->data(), ca->data(), cbytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
    if (k >= 3) ct.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double copy_gbs = 2.0 * cbytes / median(ct) / 1e9;
  out["copy"] = {{"bytes", cbytes}, {"seconds", median(ct)}, {"gb_per_s", copy_gbs}};
  ca.reset();
  cb.reset();
  std::printf("%-40s %10s %10s %8s\n", "kernel", "us", "GB/s", "%copy");
  std::printf("%-40s %10.1f %10.1f %8.1f\n", "d2d copy 2 GiB (read+write)", median(ct) * 1e6, copy_gbs, 100.0);

  json rows = json::array();
  auto report = [&](const std::string& name, double sec, double bytes, json extra) {
    const double gbs = bytes / sec / 1e9;
    std::printf("%-40s %10.2f %10.1f %8.1f\n", name.c_str(), sec * 1e6, gbs, 100.0 * gbs / copy_gbs);
    extra["name"] = name;
    extra["us"] = sec * 1e6;
    extra["bytes"] = bytes;
    extra["gb_per_s"] = gbs;
    extra["pct_of_copy"] = 100.0 * gbs / copy_gbs;
    rows.push_back(extra);
  };

  // ---- focused modes: the read-order rows alone (--read-patterns), decode attention over a ladder of
  //   contexts with the cache read from HBM (--attn-decode)
  if (o.read_patterns_only || o.attn_decode_only) {
    if (o.read_patterns_only) bench_read_patterns(prop.multiProcessorCount, size_t(prop.l2CacheSize), o.reps, o.trials, report);
    if (o.attn_decode_only) {
      DecodeAttnBench db;
      db.ctxs = {128, 512, 1024, 2048, 4096, 8192, 16384, 32768};
      // NF4FLASH_KB_ATTN_CTXS="512,32768" narrows the ladder (profiling runs: scripts/attn-profile.sh)
      if (std::vector<int> c = env_int_list("NF4FLASH_KB_ATTN_CTXS"); !c.empty()) {
        for (int x : c)
          NF4FLASH_CHECK(x >= 1 && x <= (1 << 20), "NF4FLASH_KB_ATTN_CTXS=", std::getenv("NF4FLASH_KB_ATTN_CTXS"),
                         ": expected contexts 1..1048576, comma-separated");
        db.ctxs = c;
      }
      // (the first four in this order: scripts/attn-profile.sh picks ncu launches by position)
      db.variants = {"simt:NF4FLASH_DECODE_KERNEL=simt",
                     "simt interleave:NF4FLASH_DECODE_KERNEL=simt,NF4FLASH_DECODE_ORDER=interleave",
                     "mma:NF4FLASH_DECODE_KERNEL=mma",
                     "mma interleave:NF4FLASH_DECODE_KERNEL=mma,NF4FLASH_DECODE_ORDER=interleave",
                     // the defaults before 2026-12-05: the one-split-at-a-time combine, 64-position slices
                     "simt kernel c64:NF4FLASH_DECODE_KERNEL=simt,NF4FLASH_ATTN_COMBINE=kernel,NF4FLASH_DECODE_MIN_CHUNK=64",
                     "simt c64:NF4FLASH_DECODE_KERNEL=simt,NF4FLASH_DECODE_MIN_CHUNK=64",
                     "mma kernel c64:NF4FLASH_DECODE_KERNEL=mma,NF4FLASH_ATTN_COMBINE=kernel,NF4FLASH_DECODE_MIN_CHUNK=64"};
      // NF4FLASH_KB_ATTN_ROTATE=0: one cache layer, `reps` launches a row (profiling: ncu flushes the
      // caches before each launch it profiles anyway, and attn-profile.sh counts launches)
      const char* rot = std::getenv("NF4FLASH_KB_ATTN_ROTATE");
      db.rotate = !(rot && std::string_view(rot) == "0");
      bench_decode_attention(*be, db, size_t(prop.l2CacheSize), o.reps, o.trials, g, report);
    }
    out["kernels"] = rows;
    return out.dump(2);
  }

  if (o.attention_only) {
    out["attention_prefill_flop_convention"] = "4 * seq^2 / 2 * head_dim * n_heads (causal)";
    out["attention_prefill"] = bench_attention_prefill(*be, std::max(5, o.trials), g);
    return out.dump(2);
  }

  // ---- 4-bit GEMV on the Llama-3-8B shapes, T = 1 (and T = 4 once); kernel variants:
  //   stream (stream-K bulk-copy, 8 warps), stream16 (16 warps), regs (register prefetch)
  std::normal_distribution<float> nd;
  auto rand_act = [&](int64_t rows, int64_t cols) {
    auto b = be->alloc(size_t(rows * cols) * 2);
    std::vector<uint16_t> h(size_t(rows * cols));
    for (auto& v : h) v = f32_to_bf16(nd(g));
    be->upload(b->data(), h.data(), h.size() * 2);
    return b;
  };
  auto copies_for = [&](int64_t bytes) { return int(std::max<int64_t>(2, (4 * int64_t(prop.l2CacheSize)) / bytes + 1)); };
  auto with_variant = [&](const char* v) {
    if (std::string(v).rfind("stream", 0) == 0) {
      setenv("NF4FLASH_GEMV_Q4", "stream", 1);
      setenv("NF4FLASH_GEMV_WARPS", std::string(v) == "stream-bulk16" ? "16" : "8", 1);
      setenv("NF4FLASH_GEMV_FEED", std::string(v).rfind("stream-bulk", 0) == 0 ? "bulk" : "regs", 1);
    } else {
      setenv("NF4FLASH_GEMV_Q4", v, 1);
    }
  };
  auto reset_variant = [] {
    unsetenv("NF4FLASH_GEMV_Q4");
    unsetenv("NF4FLASH_GEMV_WARPS");
    unsetenv("NF4FLASH_GEMV_FEED");
  };
  struct Shape { int64_t rows, cols; };
  // the grouped tile layout and the default kernel's speed-of-light ablations, on backends of their own
  GemvAltBench alt(bo, o.reps, o.trials, g, report);
  // ---- focused mode (--gemv-shape): the 4-bit GEMV alone on the given shapes and variants
  //   (for ncu: few launches, nothing else in the process's kernel list)
  if (!o.gemv_shapes.empty()) {
    std::vector<std::string> variants = o.gemv_variants;
    if (variants.empty()) variants = {"seq"};
    for (auto [R, K] : o.gemv_shapes)
      for (bool dq : {true, false}) {
        const int copies = copies_for(R * K / 2);
        std::vector<std::unique_ptr<Weight>> ws;
        for (int c = 0; c < copies; ++c) ws.push_back(be->upload_quant4(random_q4(R, K, dq, g)));
        auto xb = rand_act(1, K), yb = be->alloc(size_t(R) * 2);
        Act x = xb->as_act(DType::BF16, 1, K), y = yb->as_act(DType::BF16, 1, R);
        for (const std::string& v : variants) {
          if (v == "grouped") {  // the lean kernel on the grouped tile layout (its own backend and weights)
            alt.grouped(R, K, dq, copies, x, y, cat("gemv nf4", dq ? "-dq" : "", " ", R, "x", K, " T=1 grouped"));
            continue;
          }
          if (v == "ablate") {  // the three ablation rows (double quant only)
            if (dq) alt.ablated(ws, R, K, x, y);
            continue;
          }
          with_variant(v.rfind("seq", 0) == 0 ? "seq" : v.c_str());
          if (v.rfind("seq-", 0) == 0) setenv("NF4FLASH_GEMV_SEQ_CFG", v.c_str() + 4, 1);
          const double sec = time_graph(*be, [&](int i) { be->linear(x, *ws[size_t(i % copies)], nullptr, y); },
                                        o.reps, o.trials);
          report(cat("gemv nf4", dq ? "-dq" : "", " ", R, "x", K, " T=1 ", v), sec,
                 double(ws[0]->resident_bytes()) + (K + R) * 2.0,
                 {{"rows", R}, {"cols", K}, {"T", 1}, {"double_quant", dq}, {"copies", copies}, {"variant", v},
                  {"path", be->linear_path(*ws[0], 1)}});
          unsetenv("NF4FLASH_GEMV_SEQ_CFG");
          reset_variant();
        }
      }
    out["kernels"] = rows;
    return out.dump(2);
  }

  // ---- decode attention, Llama-3-8B layer shape (kernel_bench_attn.cu): the split kernel + combine
  //   per kernel and split order, one cache layer (ctx 512's 2 MB and 4096's 16 MB stay in L2 across
  //   the repeats), and a decode layer's whole attention (rope rows)
  {
    DecodeAttnBench db;
    db.ctxs = {512, 4096, 32768};
    db.variants = {"mma:NF4FLASH_DECODE_KERNEL=mma", "simt ring 4:NF4FLASH_DECODE_KERNEL=simt",
                   "simt ring 0:NF4FLASH_DECODE_KERNEL=simt,NF4FLASH_DECODE_RING=0",
                   "simt interleave:NF4FLASH_DECODE_KERNEL=simt,NF4FLASH_DECODE_ORDER=interleave",
                   "mma interleave:NF4FLASH_DECODE_KERNEL=mma,NF4FLASH_DECODE_ORDER=interleave"};
    db.rope_rows = true;
    bench_decode_attention(*be, db, size_t(prop.l2CacheSize), o.reps, o.trials, g, report);
  }

  // ---- read-only streaming reference at the sizes of the decode GEMVs (4-bit 4096x14336 ~ 30 MB,
  //   4096x4096 ~ 8.4 MB, 1024x4096 ~ 2.1 MB): what one kernel of that size can read, launch and
  //   ramp included (buffers rotated over >= 4x the L2)
  if (!o.attention_only && !o.prefill_linear_only) {
    auto sink = be->alloc(64);
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    for (int64_t bytes : {int64_t(30277632), int64_t(8650752), int64_t(2162688)}) {
      const int copies = copies_for(bytes);
      std::vector<std::unique_ptr<Buffer>> bufs;
      for (int c = 0; c < copies; ++c) {
        bufs.push_back(be->alloc(size_t(bytes)));
        CUDA_CHECK(cudaMemset(bufs.back()->data(), c + 1, size_t(bytes)));
      }
      CUDA_CHECK(cudaDeviceSynchronize());
      // its own stream and graph (the backend's stream is not exposed): reps launches per replay
      const double sec = time_stream_graph(
          [&](int i, cudaStream_t st) {
            read_only_kernel<<<unsigned(4 * sms), 256, 0, st>>>(
                static_cast<const uint4*>(bufs[size_t(i % copies)]->data()), bytes / 16, static_cast<uint4*>(sink->data()));
          },
          o.reps, o.trials);
      report(cat("read-only ", bytes >> 20, " MiB (", bytes, " B)"), sec, double(bytes), {{"bytes", bytes}});
    }
    // the same bytes in the decode kernels' block orders (kernel_bench_read.cu)
    bench_read_patterns(sms, size_t(prop.l2CacheSize), o.reps, o.trials, report);
  }
  // ---- prefill linears (T = 512, 4096): bf16 weights (cuBLAS alone) against nf4-dq dequantize +
  //   cuBLAS, the whole matrix at once or in row chunks of 8/16/32 MiB (NF4FLASH_DEQUANT_CHUNK_MB;
  //   the backend chunks only products of >= 2048 rows, so the chunk rows differ at T=4096 only)
  if (!o.gemv_only) {
    // backends: dequantize + cuBLAS (whole, chunks), then the fused wgmma GEMM (auto config, each
    // config) where it runs. cfg_env: NF4FLASH_Q4GEMM_CFG for that row ("" = the default pick).
    struct PCfg {
      std::string name, chunk_mb, q4gemm, cfg_env;
    };
    // NF4FLASH_KB_PREFILL_ALL=1 adds the measured negatives (dequantize in L2-sized row chunks, the
    // cp.async w2* kernels; docs/performance.md)
    const bool all_cfgs = std::getenv("NF4FLASH_KB_PREFILL_ALL") && std::atoi(std::getenv("NF4FLASH_KB_PREFILL_ALL"));
    std::vector<PCfg> cfgs = {{"whole", "0", "dequant", ""}};
    if (cuda::gemm_q4_wgmma_supported()) {
      cfgs.push_back({"fused", "0", "fused", ""});
      for (const char* const* c = cuda::gemm_q4_wgmma_cfgs(); *c; ++c)
        if (all_cfgs || std::string_view(*c).substr(0, 3) == "ws-") cfgs.push_back({cat("fused-", *c), "0", "fused", *c});
    }
    // chunk32: the default above kDequantChunkMinRows rows (T=4096 here); 8/16 MiB measured slower
    for (const char* mb : {"8", "16", "32"})
      if (all_cfgs || std::string_view(mb) == "32") cfgs.push_back({cat("chunk", mb), mb, "dequant", ""});
    std::vector<std::unique_ptr<Backend>> bes;
    for (const auto& c : cfgs) {
      setenv("NF4FLASH_DEQUANT_CHUNK_MB", c.chunk_mb.c_str(), 1);
      setenv("NF4FLASH_Q4_GEMM", c.q4gemm.c_str(), 1);
      bes.push_back(make_cuda_backend(bo));
    }
    unsetenv("NF4FLASH_DEQUANT_CHUNK_MB");
    unsetenv("NF4FLASH_Q4_GEMM");
    json pl = json::array();
    std::vector<int> Ts = {512, 4096};  // NF4FLASH_KB_PREFILL_TS="4096" narrows it (profiling runs)
    if (std::vector<int> t = env_int_list("NF4FLASH_KB_PREFILL_TS"); !t.empty()) {
      Ts.clear();
      for (int x : t) Ts.push_back(std::max(1, x));
    }
    for (Shape s : {Shape{14336, 4096}, Shape{4096, 14336}, Shape{4096, 4096}, Shape{1024, 4096}}) {
      const int copies = copies_for(s.rows * s.cols / 2);
      std::vector<std::vector<std::unique_ptr<Weight>>> wq(bes.size());
      for (int c = 0; c < copies; ++c) {
        auto q = random_q4(s.rows, s.cols, true, g);
        for (size_t b = 0; b < bes.size(); ++b) wq[b].push_back(bes[b]->upload_quant4(q));
      }
      std::unique_ptr<Weight> wd;
      {
        std::vector<uint16_t> wh(size_t(s.rows * s.cols));
        for (auto& v : wh) v = f32_to_bf16(nd(g) * 0.02f);
        wd = be->upload_dense(bf16_tensor("dense", s.rows, s.cols, wh), DType::BF16);
      }
      for (int T : Ts) {
        auto xb = rand_act(T, s.cols);
        auto yb = be->alloc(size_t(T * s.rows) * 2);
        Act x = xb->as_act(DType::BF16, T, s.cols), y = yb->as_act(DType::BF16, T, s.rows);
        const double flop = 2.0 * T * s.rows * s.cols;
        const int reps = T >= 4096 ? 4 : 16;
        json row = {{"rows", s.rows}, {"cols", s.cols}, {"T", T}};
        const double sd = time_graph(*be, [&](int) { be->linear(x, *wd, nullptr, y); }, reps, o.trials);
        report(cat("prefill bf16 ", s.rows, "x", s.cols, " T=", T), sd, double(s.rows * s.cols * 2),
               {{"T", T}, {"tflops", flop / sd / 1e12}, {"path", be->linear_path(*wd, T)}});
        row["bf16_us"] = sd * 1e6;
        for (size_t b = 0; b < bes.size(); ++b) {
          Backend& bb = *bes[b];
          if (!cfgs[b].cfg_env.empty()) setenv("NF4FLASH_Q4GEMM_CFG", cfgs[b].cfg_env.c_str(), 1);
          const double sq = time_graph(bb, [&](int i) { bb.linear(x, *wq[b][size_t(i % copies)], nullptr, y); }, reps,
                                       o.trials);
          report(cat("prefill nf4-dq ", cfgs[b].name, " ", s.rows, "x", s.cols, " T=", T), sq,
                 double(wq[b][0]->resident_bytes()), {{"T", T}, {"tflops", flop / sq / 1e12}, {"path", bb.linear_path(*wq[b][0], T)}});
          unsetenv("NF4FLASH_Q4GEMM_CFG");
          row[cat("nf4dq_", cfgs[b].name, "_us")] = sq * 1e6;
        }
        pl.push_back(row);
      }
    }
    out["prefill_linear"] = pl;

    // One layer's linears as the decoder issues them (q/k/v via linear_multi, o, gate+up+SiLU via
    // linear_swiglu, down), Llama-3-8B shapes, each backend: bf16 cuBLAS, nf4-dq dequantize +
    // cuBLAS ("whole"), nf4-dq fused GEMM (default configs: q/k/v one launch; variants below).
    // Two copies of the layer alternate (220 MB of 4-bit weights, past the 60 MB L2).
    {
      const int64_t H = 4096, I = 14336, KV = 1024;
      struct Layer {
        std::unique_ptr<Weight> q, k, v, o, gate, up, down;
      };
      struct LB {
        std::string name;
        Backend* be;
        std::vector<Layer> layers;
      };
      std::vector<LB> lbs;
      lbs.push_back({"bf16", be.get(), {}});
      lbs.push_back({"nf4-dq whole", bes[0].get(), {}});
      std::unique_ptr<Backend> be_swiglu;
      if (cuda::gemm_q4_wgmma_supported()) {
        lbs.push_back({"nf4-dq fused", bes[1].get(), {}});
        setenv("NF4FLASH_Q4_GEMM", "fused", 1);
        setenv("NF4FLASH_Q4GEMM_SWIGLU", "1", 1);
        be_swiglu = make_cuda_backend(bo);
        unsetenv("NF4FLASH_Q4GEMM_SWIGLU");
        unsetenv("NF4FLASH_Q4_GEMM");
        lbs.push_back({"nf4-dq fused swiglu-epilogue", be_swiglu.get(), {}});
      }
      // fused variants timed on the fused backend's weights: split tail off or summed by a second
      // launch, block order, forced configurations
      struct Var {
        std::string name, env, val;
      };
      const std::vector<Var> vars = {{"nosplit", "NF4FLASH_Q4GEMM_SPLITK", "1"},
                                     {"split-fixup-kernel", "NF4FLASH_Q4GEMM_SPLIT_FIXUP", "kernel"},
                                     {"raster-row", "NF4FLASH_Q4GEMM_RASTER", "row"},
                                     {"ws-n128s6", "NF4FLASH_Q4GEMM_CFG", "ws-n128s6"},
                                     {"ws-n256s4", "NF4FLASH_Q4GEMM_CFG", "ws-n256s4"}};
      for (int c = 0; c < 2; ++c) {
        auto mk = [&](int64_t r, int64_t k) { return random_q4(r, k, true, g); };
        auto qq = mk(H, H), qk = mk(KV, H), qv = mk(KV, H), qo = mk(H, H), qg = mk(I, H), qu = mk(I, H), qd = mk(H, I);
        for (LB& lb : lbs) {
          Layer L;
          if (lb.name == "bf16") {
            auto dense = [&](int64_t r, int64_t k) {
              std::vector<uint16_t> wh(size_t(r * k));
              for (auto& v : wh) v = f32_to_bf16(nd(g) * 0.02f);
              return lb.be->upload_dense(bf16_tensor("dense", r, k, wh), DType::BF16);
            };
            L = {dense(H, H), dense(KV, H), dense(KV, H), dense(H, H), dense(I, H), dense(I, H), dense(H, I)};
          } else {
            Backend& b = *lb.be;
            L = {b.upload_quant4(qq), b.upload_quant4(qk), b.upload_quant4(qv), b.upload_quant4(qo),
                 b.upload_quant4(qg), b.upload_quant4(qu), b.upload_quant4(qd)};
          }
          lb.layers.push_back(std::move(L));
        }
      }
      json ll = json::array();
      std::vector<int> LTs = Ts;
      if (!std::getenv("NF4FLASH_KB_PREFILL_TS")) LTs = {512, 1024, 2048, 4096};
      for (int T : LTs) {
        auto xb = rand_act(T, H), qb = be->alloc(size_t(T * H) * 2), kb = be->alloc(size_t(T * KV) * 2),
             vb = be->alloc(size_t(T * KV) * 2), gb = be->alloc(size_t(T * I) * 2), ub = be->alloc(size_t(T * I) * 2),
             ob = be->alloc(size_t(T * H) * 2);
        Act x = xb->as_act(DType::BF16, T, H), q = qb->as_act(DType::BF16, T, H), k = kb->as_act(DType::BF16, T, KV),
            v = vb->as_act(DType::BF16, T, KV), gt = gb->as_act(DType::BF16, T, I), u = ub->as_act(DType::BF16, T, I),
            ao = ob->as_act(DType::BF16, T, H);
        const int reps = T >= 4096 ? 2 : 8;
        json row = {{"T", T}};
        std::vector<std::pair<LB*, const Var*>> runs;
        for (LB& lb : lbs) runs.push_back({&lb, nullptr});
        if (cuda::gemm_q4_wgmma_supported())
          for (const Var& v : vars) runs.push_back({&lbs[2], &v});
        for (auto [lbp, var] : runs) {
          LB& lb = *lbp;
          Backend& b = *lb.be;
          const std::string name = var ? cat(lb.name, " ", var->name) : lb.name;
          if (var) setenv(var->env.c_str(), var->val.c_str(), 1);
          auto qkv = [&](int i) {
            const Layer& L = lb.layers[size_t(i % 2)];
            const Backend::LinearOut outs[3] = {{L.q.get(), nullptr, q}, {L.k.get(), nullptr, k}, {L.v.get(), nullptr, v}};
            b.linear_multi(x, outs, 3);
          };
          auto mlp_in = [&](int i) {
            const Layer& L = lb.layers[size_t(i % 2)];
            b.linear_swiglu(x, *L.gate, nullptr, *L.up, nullptr, gt, u);
          };
          auto all = [&](int i) {
            const Layer& L = lb.layers[size_t(i % 2)];
            qkv(i);
            b.linear(q, *L.o, nullptr, ao);
            mlp_in(i);
            b.linear(u, *L.down, nullptr, ao);
          };
          const double a = 2.0 * T;
          const double s_qkv = time_graph(b, qkv, reps, o.trials);
          report(cat("prefill layer ", name, " q/k/v T=", T), s_qkv, 0.0,
                 {{"T", T}, {"tflops", a * (H + 2 * KV) * H / s_qkv / 1e12}});
          const double s_mlp = time_graph(b, mlp_in, reps, o.trials);
          report(cat("prefill layer ", name, " gate+up+silu T=", T), s_mlp, 0.0,
                 {{"T", T}, {"tflops", a * 2 * I * H / s_mlp / 1e12}});
          const double s_all = time_graph(b, all, reps, o.trials);
          report(cat("prefill layer ", name, " all linears T=", T), s_all, 0.0,
                 {{"T", T}, {"tflops", a * ((H + 2 * KV) * H + H * H + 3 * I * H) / s_all / 1e12}});
          row[cat(name, "_qkv_us")] = s_qkv * 1e6;
          row[cat(name, "_swiglu_us")] = s_mlp * 1e6;
          row[cat(name, "_layer_us")] = s_all * 1e6;
          if (var) unsetenv(var->env.c_str());
        }
        ll.push_back(row);
      }
      out["prefill_layer"] = ll;
    }
  }
  if (o.prefill_linear_only) {
    out["kernels"] = rows;
    return out.dump(2);
  }

  for (Shape s : {Shape{4096, 14336}, Shape{14336, 4096}, Shape{4096, 4096}, Shape{1024, 4096}})
    for (bool dq : {true, false}) {
      const int64_t wbytes = s.rows * s.cols / 2;
      const int copies = copies_for(wbytes);
      std::vector<std::unique_ptr<Weight>> ws;
      for (int c = 0; c < copies; ++c) ws.push_back(be->upload_quant4(random_q4(s.rows, s.cols, dq, g)));
      for (int T : {1, 4}) {
        if (T == 4 && !(s.rows == 14336 && dq)) continue;
        auto xb = rand_act(T, s.cols), yb = be->alloc(size_t(T * s.rows) * 2);
        Act x = xb->as_act(DType::BF16, T, s.cols), y = yb->as_act(DType::BF16, T, s.rows);
        // (2026-12-02 runs 6-8 measured "stream-bulk16" and the old cp.async kernel too: both slower)
        // seq: the in-order kernel (x in shared memory); seq-xglobal: x read from global;
        // seq-pf24: with the L2 prefetch at 24 MiB (the next copy's bytes)
        // seq-<cfg>: the in-order kernel's other configurations (NF4FLASH_GEMV_SEQ_CFG)
        // seq-l... / seq-a...: the lean kernel's configurations (gemv_q4_lean.cuh)
        for (const char* variant : {"seq", "seq-w8u4d3", "seq-l8u4d3", "seq-p8u4d3", "seq-h8u4d3", "seq-x8u4d3",
                                    "seq-y8u4d3", "seq-z8u4d3", "seq-v8u4d3", "regs"}) {
          if (T != 1 && std::string(variant).rfind("seq-", 0) == 0 && std::string(variant) != "seq") continue;
          with_variant(variant);
          const std::string vn = variant;
          if (vn.rfind("seq", 0) == 0) setenv("NF4FLASH_GEMV_Q4", "seq", 1);
          if (vn == "seq-xglobal") setenv("NF4FLASH_GEMV_X_SMEM", "0", 1);
          if (vn == "seq-pf24") setenv("NF4FLASH_L2_PREFETCH_MB", "24", 1);
          if (vn.rfind("seq-", 0) == 0) setenv("NF4FLASH_GEMV_SEQ_CFG", vn.c_str() + 4, 1);
          const double sec = time_graph(*be, [&](int i) { be->linear(x, *ws[size_t(i % copies)], nullptr, y); },
                                        o.reps, o.trials);
          const double bytes = double(ws[0]->resident_bytes()) + T * (s.cols + s.rows) * 2.0;
          report(cat("gemv nf4", dq ? "-dq" : "", " ", s.rows, "x", s.cols, " T=", T, " ", variant), sec, bytes,
                 {{"rows", s.rows}, {"cols", s.cols}, {"T", T}, {"double_quant", dq}, {"copies", copies},
                  {"variant", variant}, {"path", be->linear_path(*ws[0], T)}});
          unsetenv("NF4FLASH_GEMV_X_SMEM");
          unsetenv("NF4FLASH_L2_PREFETCH_MB");
          unsetenv("NF4FLASH_GEMV_SEQ_CFG");
        }
        reset_variant();
        if (T == 1 && dq) {
          // the in-order kernel on one copy (weights L2-resident after the first call): the
          // kernel's own ceiling when its bytes come from L2
          setenv("NF4FLASH_L2_PREFETCH_MB", "0", 1);
          const double sec = time_graph(*be, [&](int) { be->linear(x, *ws[0], nullptr, y); }, o.reps, o.trials);
          const double bytes = double(ws[0]->resident_bytes()) + T * (s.cols + s.rows) * 2.0;
          report(cat("gemv nf4-dq ", s.rows, "x", s.cols, " T=1 seq L2-resident"), sec, bytes,
                 {{"rows", s.rows}, {"cols", s.cols}, {"T", T}, {"double_quant", dq}, {"copies", 1}});
          unsetenv("NF4FLASH_L2_PREFETCH_MB");
        }
        // register-kernel configurations (NF4FLASH_GEMV_CFG: warps, tiles per batch, blocks/SM,
        // table addressing; see ops_gemv.cu), T = 1, double quant
        if (T == 1 && dq) {
          setenv("NF4FLASH_GEMV_Q4", "regs", 1);
          for (const char* cfg : {"w8u4m1a0", "w8u4m1a1", "w8u4m1a2", "w16u2m2a2", "w8u4m3a0", "ring-w8s3u4a1",
                            "ring-w16s3u2a1"}) {
            setenv("NF4FLASH_GEMV_CFG", cfg, 1);
            const double sec = time_graph(*be, [&](int i) { be->linear(x, *ws[size_t(i % copies)], nullptr, y); },
                                          o.reps, o.trials);
            const double bytes = double(ws[0]->resident_bytes()) + T * (s.cols + s.rows) * 2.0;
            report(cat("gemv nf4-dq ", s.rows, "x", s.cols, " T=1 cfg ", cfg), sec, bytes,
                   {{"rows", s.rows}, {"cols", s.cols}, {"T", T}, {"double_quant", dq}, {"cfg", cfg}});
          }
          unsetenv("NF4FLASH_GEMV_CFG");
          unsetenv("NF4FLASH_GEMV_Q4");
        }
        // the grouped tile layout (batches of neighbouring row tiles side by side, read by the lean
        // kernel's T = 1 form): whether the order in which blocks meet the bytes moves the GEMV
        if (T == 1 && dq && (s.cols / 64) % 32 == 0) {
          alt.grouped(s.rows, s.cols, true, copies, x, y, cat("gemv nf4-dq ", s.rows, "x", s.cols, " T=1 seq grouped"));
          alt.ablated(ws, s.rows, s.cols, x, y);  // what each cost of the default kernel bounds
        }
      }
    }

  // ---- stream kernel diagnostics on nf4-dq 14336x4096, T = 1: ring depth, and streaming alone
  //   (NF4FLASH_GEMV_NOCOMPUTE: the weights are copied in, the math is skipped; wrong results)
  {
    const int64_t R = 14336, K = 4096;
    const int copies = copies_for(R * K / 2);
    std::vector<std::unique_ptr<Weight>> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(be->upload_quant4(random_q4(R, K, true, g)));
    auto xb = rand_act(1, K), yb = be->alloc(size_t(R) * 2);
    Act x = xb->as_act(DType::BF16, 1, K), y = yb->as_act(DType::BF16, 1, R);
    for (int nocompute : {0, 1})
      for (int stages : {2, 8}) {
        setenv("NF4FLASH_GEMV_STAGES", std::to_string(stages).c_str(), 1);
        setenv("NF4FLASH_GEMV_FEED", "bulk", 1);
        setenv("NF4FLASH_GEMV_NOCOMPUTE", nocompute ? "1" : "0", 1);
        const double sec = time_graph(*be, [&](int i) { be->linear(x, *ws[size_t(i % copies)], nullptr, y); },
                                      o.reps, o.trials);
        report(cat("stream diag 14336x4096 stages=", stages, nocompute ? " copy-only" : ""), sec,
               double(ws[0]->resident_bytes()) + (K + R) * 2.0, {{"stages", stages}, {"nocompute", nocompute}});
      }
    unsetenv("NF4FLASH_GEMV_STAGES");
    unsetenv("NF4FLASH_GEMV_NOCOMPUTE");
    unsetenv("NF4FLASH_GEMV_FEED");
  }

  // ---- size sweep of the default 4-bit decode GEMV (nf4-dq, R x 4096, T = 1): time against bytes
  //   gives the fixed cost per launch (intercept) and the streaming rate (slope) apart
  for (int64_t R : {256, 1024, 2048, 4096, 8192, 14336}) {
    const int64_t K = 4096;
    const int copies = copies_for(R * K / 2);
    std::vector<std::unique_ptr<Weight>> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(be->upload_quant4(random_q4(R, K, true, g)));
    auto xb = rand_act(1, K), yb = be->alloc(size_t(R) * 2);
    Act x = xb->as_act(DType::BF16, 1, K), y = yb->as_act(DType::BF16, 1, R);
    const double sec = time_graph(*be, [&](int i) { be->linear(x, *ws[size_t(i % copies)], nullptr, y); },
                                  o.reps, o.trials);
    report(cat("gemv size sweep nf4-dq ", R, "x", K, " T=1 seq"), sec, double(ws[0]->resident_bytes()) + (K + R) * 2.0,
           {{"rows", R}, {"cols", K}, {"copies", copies}});
  }

  // ---- fused decode GEMVs (nf4-dq, T = 1) against the same work unfused:
  //   qkv: q 4096x4096 + k, v 1024x4096 in one launch vs three;  gate+up+silu: 2 x 14336x4096 vs
  //   two GEMVs + silu_mul;  down + residual: 4096x14336 with the add vs GEMV + add
  {
    const int64_t H = 4096, I = 14336, KV = 1024;
    using Set = LayerSet;
    const int64_t set_bytes = (2 * H * H + 2 * KV * H + 3 * I * H) / 2;
    const int copies = copies_for(set_bytes / 3);
    std::vector<Set> sets(static_cast<size_t>(copies));
    for (auto& st : sets) {
      st.q = be->upload_quant4(random_q4(H, H, true, g));
      st.k = be->upload_quant4(random_q4(KV, H, true, g));
      st.v = be->upload_quant4(random_q4(KV, H, true, g));
      st.o = be->upload_quant4(random_q4(H, H, true, g));
      st.gate = be->upload_quant4(random_q4(I, H, true, g));
      st.up = be->upload_quant4(random_q4(I, H, true, g));
      st.down = be->upload_quant4(random_q4(H, I, true, g));
    }
    auto xb = rand_act(1, H), qb = be->alloc(H * 2), kb = be->alloc(KV * 2), vb = be->alloc(KV * 2);
    auto gb = rand_act(1, I), ub = be->alloc(I * 2), rb = rand_act(1, H), ob = be->alloc(H * 2);
    Act x = xb->as_act(DType::BF16, 1, H), qa = qb->as_act(DType::BF16, 1, H), ka = kb->as_act(DType::BF16, 1, KV),
        va = vb->as_act(DType::BF16, 1, KV), ga = gb->as_act(DType::BF16, 1, I), ua = ub->as_act(DType::BF16, 1, I),
        ra = rb->as_act(DType::BF16, 1, H), oa = ob->as_act(DType::BF16, 1, H);
    auto wb = [](const Weight& w) { return double(w.resident_bytes()); };
    const double qkv_bytes = wb(*sets[0].q) + wb(*sets[0].k) + wb(*sets[0].v) + 2.0 * (H + H + 2 * KV);
    const double gu_bytes = wb(*sets[0].gate) + wb(*sets[0].up) + 2.0 * (H + I);
    const double dn_bytes = wb(*sets[0].down) + 2.0 * (I + 2 * H);
    // in-order kernel (default) and stream-K, fused or not
    for (const char* mode : {"seq", "stream"})
    for (bool fused : {true, false}) {
      setenv("NF4FLASH_GEMV_Q4", mode, 1);
      const std::string tag = cat(mode, fused ? " fused" : " unfused");
      double sec = time_graph(*be, [&](int i) {
        Set& st = sets[size_t(i % copies)];
        if (fused) {
          const Backend::LinearOut outs[3] = {{st.q.get(), nullptr, qa}, {st.k.get(), nullptr, ka}, {st.v.get(), nullptr, va}};
          be->linear_multi(x, outs, 3);
        } else {
          be->linear(x, *st.q, nullptr, qa);
          be->linear(x, *st.k, nullptr, ka);
          be->linear(x, *st.v, nullptr, va);
        }
      }, o.reps, o.trials);
      report(cat("qkv nf4-dq 6144x4096 T=1 ", tag), sec, qkv_bytes, {{"fused", fused}, {"copies", copies}});
      sec = time_graph(*be, [&](int i) {
        Set& st = sets[size_t(i % copies)];
        if (fused) be->linear_swiglu(x, *st.gate, nullptr, *st.up, nullptr, ga, ua);
        else {
          be->linear(x, *st.gate, nullptr, ga);
          be->linear(x, *st.up, nullptr, ua);
          be->silu_mul(ga, ua, ua);
        }
      }, o.reps, o.trials);
      report(cat("gate+up+silu nf4-dq 2x14336x4096 T=1 ", tag), sec, gu_bytes, {{"fused", fused}, {"copies", copies}});
      sec = time_graph(*be, [&](int i) {
        Set& st = sets[size_t(i % copies)];
        if (fused) be->linear_residual(ua, *st.down, nullptr, oa, ra);
        else {
          be->linear(ua, *st.down, nullptr, oa);
          be->add(ra, oa, ra);
        }
      }, o.reps, o.trials);
      report(cat("down+residual nf4-dq 4096x14336 T=1 ", tag), sec, dn_bytes, {{"fused", fused}, {"copies", copies}});
    }
    // One decode layer's GEMVs back to back (q/k/v, o + residual, gate+up+SiLU, down + residual:
    // 109 MB of nf4-dq weights), layers rotated over the copies, with the L2 prefetch distance of
    // captured steps (NF4FLASH_L2_PREFETCH_MB) varied: what the weight stream alone reaches.
    const double layer_bytes = qkv_bytes + wb(*sets[0].o) + gu_bytes + dn_bytes;
    auto layer = [&](int i) {
      Set& st = sets[size_t(i % copies)];
      const Backend::LinearOut outs[3] = {{st.q.get(), nullptr, qa}, {st.k.get(), nullptr, ka}, {st.v.get(), nullptr, va}};
      be->linear_multi(x, outs, 3);
      be->linear_residual(qa, *st.o, nullptr, oa, ra);
      be->linear_swiglu(x, *st.gate, nullptr, *st.up, nullptr, ga, ua);
      be->linear_residual(ua, *st.down, nullptr, oa, ra);
    };
    for (const char* mode : {"seq", "seq-w8u4d3", "seq-l8u4d3", "seq-p8u4d3", "seq-h8u4d3", "seq-x8u4d3", "seq-y8u4d3",
                             "seq-z8u4d3", "seq-v8u4d3", "streamk"}) {
      const std::string m = mode;
      setenv("NF4FLASH_GEMV_Q4", m.rfind("seq", 0) == 0 ? "seq" : mode, 1);
      if (m.rfind("seq-", 0) == 0) setenv("NF4FLASH_GEMV_SEQ_CFG", m.c_str() + 4, 1);
      for (int mb : {0, 24}) {
        if (m != "seq" && mb != 0) continue;  // the prefetch with the default configuration only
        setenv("NF4FLASH_L2_PREFETCH_MB", std::to_string(mb).c_str(), 1);
        const double sec = time_graph(*be, layer, o.reps, o.trials);
        report(cat("decode layer GEMVs nf4-dq T=1 ", mode, " prefetch ", mb, " MiB"), sec, layer_bytes,
               {{"mode", mode}, {"prefetch_mib", mb}, {"copies", copies}});
      }
      unsetenv("NF4FLASH_GEMV_SEQ_CFG");
    }
    unsetenv("NF4FLASH_L2_PREFETCH_MB");
    unsetenv("NF4FLASH_GEMV_Q4");
    // One whole decode layer in the decoder's fused order, attention and chain variants
    // (kernel_bench_layer.cu)
    const LayerActs acts{x, qa, ka, va, ga, ua, ra, oa};
    bench_decode_layer_full(*be, sets, acts, layer_bytes, o.reps, o.trials, g, report);
    sets.clear();  // the bf16 layer's 872 MB next
    bench_dense_layer(*be, acts, o.reps, o.trials, g, report);
  }

  // ---- dense bf16 decode GEMV, single weights of the Llama-3-8B layer (o, down, gate), T=1, per
  //   kernel: vec = gemv_dense_vec_kernel (the default), stream4/stream8 = the stream kernel, split =
  //   one row per block (NF4FLASH_DENSE_STREAM=4|8|k), multi = gemv_dense_multi_kernel over one weight
  //   (NF4FLASH_DENSE_MULTI=2);
  //   weights rotated over copies >= 256 MB so they come from HBM
  for (const auto& [N, K, nm] : {std::tuple<int64_t, int64_t, const char*>{4096, 4096, "o"}, {4096, 14336, "down"},
                                 {14336, 4096, "gate"}}) {
    const int copies = int(std::max<int64_t>(2, (int64_t(256) << 20) / (N * K * 2) + 1));
    std::vector<std::unique_ptr<Weight>> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(upload_bf16_pattern(*be, nm, N, K));
    auto xb = be->alloc(size_t(K) * 2), yb = be->alloc(size_t(N) * 2);
    CUDA_CHECK(cudaMemset(xb->data(), 0x3c, size_t(K) * 2));
    CUDA_CHECK(cudaDeviceSynchronize());
    Act x = xb->as_act(DType::BF16, 1, K), y = yb->as_act(DType::BF16, 1, N);
    for (const char* mode : {"vec", "stream4", "stream8", "split", "multi"}) {
      const std::string m(mode);
      setenv("NF4FLASH_DENSE_MULTI", m == "multi" ? "2" : "0", 1);
      setenv("NF4FLASH_DENSE_STREAM", m == "vec" ? "0" : m == "stream8" ? "8" : m == "split" ? "k" : "4", 1);
      const double sec = time_graph(*be, [&](int i) { be->linear(x, *ws[size_t(i % copies)], nullptr, y); },
                                    std::max(8, o.reps / 2), o.trials);
      report(cat("gemv bf16 ", nm, " ", N, "x", K, " T=1 ", mode), sec, double(N * K * 2 + K * 2 + N * 2),
             {{"rows", N}, {"cols", K}, {"kernel", mode}});
    }
    unsetenv("NF4FLASH_DENSE_MULTI");
    unsetenv("NF4FLASH_DENSE_STREAM");
  }

  if (o.gemv_only) {
    out["kernels"] = rows;
    return out.dump(2);
  }

  // ---- GEMV vs GEMM by row count (the threshold of linear()): nf4-dq 14336x4096 and 4096x14336;
  //   "gemv" = the register GEMV in launches of 8 rows, "gemm" = dequantize to bf16 + cublasGemmEx
  {
    setenv("NF4FLASH_GEMV_MAX_ROWS", "0", 1);
    auto be_gemm = make_cuda_backend(bo);  // the default GEMM path (dequantize + cuBLAS)
    const bool fused = cuda::gemm_q4_wgmma_supported();
    if (fused) setenv("NF4FLASH_Q4_GEMM", "fused", 1);
    auto be_fused = make_cuda_backend(bo);  // the fused wgmma GEMM where it runs (else unused)
    unsetenv("NF4FLASH_Q4_GEMM");
    setenv("NF4FLASH_GEMV_MAX_ROWS", "256", 1);
    auto be_gemv = make_cuda_backend(bo);
    unsetenv("NF4FLASH_GEMV_MAX_ROWS");
    json thr = json::array();
    for (Shape s : {Shape{14336, 4096}, Shape{4096, 14336}}) {
      const int copies = copies_for(s.rows * s.cols / 2);
      std::vector<std::unique_ptr<Weight>> wg, wm, wfu;
      for (int c = 0; c < copies; ++c) {
        auto q = random_q4(s.rows, s.cols, true, g);
        wg.push_back(be_gemv->upload_quant4(q));
        wm.push_back(be_gemm->upload_quant4(q));
        if (fused) wfu.push_back(be_fused->upload_quant4(q));
      }
      for (int T : {1, 4, 8, 16, 32, 48, 64, 96, 128}) {
        auto xb = be_gemv->alloc(size_t(T * s.cols) * 2), yb = be_gemv->alloc(size_t(T * s.rows) * 2);
        {
          std::vector<uint16_t> h(size_t(T * s.cols));
          for (auto& v : h) v = f32_to_bf16(nd(g));
          be_gemv->upload(xb->data(), h.data(), h.size() * 2);
        }
        auto xm = be_gemm->alloc(size_t(T * s.cols) * 2), ym = be_gemm->alloc(size_t(T * s.rows) * 2);
        CUDA_CHECK(cudaMemcpy(xm->data(), xb->data(), size_t(T * s.cols) * 2, cudaMemcpyDeviceToDevice));
        Act x = xb->as_act(DType::BF16, T, s.cols), y = yb->as_act(DType::BF16, T, s.rows);
        Act x2 = xm->as_act(DType::BF16, T, s.cols), y2 = ym->as_act(DType::BF16, T, s.rows);
        const double bytes = double(wg[0]->resident_bytes()) + T * (s.cols + s.rows) * 2.0;
        json row = {{"rows", s.rows}, {"cols", s.cols}, {"T", T}};
        {
          setenv("NF4FLASH_GEMV_Q4", "regs", 1);
          const double sec = time_graph(*be_gemv, [&](int i) { be_gemv->linear(x, *wg[size_t(i % copies)], nullptr, y); },
                                        std::max(8, o.reps / 4), o.trials);
          unsetenv("NF4FLASH_GEMV_Q4");
          report(cat("threshold gemv ", s.rows, "x", s.cols, " T=", T), sec, bytes,
                 {{"T", T}, {"path", be_gemv->linear_path(*wg[0], T)}});
          row["gemv_us"] = sec * 1e6;
        }
        const double sec = time_graph(*be_gemm, [&](int i) { be_gemm->linear(x2, *wm[size_t(i % copies)], nullptr, y2); },
                                      std::max(8, o.reps / 4), o.trials);
        report(cat("threshold gemm ", s.rows, "x", s.cols, " T=", T), sec, bytes,
               {{"T", T}, {"path", be_gemm->linear_path(*wm[0], T)}});
        row["gemm_us"] = sec * 1e6;
        if (fused) {  // the opt-in fused GEMM at the same row counts
          const double s1 = time_graph(*be_fused, [&](int i) { be_fused->linear(x2, *wfu[size_t(i % copies)], nullptr, y2); },
                                       std::max(8, o.reps / 4), o.trials);
          report(cat("threshold fused-gemm ", s.rows, "x", s.cols, " T=", T), s1, bytes,
                 {{"T", T}, {"path", be_fused->linear_path(*wfu[0], T)}});
          row["gemm_fused_us"] = s1 * 1e6;
        }
        thr.push_back(row);
      }
    }
    out["gemv_gemm_threshold"] = thr;
  }

  // ---- dense bf16 GEMV, lm_head shape (the default kernel, then the vec kernel)
  {
    const int64_t N = 128256, K = 4096;
    auto w = upload_bf16_pattern(*be, "lm_head", N, K);
    auto xb = be->alloc(size_t(K) * 2), yb = be->alloc(size_t(N) * 4);
    CUDA_CHECK(cudaMemset(xb->data(), 0x3c, size_t(K) * 2));
    CUDA_CHECK(cudaDeviceSynchronize());
    Act x = xb->as_act(DType::BF16, 1, K), y = yb->as_act(DType::F32, 1, N);
    for (const char* mode : {"", "0"}) {
      setenv("NF4FLASH_DENSE_STREAM", mode, 1);
      const double sec = time_graph(*be, [&](int) { be->linear(x, *w, nullptr, y); }, std::max(4, o.reps / 10), o.trials);
      report(cat("gemv bf16 lm_head 128256x4096 -> f32", *mode ? " vec" : ""), sec, double(N * K * 2 + K * 2 + N * 4),
             {{"rows", N}, {"cols", K}, {"path", be->linear_path(*w, 1)}, {"kernel", *mode ? "vec" : "default"}});
    }
    unsetenv("NF4FLASH_DENSE_STREAM");
  }

  out["kernels"] = rows;
  out["attention_prefill_flop_convention"] = "4 * seq^2 / 2 * head_dim * n_heads (causal)";
  out["attention_prefill"] = bench_attention_prefill(*be, std::max(5, o.trials), g);
  return out.dump(2);
}

}  // namespace nf4flash
