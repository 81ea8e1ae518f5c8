// nf4flash-kernel-bench: the reference every bandwidth row is compared with. A device-to-device
// cudaMemcpy of 2 GiB (bytes read + bytes written), 3 warm-up copies, then the median of `trials`
// copies, each timed on the host clock around the copy and a device synchronize.
#include <chrono>
#include <vector>

#include "bench.h"

namespace nf4flash::kbench {

double copy_reference(Context& c) {
  const size_t bytes = size_t(1) << 31;
  auto src = c.be.alloc(bytes), dst = c.be.alloc(bytes);
  cuda_check(cudaMemset(src->data(), 1, bytes), "copy reference: cudaMemset");
  cuda_check(cudaMemset(dst->data(), 2, bytes), "copy reference: cudaMemset");
  cuda_check(cudaDeviceSynchronize(), "copy reference: cudaDeviceSynchronize");
  std::vector<double> t;
  for (int k = 0; k < 3 + c.trials; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    cuda_check(cudaMemcpy(dst->data(), src->data(), bytes, cudaMemcpyDeviceToDevice), "copy reference: cudaMemcpy");
    cuda_check(cudaDeviceSynchronize(), "copy reference: cudaDeviceSynchronize");
    if (k >= 3) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double sec = median(t), gbs = 2.0 * double(bytes) / sec / 1e9;
  c.report.set_copy_gb_per_s(gbs);
  c.report.section("copy", "reference: device-to-device copy");
  c.report.row("d2d copy 2 GiB (read + write)", sec, 2.0 * double(bytes), 0, {{"copy_bytes", bytes}});
  return gbs;
}

}  // namespace nf4flash::kbench
