// Host side of TMA tensor maps for the sm_90a kernels: the driver's cuTensorMapEncodeTiled (looked
// up once through the runtime) and a 2D map over a row-major array.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>

#include "backend/cuda/cuda_common.cuh"

namespace nf4flash::cuda {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    NF4FLASH_CHECK(q == cudaDriverEntryPointSuccess && p, "tensor map: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A 2D tensor map over a row-major [rows, inner] array (row stride in bytes), boxes of
// box_inner x box_rows elements; out-of-range elements read as zeros.
inline CUtensorMap tensor_map_2d(CUtensorMapDataType dt, const void* base, int64_t inner, int64_t rows,
                                 int64_t row_bytes, uint32_t box_inner, uint32_t box_rows, CUtensorMapSwizzle swz,
                                 const char* what) {
  CUtensorMap map;
  const cuuint64_t gdim[2] = {cuuint64_t(inner), cuuint64_t(rows)};
  const cuuint64_t gstride[1] = {cuuint64_t(row_bytes)};
  const cuuint32_t box[2] = {box_inner, box_rows}, estride[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, dt, 2, const_cast<void*>(base), gdim, gstride, box, estride,
                                          CU_TENSOR_MAP_INTERLEAVE_NONE, swz, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  NF4FLASH_CHECK(r == CUDA_SUCCESS, "tensor map: cuTensorMapEncodeTiled failed (", int(r), ") for ", what, " [", rows,
                 ", ", inner, "]");
  return map;
}

}  // namespace nf4flash::cuda
