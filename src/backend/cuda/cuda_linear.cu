// CudaBackend::linear and its fused forms: which 4-bit kernel serves how many rows (register GEMV,
// stream-K GEMV for the fused launches, dequantize + cuBLAS above kGemvRowsDefault rows), dense GEMV
// and cuBLAS for dense weights; linear_path() names the choice.
#include "backend/cuda/cuda_backend_impl.h"

namespace nf4flash::cuda_impl {

// out[T, n0 : n0+N] = x[T, K] * W[N, K]^T  (column-major view: out^T = W^T' * x^T, ldc = out.cols)
void CudaBackend::gemm(const void* w, int64_t N, int64_t K, Act x, Act out, int64_t n0) {
  const float alpha = 1.f, beta = 0.f;
  const cublasComputeType_t ct =
      (act_ == DType::F32 && tf32_) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  void* c = static_cast<char*>(out.data) + n0 * int64_t(dtype_size(out.dtype));
  CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(x.rows), int(K), &alpha, w,
                            cuda_type(act_), int(K), x.data, cuda_type(act_), int(K), &beta, c,
                            cuda_type(out.dtype), int(out.cols), ct, CUBLAS_GEMM_DEFAULT));
}

// The dequantize scratch for products of T rows with d (gemm_q4, swiglu_sliced), reserved once for
// all weights: the largest whole matrix, or (products that chunk) at most the chunk bytes, also
// when this weight fits in one chunk (q: 4096 x 4096 = 32 MiB). Grows only, outside graph capture.
void CudaBackend::reserve_dequant_scratch(const cuda::Q4Device& d, int64_t T) {
  const int64_t chunk = dequant_chunk_rows(d, T);
  if (scratch_ && scratch_->bytes() >= size_t(chunk * d.cols) * dtype_size(act_)) return;
  NF4FLASH_CHECK(!capturing_, "linear: the dequantize scratch must be allocated before graph capture");
  sync();  // products still in flight may read the old scratch
  const int64_t whole = q4_scratch_numel_;
  const bool chunked = dequant_chunk_bytes_ > 0 && T >= kDequantChunkMinRows;
  const int64_t want = chunked ? std::min(whole, dequant_chunk_bytes_ / int64_t(dtype_size(act_))) : whole;
  reserve_scratch(std::max(want, chunk * d.cols));
}

// out[T, c0 : c0+nc] = x * W[n0 : n0+nc]^T: those weight rows dequantized into the scratch
// (reserved by the caller: reserve_dequant_scratch), then one cuBLAS product.
void CudaBackend::gemm_q4_rows(const cuda::Q4Device& d, int64_t n0, int64_t nc, Act x, Act out, int64_t c0) {
  q4_dequant(d, scratch_->data(), act_, stream_, n0, nc);
  gemm(scratch_->data(), nc, d.cols, x, out, c0);
}

// Dequantize a chunk of weight rows into the scratch, multiply it into its output columns, next.
void CudaBackend::gemm_q4(const cuda::Q4Device& d, Act x, Act out) {
  const int64_t chunk = dequant_chunk_rows(d, x.rows);
  reserve_dequant_scratch(d, x.rows);
  for (int64_t n0 = 0; n0 < d.rows; n0 += chunk) gemm_q4_rows(d, n0, std::min(chunk, d.rows - n0), x, out, n0);
}

void CudaBackend::linear(Act x, const Weight& w, const Weight* bias, Act out) {
  check_act(x, "linear");
  NF4FLASH_CHECK(out.dtype == act_ || out.dtype == DType::F32, "linear: output dtype ", dtype_name(out.dtype));
  NF4FLASH_CHECK(x.cols == w.cols() && out.cols == w.rows() && out.rows == x.rows, "linear: x [", x.rows, ", ",
                 x.cols, "] * W[", w.rows(), ", ", w.cols(), "]^T -> out [", out.rows, ", ", out.cols, "]");
  if (x.rows == 0) return;
  const float* b = bias ? vec_f32(*bias, w.rows(), "linear bias") : nullptr;
  const Weight* wp = &w;
  if (auto* q = dynamic_cast<const CudaQ4*>(&w)) {
    NF4FLASH_CHECK(!gemv_ablate_ || (!q->fallback && seq_q4(w, x.rows)), "linear: gemv_ablate ", gemv_ablate_,
                   " ablates the in-order decode GEMV alone; this product takes ", linear_path(w, x.rows));
    if (q->fallback) {
      wp = q->fallback.get();
    } else if (seq_q4(w, x.rows)) {
      GemvQ4MultiArgs a = multi_args(x);
      a.w[0] = &q->dev;
      a.bias[0] = b;
      a.out[0] = out.data;
      a.out_dtype = out.dtype;
      seq_gemv(a);
      return;
    } else if (stream_q4(w, x.rows, true)) {
      GemvQ4MultiArgs a = multi_args(x);
      a.w[0] = &q->dev;
      a.bias[0] = b;
      a.out[0] = out.data;
      a.out_dtype = out.dtype;
      gemv_q4_multi(a, stream_);
      return;
    } else if (x.rows <= gemv_max_rows_ && act_ != DType::F32) {
      for (int64_t r0 = 0; r0 < x.rows; r0 += kGemvMaxRows) {  // 8 rows per launch
        const int64_t n = std::min<int64_t>(kGemvMaxRows, x.rows - r0);
        GemvQ4Args a;
        a.w = &q->dev;
        a.x = x.slice_rows(r0, n).data;
        a.act = act_;
        a.T = int(n);
        a.bias = b;
        a.out = out.slice_rows(r0, n).data;
        a.out_dtype = out.dtype;
        gemv_q4(a, stream_);
      }
      return;
    } else if (fused_q4_rows(x.rows)) {
      GemmQ4Args a;
      a.w = &q->dev;
      a.x = x.data;
      a.act = act_;
      a.T = x.rows;
      a.bias = b;
      a.out = out.data;
      a.out_dtype = out.dtype;
      a.split = split_ws();
      gemm_q4_wgmma(a, stream_);
      return;
    } else {
      gemm_q4(q->dev, x, out);
      if (b) bias_add(out.data, out.dtype, b, out.rows, out.cols, stream_);
      return;
    }
  }
  const CudaDense& d = as_dense(*wp, "linear");
  if (x.rows <= kGemvMaxRows) {
    const LinearOut one{wp, bias, out};
    if (dense_multi(x, &one, 1, nullptr)) return;
    return dense_gemv(d, x, b, out, false);
  }
  const void* wd = d.data->data();
  if (d.dtype() != act_) {
    convert(wd, d.dtype(), scratch_->data(), act_, d.rows() * d.cols(), stream_);
    wd = scratch_->data();
  }
  gemm(wd, d.rows(), d.cols(), x, out);
  if (b) bias_add(out.data, out.dtype, b, out.rows, out.cols, stream_);
}

// The fused tensor-core GEMM over several 4-bit weights (q/k/v, or gate+up with SwiGLU): all of
// them 4-bit with the same parameters, and the row count one the fused GEMM serves.
bool CudaBackend::gemm_q4_multi_args(Act x, const Weight* const* ws, int n, GemmQ4MultiArgs& a) const {
  if (!fused_q4_rows(x.rows) || n < 1 || n > 3) return false;
  const CudaQ4* q0 = nullptr;
  int64_t rb = 0;
  for (int i = 0; i < n; ++i) {
    auto* q = dynamic_cast<const CudaQ4*>(ws[i]);
    if (!q || q->fallback || (q0 && !same_q4_params(*q0, *q))) return false;
    if (!q0) q0 = q;
    a.w[i] = &q->dev;
    rb += (q->dev.RT + 7) / 8;
  }
  if (!gemm_q4_wgmma_multi_ok(x.rows, rb)) return false;
  a.nseg = n;
  a.x = x.data;
  a.act = act_;
  a.T = x.rows;
  a.split = split_ws();
  return true;
}

void CudaBackend::linear_multi(Act x, const LinearOut* outs, int n) {
  {
    const Weight* ws[3] = {};
    bool ok = n >= 1 && n <= 3;
    for (int i = 0; ok && i < n; ++i) {
      ws[i] = outs[i].w;
      ok = outs[i].out.dtype == act_;
    }
    GemmQ4MultiArgs a;
    if (ok && gemm_q4_multi_args(x, ws, n, a)) {
      for (int i = 0; i < n; ++i) {
        check_linear(x, *outs[i].w, outs[i].out);
        a.bias[i] = outs[i].bias ? vec_f32(*outs[i].bias, outs[i].w->rows(), "linear bias") : nullptr;
        a.out[i] = outs[i].out.data;
      }
      gemm_q4_wgmma_multi(a, stream_);
      return;
    }
  }
  if (dense_multi(x, outs, n, nullptr)) return;
  const bool seq = n >= 1 && seq_q4(*outs[0].w, x.rows);
  GemvQ4MultiArgs a;
  if (!gemv_multi_args(x, outs, n, seq, a)) return Backend::linear_multi(x, outs, n);
  if (seq) seq_gemv(a);
  else gemv_q4_multi(a, stream_);
}

// Dense 16-bit weights at decode row counts (<= kGemvMaxRows): the n outputs in one launch of the
// dense multi-weight GEMV (swiglu_out: gate = outs[0], up = outs[1], silu(gate) * up into
// *swiglu_out); false when they do not qualify (then the caller's other paths run).
// NF4FLASH_DENSE_MULTI (comparisons): 0 = gemv_dense_vec_kernel, one launch per weight; unset/1 =
// the multi-weight kernel for q/k/v and gate+up; 2 = also for single weights (o, down, lm_head: 8
// chunks in flight per lane instead of 4). (Read per call, so tests compare the kernels in one
// process.)
static int dense_multi_mode() {
  const char* v = std::getenv("NF4FLASH_DENSE_MULTI");
  if (!v || !*v) return 1;
  NF4FLASH_CHECK(std::string_view(v) == "0" || std::string_view(v) == "1" || std::string_view(v) == "2",
                 "NF4FLASH_DENSE_MULTI=", v, ": expected 0, 1 or 2");
  return std::atoi(v);
}

bool CudaBackend::dense_multi(Act x, const LinearOut* outs, int n, const Act* swiglu_out, const float* norm_w,
                              float norm_eps) {
  if (x.rows < 1 || x.rows > kGemvMaxRows || n < 1 || n > 3 || x.dtype != act_) return false;
  if (dense_multi_mode() < (n == 1 && !swiglu_out ? 2 : 1)) return false;
  cuda::GemvDenseMultiArgs a;
  a.norm_w = norm_w;
  a.norm_eps = norm_eps;
  a.nseg = n;
  a.swiglu = swiglu_out != nullptr;
  a.K = x.cols;
  a.x = x.data;
  a.act = act_;
  a.T = int(x.rows);
  for (int i = 0; i < n; ++i) {
    auto* d = dynamic_cast<const CudaDense*>(outs[i].w);
    if (!d || (i && d->dtype() != a.w_dtype)) return false;
    const Act& o = swiglu_out ? *swiglu_out : outs[i].out;
    if (o.dtype != act_ && !(o.dtype == DType::F32 && n == 1 && !swiglu_out)) return false;
    a.out_dtype = o.dtype;
    a.w_dtype = d->dtype();
    a.w[i] = d->data->data();
    a.N[i] = d->rows();
  }
  if (!cuda::gemv_dense_multi_applies(a)) return false;
  for (int i = 0; i < n; ++i) {
    check_linear(x, *outs[i].w, swiglu_out ? *swiglu_out : outs[i].out);
    a.bias[i] = outs[i].bias ? vec_f32(*outs[i].bias, outs[i].w->rows(), "linear bias") : nullptr;
    a.out[i] = (swiglu_out ? *swiglu_out : outs[i].out).data;
  }
  cuda::gemv_dense_multi(a, stream_);
  return true;
}

// The fused GEMV's arguments for n (<= kQsMaxSegs) 4-bit weights sharing x, taken by the in-order
// kernel (seq) or the stream-K kernel; false when they cannot share one launch.
bool CudaBackend::gemv_multi_args(Act x, const LinearOut* outs, int n, bool seq, GemvQ4MultiArgs& a) const {
  const CudaQ4* q[kQsMaxSegs] = {};
  bool fuse = n >= 1 && n <= kQsMaxSegs;
  for (int i = 0; fuse && i < n; ++i) {
    q[i] = seq ? seq_q4(*outs[i].w, x.rows) : stream_q4(*outs[i].w, x.rows);
    fuse = q[i] && outs[i].out.dtype == act_ && same_q4_params(*q[0], *q[i]);
  }
  if (!fuse) return false;
  a = multi_args(x);
  a.nseg = n;
  for (int i = 0; i < n; ++i) {
    check_linear(x, *outs[i].w, outs[i].out);
    a.w[i] = &q[i]->dev;
    a.bias[i] = outs[i].bias ? vec_f32(*outs[i].bias, outs[i].w->rows(), "linear bias") : nullptr;
    a.out[i] = outs[i].out.data;
  }
  return true;
}

// gate+up with the SwiGLU epilogue in one GEMV launch (in-order or stream-K kernel); false when the
// two weights cannot share one.
bool CudaBackend::gemv_swiglu_args(Act x, const Weight& gate, const Weight* bg, const Weight& up, const Weight* bu,
                                   Act out, bool seq, GemvQ4MultiArgs& a) const {
  const CudaQ4* qg = seq ? seq_q4(gate, x.rows) : stream_q4(gate, x.rows);
  const CudaQ4* qu = seq ? seq_q4(up, x.rows) : stream_q4(up, x.rows);
  if (!qg || !qu || out.dtype != act_ || gate.rows() != up.rows() || !same_q4_params(*qg, *qu)) return false;
  check_linear(x, gate, out);
  check_linear(x, up, out);
  a = multi_args(x);
  a.ep = GemvEpilogue::SwiGLU;
  a.nseg = 2;
  a.w[0] = &qg->dev;
  a.w[1] = &qu->dev;
  a.bias[0] = bg ? vec_f32(*bg, gate.rows(), "gate bias") : nullptr;
  a.bias[1] = bu ? vec_f32(*bu, up.rows(), "up bias") : nullptr;
  a.out[0] = out.data;
  return true;
}

// Dense 16-bit weights: the multi-weight GEMV folds the norm (x staged in shared memory) and the
// single-weight kernels add the residual. Opt-in, NF4FLASH_DENSE_FUSE_NORM=1: measured slower end
// to end on the H200 (bf16 decode @512 193-197 vs 204-206 tok/s, docs/performance.md, thirteenth
// session); NF4FLASH_FUSE_NORM=0 turns it off as it does the 4-bit fusion.
bool CudaBackend::dense_norm_fusable(const Weight& w, int64_t rows) const {
  const char* on = std::getenv("NF4FLASH_DENSE_FUSE_NORM");
  const char* off = std::getenv("NF4FLASH_FUSE_NORM");
  if (!on || std::string_view(on) != "1" || (off && std::string_view(off) == "0")) return false;
  if (act_ == DType::F32 || rows < 1 || rows > kGemvMaxRows) return false;
  auto* d = dynamic_cast<const CudaDense*>(&w);
  return d && dtype_size(d->dtype()) == 2 && dense_multi_mode() >= 1 && w.cols() % 8 == 0 && w.cols() / 8 <= 1024 &&
         rows * (2 * w.cols() + 16) <= cuda::kDenseNormXMax;
}

bool CudaBackend::fuses_norm_linear(const Weight& w, int64_t rows) const {
  return (seq_q4(w, rows) && gemv_q4_norm_fusable(rows, w.cols())) || dense_norm_fusable(w, rows);
}

// q/k/v with the norm of x in the GEMV's prologue (the lean in-order kernel), when it applies;
// else rms_norm into xn + linear_multi.
bool CudaBackend::norm_multi_args(Act x, const Weight& norm_w, float eps, const LinearOut* outs, int n,
                                  GemvQ4MultiArgs& a) const {
  if (x.dtype != act_ || !gemv_q4_norm_fusable(x.rows, x.cols) || !gemv_multi_args(x, outs, n, true, a)) return false;
  a.norm_w = vec_f32(norm_w, x.cols, "rms_norm weight");
  a.norm_eps = eps;
  return true;
}

void CudaBackend::rms_norm_linear_multi(Act x, const Weight& norm_w, float eps, Act xn, const LinearOut* outs, int n) {
  GemvQ4MultiArgs a;
  if (norm_multi_args(x, norm_w, eps, outs, n, a)) return seq_gemv(a);
  if (n >= 1 && dense_norm_fusable(*outs[0].w, x.rows) &&
      dense_multi(x, outs, n, nullptr, vec_f32(norm_w, x.cols, "rms_norm weight"), eps))
    return;
  Backend::rms_norm_linear_multi(x, norm_w, eps, xn, outs, n);
}

bool CudaBackend::norm_swiglu_args(Act x, const Weight& norm_w, float eps, const Weight& gate, const Weight* bg,
                                   const Weight& up, const Weight* bu, Act out, GemvQ4MultiArgs& a) const {
  if (x.dtype != act_ || !gemv_q4_norm_fusable(x.rows, x.cols) || !gemv_swiglu_args(x, gate, bg, up, bu, out, true, a))
    return false;
  a.norm_w = vec_f32(norm_w, x.cols, "rms_norm weight");
  a.norm_eps = eps;
  return true;
}

void CudaBackend::rms_norm_linear_swiglu(Act x, const Weight& norm_w, float eps, Act xn, const Weight& gate,
                                         const Weight* bg, const Weight& up, const Weight* bu, Act g_tmp, Act out) {
  GemvQ4MultiArgs a;
  if (norm_swiglu_args(x, norm_w, eps, gate, bg, up, bu, out, a)) return seq_gemv(a);
  const LinearOut gu[2] = {{&gate, bg, out}, {&up, bu, out}};
  if (dense_norm_fusable(gate, x.rows) && dense_multi(x, gu, 2, &out, vec_f32(norm_w, x.cols, "rms_norm weight"), eps))
    return;
  Backend::rms_norm_linear_swiglu(x, norm_w, eps, xn, gate, bg, up, bu, g_tmp, out);
}

// The 4-bit GEMV's arguments for resid += x W^T + b (in-order or stream-K kernel).
GemvQ4MultiArgs CudaBackend::q4_residual_args(Act x, const CudaQ4& q, const Weight* bias, Act resid) const {
  check_linear(x, q, resid);
  GemvQ4MultiArgs a = multi_args(x);
  a.ep = GemvEpilogue::Residual;
  a.w[0] = &q.dev;
  a.bias[0] = bias ? vec_f32(*bias, q.rows(), "linear bias") : nullptr;
  a.out[0] = resid.data;
  return a;
}

bool CudaBackend::seq_residual_args(Act x, const Weight& w, const Weight* bias, Act resid, GemvQ4MultiArgs& a) const {
  const CudaQ4* q = seq_q4(w, x.rows);
  if (!q || resid.dtype != act_) return false;
  a = q4_residual_args(x, *q, bias, resid);
  return true;
}

// The dense single-weight decode GEMV (x.rows <= kGemvMaxRows) into out, or added to it (residual).
void CudaBackend::dense_gemv(const CudaDense& d, Act x, const float* bias, Act out, bool residual) {
  GemvDenseArgs a;
  a.w = d.data->data();
  a.w_dtype = d.dtype();
  a.N = d.rows();
  a.K = d.cols();
  a.x = x.data;
  a.act = act_;
  a.T = int(x.rows);
  a.bias = bias;
  a.out = out.data;
  a.out_dtype = out.dtype;
  a.residual = residual;
  a.l2pf = pf_.add(L2PrefetchPlan::dense_desc(a.w, a.N * a.K * int64_t(dtype_size(a.w_dtype))));
  gemv_dense(a, stream_);
}

void CudaBackend::linear_residual(Act x, const Weight& w, const Weight* bias, Act tmp, Act resid) {
  GemvQ4MultiArgs a;
  if (seq_residual_args(x, w, bias, resid, a)) return seq_gemv(a);
  if (dense_norm_fusable(w, x.rows) && resid.dtype == act_ && x.dtype == act_) {  // the dense GEMV adds
    check_linear(x, w, resid);
    return dense_gemv(as_dense(w, "linear_residual"), x, bias ? vec_f32(*bias, w.rows(), "linear bias") : nullptr,
                      resid, true);
  }
  const CudaQ4* q = stream_q4(w, x.rows, true);
  if (!q || resid.dtype != act_) return Backend::linear_residual(x, w, bias, tmp, resid);
  gemv_q4_multi(q4_residual_args(x, *q, bias, resid), stream_);
}

// One stage's in-order GEMV arguments, its weights quantized as the chain's first (q0) ones.
bool CudaBackend::chain_stage_args(const ChainStage& c, GemvQ4MultiArgs& a, const CudaQ4*& q0) const {
  bool ok = false;
  switch (c.kind) {
    case ChainStage::Kind::Residual: ok = seq_residual_args(c.x, *c.outs[0].w, c.outs[0].bias, c.resid, a); break;
    case ChainStage::Kind::NormMulti: ok = norm_multi_args(c.x, *c.norm, c.eps, c.outs, c.n, a); break;
    case ChainStage::Kind::NormSwiGLU:
      ok = norm_swiglu_args(c.x, *c.norm, c.eps, *c.outs[0].w, c.outs[0].bias, *c.outs[1].w, c.outs[1].bias,
                            c.outs[1].out, a);
      break;
  }
  if (!ok) return false;
  const auto* q = dynamic_cast<const CudaQ4*>(c.outs[0].w);
  if (!q0) q0 = q;
  return same_q4_params(*q0, *q, false);  // stages differ in in_features (down_proj)
}

// The stages in one launch of the lean kernel when all of them take it and NF4FLASH_GEMV_CHAIN=1
// (opt-in; no L2 prefetch plan: the chain issues none), else one by one.
bool CudaBackend::chain_launch(const ChainStage* st, int n, bool launch) const {
  bool ok = gemv_q4_chain_enabled() && n >= 2 && n <= kGemvChainMaxStages &&
            L2PrefetchPlan::configured_bytes(props_.l2CacheSize) == 0;
  GemvQ4MultiArgs a[kGemvChainMaxStages];
  const CudaQ4* q0 = nullptr;
  for (int i = 0; ok && i < n; ++i) ok = chain_stage_args(st[i], a[i], q0);
  return ok && gemv_q4_chain(a, n, static_cast<unsigned*>(chain_cnt_->data()), stream_, launch);
}

void CudaBackend::linear_chain(const ChainStage* st, int n) {
  if (!chain_launch(st, n, true)) Backend::linear_chain(st, n);
}

// Prompt chunks that take dequantize + cuBLAS in row chunks (gemm_q4) need no [T, I] buffer for the
// gate product: swiglu_sliced multiplies chunk by chunk (4-bit, no bias, equal shapes).
bool CudaBackend::linear_swiglu_needs_tmp(const Weight& gate, const Weight& up, int64_t rows, bool bias) const {
  const auto* g = dynamic_cast<const CudaQ4*>(&gate);
  const auto* u = dynamic_cast<const CudaQ4*>(&up);
  if (bias || !g || !u || g->fallback || u->fallback || g->dev.rows != u->dev.rows || g->dev.cols != u->dev.cols ||
      g->dev.rows % 8)  // silu_mul_cols: 16-byte column slices
    return true;
  if (seq_q4(gate, rows) || stream_q4(gate, rows) || (rows <= gemv_max_rows_ && act_ != DType::F32) ||
      fused_q4_rows(rows))
    return true;
  return dequant_chunk_rows(g->dev, rows) >= g->dev.rows;
}

// out = silu(x G^T) * (x U^T), one chunk of weight rows at a time: the gate chunk's product into
// swiglu_tmp_ [T, chunk], the up chunk's into out's column slice, then silu_mul_cols over the
// slice. Each product is gemm_q4's for that chunk (the same dequantize and cuBLAS call per chunk),
// so the gate buffer is T x chunk instead of T x I (H200, Llama-3-8B at 4096 rows: 32 MiB, not 112).
void CudaBackend::swiglu_sliced(Act x, const cuda::Q4Device& g, const cuda::Q4Device& u, Act out) {
  const int64_t T = x.rows, chunk = dequant_chunk_rows(g, T);
  const size_t es = dtype_size(act_);
  reserve_dequant_scratch(g, T);
  if (!swiglu_tmp_ || swiglu_tmp_->bytes() < size_t(T * chunk) * es) {
    NF4FLASH_CHECK(!capturing_, "linear_swiglu: its gate chunk buffer must be allocated before graph capture");
    sync();  // products still in flight may read the old buffer
    swiglu_tmp_.reset();
    swiglu_tmp_ = std::make_unique<CudaBuffer>(size_t(T * chunk) * es);
  }
  for (int64_t n0 = 0; n0 < g.rows; n0 += chunk) {
    const int64_t nc = std::min(chunk, g.rows - n0);
    const Act gt{swiglu_tmp_->data(), act_, T, nc};
    gemm_q4_rows(g, n0, nc, x, gt, 0);
    gemm_q4_rows(u, n0, nc, x, out, n0);
    silu_mul_cols(gt.data, nc, static_cast<char*>(out.data) + size_t(n0) * es, out.cols, T, nc, act_, stream_);
  }
}

void CudaBackend::linear_swiglu(Act x, const Weight& gate, const Weight* bg, const Weight& up, const Weight* bu,
                                Act g_tmp, Act out) {
  if (!g_tmp.data) {
    NF4FLASH_CHECK(!linear_swiglu_needs_tmp(gate, up, x.rows, bg || bu), "linear_swiglu: no gate buffer given for ",
                   x.rows, " rows, which need one");
    check_act(x, "linear_swiglu");
    check_linear(x, up, out);
    return swiglu_sliced(x, dynamic_cast<const CudaQ4&>(gate).dev, dynamic_cast<const CudaQ4&>(up).dev, out);
  }
  {
    // the fused GEMM over gate and up in one launch: with the SwiGLU epilogue (opt-in), or into
    // g_tmp and out + silu_mul (what linear + linear + silu_mul give, bit for bit)
    const Weight* ws[2] = {&gate, &up};
    const bool epilogue = q4_fused_swiglu_ && gate.rows() == up.rows();
    GemmQ4MultiArgs a;
    if (out.dtype == act_ && (epilogue || g_tmp.dtype == act_) && gemm_q4_multi_args(x, ws, 2, a)) {
      check_linear(x, gate, epilogue ? out : g_tmp);
      check_linear(x, up, out);
      a.swiglu = epilogue;
      a.bias[0] = bg ? vec_f32(*bg, gate.rows(), "gate bias") : nullptr;
      a.bias[1] = bu ? vec_f32(*bu, up.rows(), "up bias") : nullptr;
      a.out[0] = epilogue ? out.data : g_tmp.data;
      a.out[1] = epilogue ? nullptr : out.data;
      gemm_q4_wgmma_multi(a, stream_);
      if (!epilogue) silu_mul(g_tmp, out, out);
      return;
    }
  }
  {
    const LinearOut gu[2] = {{&gate, bg, out}, {&up, bu, out}};
    if (dense_multi(x, gu, 2, &out)) return;
  }
  const bool seq = seq_q4(gate, x.rows) && seq_q4(up, x.rows);
  GemvQ4MultiArgs a;
  if (!gemv_swiglu_args(x, gate, bg, up, bu, out, seq, a)) return Backend::linear_swiglu(x, gate, bg, up, bu, g_tmp, out);
  if (seq) seq_gemv(a);
  else gemv_q4_multi(a, stream_);
}

std::string CudaBackend::linear_path(const Weight& w, int64_t rows) const {
  if (auto* q = dynamic_cast<const CudaQ4*>(&w)) {
    const std::string qn = cat(quant_type_name(q->quant()), q->double_quant() ? "-dq" : "");
    if (q->fallback) return cat("dense ", dtype_name(act_), " (", qn, " dequantized at load: ", q->fallback_why, ")");
    const int64_t pf_mib = L2PrefetchPlan::configured_bytes(props_.l2CacheSize) >> 20;
    if (q->dev.tile_group)
      return cat("gemv_q4 in-order fused ", qn, " (h8u4d3 T=1, tiles in groups of ", q->dev.tile_group, " column tiles, ",
                 dtype_name(act_), " mma, f32 accum; kernel-bench's layout experiment: other paths refuse it)");
    if (gemv_ablate_ && seq_q4(w, rows))
      return cat("ABLATED gemv_q4 in-order fused ", qn, " (h8u4d3 T=1 less", gemv_ablate_ & 1 ? " the code table" : "",
                 gemv_ablate_ & 2 ? " the absmax path" : "", gemv_ablate_ & 4 ? " the byte permutes and the per-tile x loads" : "",
                 "; kernel-bench's speed-of-light ablation: WRONG RESULTS)");
    if (seq_q4(w, rows))
      return cat("gemv_q4 in-order fused ", qn, " (", gemv_q4_seq_cfg(), ", tile16x64, ", dtype_name(act_),
                 " mma, f32 accum; q/k/v, gate+up+silu and residual fused",
                 gemv_q4_chain_enabled() && pf_mib <= 0 ? "; a layer's GEMVs from o to the next q/k/v in one launch" : "",
                 pf_mib <= 0 ? std::string()
                 : gemv_q4_seq_cfg()[0] == 'w' ? cat("; captured steps prefetch ", pf_mib, " MiB ahead into L2")
                                               : std::string("; the lean kernel issues no L2 prefetch"),
                 ")");
    if (stream_q4(w, rows, true))
      return cat("gemv_q4 stream-K fused ", qn, " (tile16x64, ", dtype_name(act_),
                 " mma, f32 accum; q/k/v, gate+up+silu and residual fused)");
    if (stream_q4(w, rows))
      return cat("gemv_q4 fused ", qn, " (tile16x64, ", dtype_name(act_), " mma, f32 accum; stream-K for q/k/v and gate+up+silu)");
    if (rows <= gemv_max_rows_ && act_ != DType::F32)
      return cat("gemv_q4 fused ", qn, rows > kGemvMaxRows ? cat(" x", (rows + kGemvMaxRows - 1) / kGemvMaxRows, " launches of 8 rows") : std::string(), " (tile16x64, ", dtype_name(act_), " mma, f32 accum)");
    if (fused_q4_rows(rows))
      return cat("gemm_q4 fused ", qn, " (wgmma sm_90a, ", gemm_q4_wgmma_cfg(rows, act_, (q->dev.RT + 7) / 8), ", codes decoded to ",
                 dtype_name(act_), " in registers, f32 accum; last partial wave split along K; q/k/v one launch, gate+up ",
                 q4_fused_swiglu_ ? "+silu one launch" : "one launch + silu_mul", ")");
    // above the fused GEMM's row limit (auto): say that shorter prompts take the fused GEMM
    const std::string below = q4_fused_max_rows_ > gemv_max_rows_
                                  ? cat("; ", gemv_max_rows_ + 1, "-", q4_fused_max_rows_, " rows: gemm_q4 fused wgmma")
                                  : std::string();
    return cat("dequant ", qn, " -> ", dtype_name(act_), " + cublasGemmEx",
               dequant_chunk_bytes_ > 0 && rows >= kDequantChunkMinRows
                   ? cat(" in row chunks of ", dequant_chunk_bytes_ >> 20, " MiB")
                   : std::string(" (whole matrix)"),
               below);
  }
  if (rows <= kGemvMaxRows)
    return cat("gemv_dense ", dtype_name(w.dtype()), " x ", dtype_name(act_),
               dtype_size(w.dtype()) == 2 && act_ != DType::F32 ? " (q/k/v and gate+up+silu fused)" : "");
  return cat("cublasGemmEx ", dtype_name(act_), w.dtype() != act_ ? " (weight converted per call)" : "");
}

}  // namespace nf4flash::cuda_impl
