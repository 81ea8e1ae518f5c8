// Eager attention (attn_eager.h): per kv head, per chunk of query rows,
//   S[g][r][j] = sum_d Q[r0+r, (h0+g)*hd + d] * K[j, d]         cublasGemmStridedBatchedEx, f32 out
//   P = softmax(S * scale) with the causal mask (soft-capped,      attn_eager_softmax_kernel
//       sliding window: AttnArgs)
//   O[r0+r, (h0+g)*hd + d] = sum_j P[g][r][j] * V[j, d]           cublasGemmStridedBatchedEx
// The batch runs over the q heads of one kv group with K/V stride 0 (GQA without copies).
// With host-known positions a chunk of rows [r0, r0+R) only needs keys [0, pos0 + r0 + R).
#include "backend/cuda/attn_eager.h"

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"

namespace nf4flash::cuda {

namespace {
cudaDataType_t blas_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    default: fail("attention (eager): unsupported dtype ", dtype_name(t));
  }
}
size_t align256(size_t b) { return (b + 255) & ~size_t(255); }
}  // namespace

EagerPlan attention_eager_plan(const AttnArgs& a, int64_t pos0_host) {
  EagerPlan p;
  const int G = a.n_heads / a.n_kv;
  p.L = pos0_host >= 0 ? pos0_host + a.T : a.capacity;
  const size_t per = 4 + dtype_size(a.act);  // bytes per score element (f32 S + P)
  auto rows_fit = [&](int hg) {
    return int(std::min<int64_t>(a.T, int64_t(kEagerScoreBudget / (size_t(hg) * p.L * per))));
  };
  p.heads_per_call = G;
  p.rows_per_chunk = rows_fit(G);
  while (p.rows_per_chunk < std::min(a.T, 64) && p.heads_per_call > 1) {
    p.heads_per_call = (p.heads_per_call + 1) / 2;
    p.rows_per_chunk = rows_fit(p.heads_per_call);
  }
  p.rows_per_chunk = std::max(1, p.rows_per_chunk);
  const size_t elems = size_t(p.heads_per_call) * p.rows_per_chunk * p.L;
  p.s_bytes = align256(elems * 4);
  p.bytes = p.s_bytes + align256(elems * dtype_size(a.act));
  return p;
}

void attention_eager(const AttnArgs& a, int64_t pos0_host, cublasHandle_t h, bool tf32, void* scratch,
                     size_t scratch_bytes, cudaStream_t st) {
  NF4FLASH_CHECK(a.n_kv > 0 && a.n_heads % a.n_kv == 0, "attention: n_heads ", a.n_heads,
                 " not a multiple of n_kv_heads ", a.n_kv);
  NF4FLASH_CHECK(a.kv_dtype == a.act, "attention (eager): the KV cache dtype ", dtype_name(a.kv_dtype),
                 " must equal the compute dtype ", dtype_name(a.act));
  if (a.T == 0) return;
  NF4FLASH_CHECK(pos0_host < 0 || pos0_host + a.T <= a.capacity, "attention (eager): positions ", pos0_host, "+",
                 a.T, " exceed the cache capacity ", a.capacity);
  const EagerPlan p = attention_eager_plan(a, pos0_host);
  NF4FLASH_CHECK(scratch_bytes >= p.bytes, "attention (eager): score buffer of ", scratch_bytes >> 20,
                 " MiB, need ", p.bytes >> 20, " MiB");
  const int G = a.n_heads / a.n_kv, hd = a.head_dim;
  const size_t elt = dtype_size(a.act);
  const cudaDataType_t at = blas_type(a.act);
  const cublasComputeType_t ct = (a.act == DType::F32 && tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  float* S = static_cast<float*>(scratch);
  void* P = static_cast<char*>(scratch) + p.s_bytes;
  const float one = 1.f, zero = 0.f;
  const size_t kv_head_bytes = size_t(a.capacity) * hd * elt;
  for (int kvh = 0; kvh < a.n_kv; ++kvh) {
    const char* K = static_cast<const char*>(a.k_cache) + kvh * kv_head_bytes;
    const char* V = static_cast<const char*>(a.v_cache) + kvh * kv_head_bytes;
    for (int g0 = 0; g0 < G; g0 += p.heads_per_call) {
      const int hg = std::min(p.heads_per_call, G - g0), h0 = kvh * G + g0;
      for (int r0 = 0; r0 < a.T; r0 += p.rows_per_chunk) {
        const int R = std::min(p.rows_per_chunk, a.T - r0);
        const int64_t L = pos0_host >= 0 ? pos0_host + r0 + R : a.capacity;
        const char* Q = static_cast<const char*>(a.q) + (size_t(r0) * a.q_stride + size_t(h0) * hd) * elt;
        CUBLAS_CHECK(cublas().gemm_strided_batched_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, int(L), R, hd, &one, K, at, hd, 0, Q, at,
                                                int(a.q_stride), hd, &zero, S, CUDA_R_32F, int(L), int64_t(R) * L,
                                                hg, ct, CUBLAS_GEMM_DEFAULT));
        EagerSoftmaxArgs sa;
        sa.s = S;
        sa.p = P;
        sa.p_dtype = a.act;
        sa.heads = hg;
        sa.rows = R;
        sa.L = L;
        sa.row0 = r0;
        sa.scale = a.scale;
        sa.softcap = a.softcap;
        sa.window = a.window;
        sa.pos0 = a.pos0;
        attention_eager_softmax(sa, st);
        char* O = static_cast<char*>(a.out) + (size_t(r0) * a.out_stride + size_t(h0) * hd) * elt;
        CUBLAS_CHECK(cublas().gemm_strided_batched_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, hd, R, int(L), &one, V, at, hd, 0, P, at,
                                                int(L), int64_t(R) * L, &zero, O, at, int(a.out_stride), hd, hg, ct,
                                                CUBLAS_GEMM_DEFAULT));
      }
    }
  }
}

}  // namespace nf4flash::cuda
