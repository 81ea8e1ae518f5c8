// Tensor parallel over NCCL, one process per GPU: the group's id (rank 0 makes it and hands it to
// the others through parallel/rendezvous.h) and a Communicator whose collectives run on a CUDA
// backend's stream. libnccl.so.2 is loaded with dlopen on first use, so a binary without NCCL
// runs everything else; without it (or without a CUDA build) these are one clear error.
//
//   all_reduce_sum:  ncclAllReduce (sum) in place, f32 / bf16 / f16.
//   all_gather_cols: the ranks' column blocks (balanced split of out.cols: rank r holds columns
//                    [r*N/world, (r+1)*N/world)) gathered padded to the widest block by
//                    ncclAllGather into a staging buffer, then copied into place row by row.
//   barrier:         a one-element all-reduce, then the stream synchronized.
//   broadcast_bytes: the size, then the bytes, each ncclBroadcast from rank 0 through device
//                    staging memory, the stream synchronized (host bytes in and out).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace nf4flash {

std::vector<uint8_t> nccl_unique_id();
// `cuda`: this rank's CUDA backend (its device current); every rank passes rank 0's id.
std::unique_ptr<Communicator> make_nccl_communicator(Backend& cuda, int rank, int world, const std::vector<uint8_t>& id);

}  // namespace nf4flash
