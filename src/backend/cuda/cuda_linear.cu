// CudaBackend's linear products: plan() decides the kernel path of a weight at a row count
// (LinearPlan, cuda_backend_impl.h), and linear() and its fused forms dispatch on it; linear_path()
// names it. Measurements behind the thresholds: docs/performance.md.
#include "backend/cuda/cuda_backend_impl.h"

namespace nf4flash::cuda_impl {

const CudaQ4* CudaBackend::tiled_q4(const Weight& w) {
  auto* q = dynamic_cast<const CudaQ4*>(&w);
  return q && !q->fallback ? q : nullptr;
}

LinearPlan CudaBackend::plan(const Weight& w, int64_t rows) const {
  if (tiled_q4(w)) {
    const bool gemv = act_ != DType::F32 && rows <= tuning_.gemv_max_rows;
    if (gemv && rows <= kGemvMaxRows) return LinearPlan::Q4Decode;
    if (gemv) return LinearPlan::Q4Gemv;
    if (act_ != DType::F32 && tuning_.q4_gemm == Q4GemmMode::Auto && rows <= q4_skinny_max_rows_)
      return LinearPlan::Q4Skinny;
    if (q4_gemm_fused_ && rows <= q4_fused_max_rows_) return LinearPlan::Q4FusedGemm;
    return LinearPlan::Q4DequantGemm;
  }
  return rows <= kGemvMaxRows ? LinearPlan::DenseGemv : LinearPlan::DenseGemm;
}

bool CudaBackend::same_q4_params(const CudaQ4& a, const CudaQ4& b, bool cols) {
  const Q4Device &x = a.dev, &y = b.dev;
  return (!cols || x.cols == y.cols) && x.double_quant == y.double_quant && x.log2_blocksize == y.log2_blocksize &&
         x.log2_nested == y.log2_nested && std::equal(x.code, x.code + 16, y.code) &&
         a.nested_code_host == b.nested_code_host;
}

void CudaBackend::check_linear(const Act& x, const Weight& w, const Act& out) const {
  check_act(x, "linear");
  NF4FLASH_CHECK(out.dtype == act_ || out.dtype == DType::F32, "linear: output dtype ", dtype_name(out.dtype));
  NF4FLASH_CHECK(x.cols == w.cols() && out.cols == w.rows() && out.rows == x.rows, "linear: x [", x.rows, ", ",
                 x.cols, "] * W[", w.rows(), ", ", w.cols(), "]^T -> out [", out.rows, ", ", out.cols, "]");
}

// ---- GEMM paths ---------------------------------------------------------------------------------

// out[T, n0 : n0+N] = x[T, K] * W[N, K]^T  (column-major view: out^T = W^T' * x^T, ldc = out.cols)
void CudaBackend::gemm(const void* w, int64_t N, int64_t K, Act x, Act out, int64_t n0) {
  const float alpha = 1.f, beta = 0.f;
  const cublasComputeType_t ct = (act_ == DType::F32 && tf32_) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  void* c = static_cast<char*>(out.data) + n0 * int64_t(dtype_size(out.dtype));
  CUBLAS_CHECK(cublas().gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(x.rows), int(K), &alpha, w,
                            cuda_type(act_), int(K), x.data, cuda_type(act_), int(K), &beta, c,
                            cuda_type(out.dtype), int(out.cols), ct, CUBLAS_GEMM_DEFAULT));
}

int64_t CudaBackend::dequant_chunk_rows(const Q4Device& d, int64_t T) const {
  if (dequant_chunk_bytes_ <= 0 || T < kDequantChunkMinRows) return d.rows;
  const int64_t r = dequant_chunk_bytes_ / (d.cols * int64_t(dtype_size(act_))) / 16 * 16;
  return std::clamp<int64_t>(r, 16, d.rows);
}

// The dequantize scratch for products of T rows with d (gemm_q4, swiglu_sliced), reserved once for
// all weights: the largest whole matrix, or (products that chunk) at most the chunk bytes, also
// when this weight fits in one chunk (q: 4096 x 4096 = 32 MiB). Grows only, outside graph capture.
void CudaBackend::reserve_dequant_scratch(const Q4Device& d, int64_t T) {
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
void CudaBackend::gemm_q4_rows(const Q4Device& d, int64_t n0, int64_t nc, Act x, Act out, int64_t c0) {
  q4_dequant(d, scratch_->data(), act_, stream_, n0, nc);
  gemm(scratch_->data(), nc, d.cols, x, out, c0);
}

// Dequantize a chunk of weight rows into the scratch, multiply it into its output columns, next.
void CudaBackend::gemm_q4(const Q4Device& d, Act x, Act out) {
  const int64_t chunk = dequant_chunk_rows(d, x.rows);
  reserve_dequant_scratch(d, x.rows);
  for (int64_t n0 = 0; n0 < d.rows; n0 += chunk) gemm_q4_rows(d, n0, std::min(chunk, d.rows - n0), x, out, n0);
}

// The split workspace of both 4-bit GEMMs (the fused GEMM's split tail, the skinny GEMM's units cut
// between blocks): f32 slices and counters every launch leaves zero, grown to the largest need so far
// (never inside a captured step; the stream is synchronized first, as a launch in flight may still
// use the old buffers). Runs whose products take neither GEMM do not hold it.
Q4SplitWs CudaBackend::q4_split_ws(int64_t floats, int64_t tickets) const {
  const int64_t have_f = split_ws_ ? int64_t(split_ws_->bytes() / 4) : 0;
  const int64_t have_t = split_tickets_ ? int64_t(split_tickets_->bytes() / 4) : 0;
  if (floats > have_f || tickets > have_t) {
    NF4FLASH_CHECK(!capturing_, "4-bit GEMM: its split workspace must be allocated before graph capture");
    if (split_ws_) CUDA_CHECK(cudaStreamSynchronize(stream_));
    floats = std::max(floats, have_f);
    tickets = std::max(tickets, have_t);
    renew_workspace(split_ws_, size_t(floats) * 4);
    renew_workspace(split_tickets_, size_t(tickets) * 4);
    CUDA_CHECK(cudaMemsetAsync(split_tickets_->data(), 0, split_tickets_->bytes(), stream_));
  }
  return {static_cast<float*>(split_ws_->data()), int64_t(split_ws_->bytes() / 4),
          static_cast<int*>(split_tickets_->data()), int64_t(split_tickets_->bytes() / 4)};
}

// The fused GEMM's view of it: kSplitWsFloats / kSplitTickets, whatever the skinny GEMM grew it to
// (the fused GEMM's schedule, which splits only what fits, is chosen for that size).
Q4SplitWs CudaBackend::split_ws() const {
  if (!q4_gemm_fused_) return {};
  Q4SplitWs w = q4_split_ws(kSplitWsFloats, kSplitTickets);
  w.floats = kSplitWsFloats;
  w.n_tickets = kSplitTickets;
  return w;
}

// ws[0..n) as 4-bit device weights that share one launch: each planned p at x's rows, all with the
// same quantization parameters (out[i] = ws[i]'s); false otherwise.
bool CudaBackend::q4_group(Act x, const Weight* const* ws, int n, LinearPlan p, const Q4Device** out) const {
  if (n < 1 || n > 3) return false;
  const CudaQ4* q0 = nullptr;
  for (int i = 0; i < n; ++i) {
    const CudaQ4* q = tiled_q4(*ws[i]);
    if (!q || plan(*q, x.rows) != p || (q0 && !same_q4_params(*q0, *q))) return false;
    if (!q0) q0 = q;
    out[i] = &q->dev;
  }
  return true;
}

// The fused GEMM over several 4-bit weights (q/k/v, gate+up).
bool CudaBackend::gemm_q4_multi_args(Act x, const Weight* const* ws, int n, GemmQ4MultiArgs& a) const {
  if (!q4_group(x, ws, n, LinearPlan::Q4FusedGemm, a.w)) return false;
  a.nseg = n;
  a.x = x.data;
  a.act = act_;
  a.T = x.rows;
  a.split = split_ws();
  return true;
}

// The skinny GEMM over several 4-bit weights, and its launch (with the split workspace it needs).
bool CudaBackend::skinny_args(Act x, const Weight* const* ws, int n, GemmQ4SkinnyArgs& a) const {
  if (!q4_group(x, ws, n, LinearPlan::Q4Skinny, a.w)) return false;
  a.nseg = n;
  a.x = x.data;
  a.act = act_;
  a.T = int(x.rows);
  a.wgmma = q4_skinny_wgmma_;
  return true;
}

void CudaBackend::run_skinny(GemmQ4SkinnyArgs& a) {
  const GemmQ4SkinnyWs need = gemm_q4_skinny_ws_needed(a);
  a.ws = q4_split_ws(need.floats, need.n_tickets);
  gemm_q4_skinny(a, stream_);
}

// ---- decode GEMVs ---------------------------------------------------------------------------------

// The decode GEMV's arguments every form shares: x, its rows, the compute dtype.
static GemvQ4DecodeArgs decode_base(Act x, DType act) {
  GemvQ4DecodeArgs a;
  a.x = x.data;
  a.act = act;
  a.T = int(x.rows);
  a.out_dtype = act;
  return a;
}

// The decode GEMV's arguments for n (<= kGemvMaxSegs) 4-bit weights sharing x (Store).
bool CudaBackend::decode_multi_args(Act x, const LinearOut* outs, int n, GemvQ4DecodeArgs& a) const {
  if (n < 1 || n > kGemvMaxSegs) return false;
  const CudaQ4* q[kGemvMaxSegs] = {};
  for (int i = 0; i < n; ++i) {
    q[i] = tiled_q4(*outs[i].w);
    if (!q[i] || plan(*q[i], x.rows) != LinearPlan::Q4Decode || outs[i].out.dtype != act_ ||
        !same_q4_params(*q[0], *q[i]))
      return false;
  }
  a = decode_base(x, act_);
  a.nseg = n;
  for (int i = 0; i < n; ++i) {
    check_linear(x, *outs[i].w, outs[i].out);
    a.w[i] = &q[i]->dev;
    a.bias[i] = outs[i].bias ? vec_f32(*outs[i].bias, outs[i].w->rows(), "linear bias") : nullptr;
    a.out[i] = outs[i].out.data;
  }
  return true;
}

// gate+up with the SwiGLU epilogue in one decode GEMV launch.
bool CudaBackend::decode_swiglu_args(Act x, const Weight& gate, const Weight* bg, const Weight& up, const Weight* bu,
                                     Act out, GemvQ4DecodeArgs& a) const {
  const CudaQ4* qg = tiled_q4(gate);
  const CudaQ4* qu = tiled_q4(up);
  if (!qg || !qu || plan(gate, x.rows) != LinearPlan::Q4Decode || plan(up, x.rows) != LinearPlan::Q4Decode ||
      out.dtype != act_ || gate.rows() != up.rows() || !same_q4_params(*qg, *qu))
    return false;
  check_linear(x, gate, out);
  check_linear(x, up, out);
  a = decode_base(x, act_);
  a.ep = GemvEpilogue::SwiGLU;
  a.nseg = 2;
  a.w[0] = &qg->dev;
  a.w[1] = &qu->dev;
  a.bias[0] = bg ? vec_f32(*bg, gate.rows(), "gate bias") : nullptr;
  a.bias[1] = bu ? vec_f32(*bu, up.rows(), "up bias") : nullptr;
  a.out[0] = out.data;
  return true;
}

// resid += x W^T + b in one decode GEMV launch.
bool CudaBackend::decode_residual_args(Act x, const Weight& w, const Weight* bias, Act resid, GemvQ4DecodeArgs& a) const {
  const CudaQ4* q = tiled_q4(w);
  if (!q || plan(w, x.rows) != LinearPlan::Q4Decode || resid.dtype != act_) return false;
  check_linear(x, w, resid);
  a = decode_base(x, act_);
  a.ep = GemvEpilogue::Residual;
  a.w[0] = &q->dev;
  a.bias[0] = bias ? vec_f32(*bias, q->rows(), "linear bias") : nullptr;
  a.out[0] = resid.data;
  return true;
}

// Whether the decode GEMV on w at `rows` rows folds the rms_norm of its input into its prologue.
bool CudaBackend::norm_fusable(const Weight& w, int64_t rows) const {
  return tuning_.fuse_norm && plan(w, rows) == LinearPlan::Q4Decode && gemv_q4_norm_fusable(rows, w.cols());
}

bool CudaBackend::fuses_norm_linear(const Weight& w, int64_t rows) const { return norm_fusable(w, rows); }

// ---- dense GEMVs ----------------------------------------------------------------------------------

// Dense 16-bit weights at decode row counts: the n outputs in one launch of the dense multi-weight
// GEMV (swiglu_out: gate = outs[0], up = outs[1], silu(gate) * up into *swiglu_out); false when
// they do not qualify or CudaTuning::dense_multi is off (then one launch per weight).
bool CudaBackend::dense_multi(Act x, const LinearOut* outs, int n, const Act* swiglu_out) {
  if (!tuning_.dense_multi || x.rows < 1 || x.rows > kGemvMaxRows || n < 1 || n > 3 || x.dtype != act_) return false;
  cuda::GemvDenseMultiArgs a;
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
    if (o.dtype != act_) return false;
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

// The dense single-weight decode GEMV (x.rows <= kGemvMaxRows).
void CudaBackend::dense_gemv(const CudaDense& d, Act x, const float* bias, Act out) {
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
  gemv_dense(a, stream_);
}

// ---- linear and its fused forms -------------------------------------------------------------------

void CudaBackend::linear(Act x, const Weight& w, const Weight* bias, Act out) {
  check_linear(x, w, out);
  if (x.rows == 0) return;
  const float* b = bias ? vec_f32(*bias, w.rows(), "linear bias") : nullptr;
  const LinearPlan p = plan(w, x.rows);
  const CudaQ4* q = tiled_q4(w);
  switch (p) {
    case LinearPlan::Q4Decode: {
      GemvQ4DecodeArgs a = decode_base(x, act_);
      a.w[0] = &q->dev;
      a.bias[0] = b;
      a.out[0] = out.data;
      a.out_dtype = out.dtype;
      gemv_q4_decode(a, stream_);
      return;
    }
    case LinearPlan::Q4Gemv:
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
    case LinearPlan::Q4Skinny: {
      GemmQ4SkinnyArgs a;
      const Weight* ws[1] = {&w};
      NF4FLASH_CHECK(skinny_args(x, ws, 1, a), "linear: the skinny 4-bit GEMM rejected its own plan");
      a.bias[0] = b;
      a.out[0] = out.data;
      a.out_dtype = out.dtype;
      return run_skinny(a);
    }
    case LinearPlan::Q4FusedGemm: {
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
    }
    case LinearPlan::Q4DequantGemm:
      gemm_q4(q->dev, x, out);
      if (b) bias_add(out.data, out.dtype, b, out.rows, out.cols, stream_);
      return;
    case LinearPlan::DenseGemv:
    case LinearPlan::DenseGemm:
      break;
  }
  // dense weights, and 4-bit weights dequantized at load
  const auto* qf = dynamic_cast<const CudaQ4*>(&w);
  const CudaDense& d = as_dense(qf ? *qf->fallback : w, "linear");
  if (p == LinearPlan::DenseGemv) return dense_gemv(d, x, b, out);
  const void* wd = d.data->data();
  if (d.dtype() != act_) {
    convert(wd, d.dtype(), scratch_->data(), act_, d.rows() * d.cols(), stream_);
    wd = scratch_->data();
  }
  gemm(wd, d.rows(), d.cols(), x, out);
  if (b) bias_add(out.data, out.dtype, b, out.rows, out.cols, stream_);
}

void CudaBackend::linear_multi(Act x, const LinearOut* outs, int n) {
  if (n >= 1 && n <= 3) {
    const Weight* ws[3] = {};
    bool same_dtype = true;
    for (int i = 0; i < n; ++i) {
      ws[i] = outs[i].w;
      same_dtype = same_dtype && outs[i].out.dtype == act_;
    }
    GemmQ4SkinnyArgs k;
    if (same_dtype && skinny_args(x, ws, n, k)) {
      for (int i = 0; i < n; ++i) {
        check_linear(x, *outs[i].w, outs[i].out);
        k.bias[i] = outs[i].bias ? vec_f32(*outs[i].bias, outs[i].w->rows(), "linear bias") : nullptr;
        k.out[i] = outs[i].out.data;
      }
      k.out_dtype = act_;
      return run_skinny(k);
    }
    GemmQ4MultiArgs g;
    if (same_dtype && gemm_q4_multi_args(x, ws, n, g)) {
      for (int i = 0; i < n; ++i) {
        check_linear(x, *outs[i].w, outs[i].out);
        g.bias[i] = outs[i].bias ? vec_f32(*outs[i].bias, outs[i].w->rows(), "linear bias") : nullptr;
        g.out[i] = outs[i].out.data;
      }
      return gemm_q4_wgmma_multi(g, stream_);
    }
  }
  if (dense_multi(x, outs, n, nullptr)) return;
  GemvQ4DecodeArgs a;
  if (decode_multi_args(x, outs, n, a)) return gemv_q4_decode(a, stream_);
  Backend::linear_multi(x, outs, n);
}

void CudaBackend::rms_norm_linear_multi(Act x, const Weight& norm_w, float eps, Act xn, const LinearOut* outs, int n) {
  GemvQ4DecodeArgs a;
  if (n >= 1 && x.dtype == act_ && norm_fusable(*outs[0].w, x.rows) && decode_multi_args(x, outs, n, a)) {
    a.norm_w = vec_f32(norm_w, x.cols, "rms_norm weight");
    a.norm_eps = eps;
    return gemv_q4_decode(a, stream_);
  }
  Backend::rms_norm_linear_multi(x, norm_w, eps, xn, outs, n);
}

void CudaBackend::rms_norm_linear_swiglu(Act x, const Weight& norm_w, float eps, Act xn, const Weight& gate,
                                         const Weight* bg, const Weight& up, const Weight* bu, Act g_tmp, Act out) {
  GemvQ4DecodeArgs a;
  if (x.dtype == act_ && norm_fusable(gate, x.rows) && decode_swiglu_args(x, gate, bg, up, bu, out, a)) {
    a.norm_w = vec_f32(norm_w, x.cols, "rms_norm weight");
    a.norm_eps = eps;
    return gemv_q4_decode(a, stream_);
  }
  Backend::rms_norm_linear_swiglu(x, norm_w, eps, xn, gate, bg, up, bu, g_tmp, out);
}

void CudaBackend::linear_residual(Act x, const Weight& w, const Weight* bias, Act tmp, Act resid) {
  GemvQ4DecodeArgs a;
  if (decode_residual_args(x, w, bias, resid, a)) return gemv_q4_decode(a, stream_);
  Backend::linear_residual(x, w, bias, tmp, resid);
}

// Prompt chunks that take dequantize + cuBLAS in row chunks (gemm_q4) need no [T, I] buffer for the
// gate product: swiglu_sliced multiplies chunk by chunk (4-bit, no bias, equal shapes).
bool CudaBackend::linear_swiglu_needs_tmp(const Weight& gate, const Weight& up, int64_t rows, bool bias) const {
  const CudaQ4* g = tiled_q4(gate);
  const CudaQ4* u = tiled_q4(up);
  if (bias || !g || !u || g->dev.rows != u->dev.rows || g->dev.cols != u->dev.cols ||
      g->dev.rows % 8)  // silu_mul_cols: 16-byte column slices
    return true;
  if (plan(gate, rows) != LinearPlan::Q4DequantGemm) return true;
  return dequant_chunk_rows(g->dev, rows) >= g->dev.rows;
}

// out = silu(x G^T) * (x U^T), one chunk of weight rows at a time: the gate chunk's product into
// swiglu_tmp_ [T, chunk], the up chunk's into out's column slice, then silu_mul_cols over the
// slice. Each product is gemm_q4's for that chunk (the same dequantize and cuBLAS call per chunk),
// so the gate buffer is T x chunk instead of T x I (H200, Llama-3-8B at 4096 rows: 32 MiB, not 112).
void CudaBackend::swiglu_sliced(Act x, const Q4Device& g, const Q4Device& u, Act out) {
  const int64_t T = x.rows, chunk = dequant_chunk_rows(g, T);
  const size_t es = dtype_size(act_);
  reserve_dequant_scratch(g, T);
  if (!swiglu_tmp_ || swiglu_tmp_->bytes() < size_t(T * chunk) * es) {
    NF4FLASH_CHECK(!capturing_, "linear_swiglu: its gate chunk buffer must be allocated before graph capture");
    sync();  // products still in flight may read the old buffer
    renew_workspace(swiglu_tmp_, size_t(T * chunk) * es);
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
    return swiglu_sliced(x, tiled_q4(gate)->dev, tiled_q4(up)->dev, out);
  }
  {
    // the fused GEMM over gate and up in one launch into g_tmp and out, then silu_mul (what linear
    // + linear + silu_mul give, bit for bit)
    const Weight* ws[2] = {&gate, &up};
    GemmQ4SkinnyArgs k;
    if (out.dtype == act_ && g_tmp.dtype == act_ && skinny_args(x, ws, 2, k)) {
      check_linear(x, gate, g_tmp);
      check_linear(x, up, out);
      k.bias[0] = bg ? vec_f32(*bg, gate.rows(), "gate bias") : nullptr;
      k.bias[1] = bu ? vec_f32(*bu, up.rows(), "up bias") : nullptr;
      k.out[0] = g_tmp.data;
      k.out[1] = out.data;
      k.out_dtype = act_;
      run_skinny(k);
      return silu_mul(g_tmp, out, out);
    }
    GemmQ4MultiArgs a;
    if (out.dtype == act_ && g_tmp.dtype == act_ && gemm_q4_multi_args(x, ws, 2, a)) {
      check_linear(x, gate, g_tmp);
      check_linear(x, up, out);
      a.bias[0] = bg ? vec_f32(*bg, gate.rows(), "gate bias") : nullptr;
      a.bias[1] = bu ? vec_f32(*bu, up.rows(), "up bias") : nullptr;
      a.out[0] = g_tmp.data;
      a.out[1] = out.data;
      gemm_q4_wgmma_multi(a, stream_);
      return silu_mul(g_tmp, out, out);
    }
  }
  {
    const LinearOut gu[2] = {{&gate, bg, out}, {&up, bu, out}};
    if (dense_multi(x, gu, 2, &out)) return;
  }
  GemvQ4DecodeArgs a;
  if (decode_swiglu_args(x, gate, bg, up, bu, out, a)) return gemv_q4_decode(a, stream_);
  Backend::linear_swiglu(x, gate, bg, up, bu, g_tmp, out);
}

// ---- the reported path -----------------------------------------------------------------------------

std::string CudaBackend::linear_path(const Weight& w, int64_t rows) const {
  const std::string act = std::string(dtype_name(act_));
  auto* q4 = dynamic_cast<const CudaQ4*>(&w);
  const std::string qn = q4 ? cat(quant_type_name(q4->quant()), q4->double_quant() ? "-dq" : "") : std::string();
  const std::string dq_note = q4 && q4->fallback ? cat(" (", qn, " dequantized at load: ", q4->fallback_why, ")") : "";
  switch (plan(w, rows)) {
    case LinearPlan::Q4Decode:
      return cat("gemv_q4_decode ", qn, " (tile16x64, ", act, " mma, f32 accum; q/k/v, gate+up+silu and residual fused",
                 tuning_.fuse_norm ? ", rms_norm in the prologue" : "", ")");
    case LinearPlan::Q4Gemv:
      return cat("gemv_q4 ", qn, " x", (rows + kGemvMaxRows - 1) / kGemvMaxRows, " launches of 8 rows (tile16x64, ", act,
                 " mma, f32 accum)");
    case LinearPlan::Q4Skinny:
      return cat("gemm_q4_skinny ", qn, " (tile16x64, ", act, q4_skinny_wgmma_ && gemm_q4_skinny_wgmma_rows(rows) ? " wgmma sm_90a" : " mma.sync",
                 ", f32 accum, stream-K over all SMs; q/k/v one launch, gate+up one launch + silu_mul)");
    case LinearPlan::Q4FusedGemm:
      return cat("gemm_q4 fused ", qn, " (wgmma sm_90a, ", gemm_q4_wgmma_cfg(rows, act_, (q4->dev.RT + 7) / 8, q4->dev.cols),
                 ", codes decoded to ", act, " in registers, f32 accum; last partial wave split along K; q/k/v one "
                 "launch, gate+up one launch + silu_mul)");
    case LinearPlan::Q4DequantGemm: {
      // above the fused GEMM's row limit: say that shorter prompts take the fused GEMM
      const std::string below = q4_fused_max_rows_ > tuning_.gemv_max_rows
                                    ? cat("; ", tuning_.gemv_max_rows + 1, "-", q4_fused_max_rows_, " rows: gemm_q4 fused wgmma")
                                    : std::string();
      return cat("dequant ", qn, " -> ", act, " + cublasGemmEx",
                 dequant_chunk_bytes_ > 0 && rows >= kDequantChunkMinRows
                     ? cat(" in row chunks of ", dequant_chunk_bytes_ >> 20, " MiB")
                     : std::string(" (whole matrix)"),
                 below);
    }
    case LinearPlan::DenseGemv: {
      const DType wd = q4 ? act_ : w.dtype();
      return cat("gemv_dense ", dtype_name(wd), " x ", act,
                 dtype_size(wd) == 2 && act_ != DType::F32 && tuning_.dense_multi ? " (q/k/v and gate+up+silu fused)" : "",
                 dq_note);
    }
    case LinearPlan::DenseGemm: {
      const DType wd = q4 ? act_ : w.dtype();
      return cat("cublasGemmEx ", act, wd != act_ ? " (weight converted per call)" : "", dq_note);
    }
  }
  return "?";
}

}  // namespace nf4flash::cuda_impl
