// NCCL communicator (parallel/nccl_group.h): libnccl.so.2 through dlopen, collectives on the CUDA
// backend's stream. Built where the toolkit carries nccl.h; elsewhere the factory says so.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "backend/cuda/cublas_api.h"
#include "core/error.h"
#include "parallel/nccl_group.h"

#if __has_include(<nccl.h>)
#include <nccl.h>
#define NF4FLASH_NCCL_HEADERS 1
#endif

namespace nf4flash {

#ifdef NF4FLASH_NCCL_HEADERS
namespace {

struct NcclApi {
  ncclResult_t (*get_unique_id)(ncclUniqueId*);
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*comm_abort)(ncclComm_t);
  const char* (*error_string)(ncclResult_t);
};

NcclApi load_nccl() {
  const char* name = "libnccl.so.2";
  std::string why;
  void* h = cuda::open_cuda_library(name, why);
  if (!h) fail("tensor parallel: cannot load NCCL (", name, "): ", why, ". Install NCCL or add its folder to LD_LIBRARY_PATH.");
  auto sym = [&](const char* s) {
    void* p = dlsym(h, s);
    if (!p) fail("tensor parallel: ", name, " has no ", s);
    return p;
  };
  NcclApi a{};
  a.get_unique_id = reinterpret_cast<decltype(a.get_unique_id)>(sym("ncclGetUniqueId"));
  a.comm_init_rank = reinterpret_cast<decltype(a.comm_init_rank)>(sym("ncclCommInitRank"));
  a.all_reduce = reinterpret_cast<decltype(a.all_reduce)>(sym("ncclAllReduce"));
  a.all_gather = reinterpret_cast<decltype(a.all_gather)>(sym("ncclAllGather"));
  a.broadcast = reinterpret_cast<decltype(a.broadcast)>(sym("ncclBroadcast"));
  a.comm_destroy = reinterpret_cast<decltype(a.comm_destroy)>(sym("ncclCommDestroy"));
  a.comm_abort = reinterpret_cast<decltype(a.comm_abort)>(sym("ncclCommAbort"));
  a.error_string = reinterpret_cast<decltype(a.error_string)>(sym("ncclGetErrorString"));
  return a;  // the library stays loaded for the process
}

const NcclApi& nccl() {
  static const NcclApi api = load_nccl();
  return api;
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("NCCL ", what, ": ", nccl().error_string(r));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("tensor parallel: ", what, ": ", cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    default: fail("tensor parallel: NCCL collectives take f32, bf16 or f16 buffers, not ", dtype_name(t));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Backend& be, int rank, int world, const std::vector<uint8_t>& id)
      : rank_(rank), world_(world), stream_(static_cast<cudaStream_t>(be.native_stream())) {
    NF4FLASH_CHECK(be.device() == Device::CUDA && stream_, "tensor parallel over NCCL needs a CUDA backend");
    NF4FLASH_CHECK(id.size() == sizeof(ncclUniqueId), "tensor parallel: the group id has ", id.size(), " bytes, NCCL's has ",
                   sizeof(ncclUniqueId));
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof uid);
    check(nccl().comm_init_rank(&comm_, world, uid, rank), "ncclCommInitRank");
    check(cudaMalloc(&one_, 4), "cudaMalloc");
  }
  ~NcclCommunicator() override {
    if (comm_ && !aborted_) nccl().comm_destroy(comm_);
    if (one_) cudaFree(one_);
    if (stage_) cudaFree(stage_);
  }

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  Device device() const override { return Device::CUDA; }

  void all_reduce_sum(Act buf) override {
    check(nccl().all_reduce(buf.data, buf.data, size_t(buf.numel()), nccl_type(buf.dtype), ncclSum, comm_, stream_),
          "ncclAllReduce");
  }

  void all_gather_cols(Act local, Act out) override {
    const int64_t N = out.cols, widest = (N + world_ - 1) / world_;
    auto begin = [&](int r) { return int64_t(r) * N / world_; };
    NF4FLASH_CHECK(local.rows == out.rows && local.dtype == out.dtype && local.cols == begin(rank_ + 1) - begin(rank_),
                   "all_gather_cols: rank ", rank_, " holds ", local.cols, " of ", N, " columns, not its balanced share");
    const size_t es = dtype_size(out.dtype), block = size_t(out.rows * widest) * es;
    reserve(block * size_t(world_ + 1));
    uint8_t* send = stage_;
    uint8_t* recv = stage_ + block;
    check(cudaMemcpyAsync(send, local.data, local.bytes(), cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
    check(nccl().all_gather(send, recv, block / es, nccl_type(out.dtype), comm_, stream_), "ncclAllGather");
    for (int r = 0; r < world_; ++r) {  // rank r's [rows, c_r] block into its columns of out
      const size_t c = size_t(begin(r + 1) - begin(r));
      check(cudaMemcpy2DAsync(static_cast<uint8_t*>(out.data) + size_t(begin(r)) * es, size_t(N) * es,
                              recv + size_t(r) * block, c * es, c * es, size_t(out.rows), cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpy2DAsync");
    }
  }

  void barrier() override {
    check(nccl().all_reduce(one_, one_, 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce (barrier)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void broadcast_bytes(std::vector<uint8_t>& bytes) override {
    int64_t n = rank_ == 0 ? int64_t(bytes.size()) : 0;
    reserve(std::max<size_t>(8, bytes.size()));
    check(cudaMemcpyAsync(stage_, &n, 8, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    check(nccl().broadcast(stage_, stage_, 8, ncclUint8, 0, comm_, stream_), "ncclBroadcast");
    check(cudaMemcpyAsync(&n, stage_, 8, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    NF4FLASH_CHECK(n >= 0, "broadcast_bytes: rank 0 sent ", n, " bytes");
    reserve(std::max<size_t>(8, size_t(n)));
    if (rank_ == 0)
      check(cudaMemcpyAsync(stage_, bytes.data(), size_t(n), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    check(nccl().broadcast(stage_, stage_, size_t(n), ncclUint8, 0, comm_, stream_), "ncclBroadcast");
    bytes.resize(size_t(n));
    if (rank_ != 0)
      check(cudaMemcpyAsync(bytes.data(), stage_, size_t(n), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  void abort() override {
    if (comm_ && !aborted_) nccl().comm_abort(comm_);
    aborted_ = true;
  }

 private:
  // The staging buffer of all_gather_cols and broadcast_bytes: grown outside graph capture only
  // (a captured step holds its address; the prefill that precedes capture sizes it).
  void reserve(size_t bytes) {
    if (bytes <= stage_bytes_) return;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(stream_, &st), "cudaStreamIsCapturing");
    NF4FLASH_CHECK(st == cudaStreamCaptureStatusNone, "all_gather_cols: the staging buffer would grow during graph capture");
    if (stage_) check(cudaFree(stage_), "cudaFree");
    stage_ = nullptr;
    check(cudaMalloc(&stage_, bytes), "cudaMalloc");
    stage_bytes_ = bytes;
  }

  int rank_, world_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  float* one_ = nullptr;
  uint8_t* stage_ = nullptr;
  size_t stage_bytes_ = 0;
};

}  // namespace

std::vector<uint8_t> nccl_unique_id() {
  ncclUniqueId uid;
  check(nccl().get_unique_id(&uid), "ncclGetUniqueId");
  std::vector<uint8_t> id(sizeof uid);
  std::memcpy(id.data(), &uid, sizeof uid);
  return id;
}

std::unique_ptr<Communicator> make_nccl_communicator(Backend& cuda, int rank, int world, const std::vector<uint8_t>& id) {
  return std::make_unique<NcclCommunicator>(cuda, rank, world, id);
}

#else  // no nccl.h in this CUDA toolkit

std::vector<uint8_t> nccl_unique_id() {
  fail("tensor parallel over NCCL: this nf4flash was built without nccl.h (install NCCL's headers and rebuild)");
}

std::unique_ptr<Communicator> make_nccl_communicator(Backend&, int, int, const std::vector<uint8_t>&) {
  fail("tensor parallel over NCCL: this nf4flash was built without nccl.h (install NCCL's headers and rebuild)");
}

#endif

}  // namespace nf4flash
