// The rates a placement's prediction uses, measured on this machine at start: each backend's own
// linear ops on one layer's weights of the model's shapes (q, k, v, o, gate, up, down) in the
// plan's storage, in order (one row: bytes/s, replayed as a graph where the backend has them;
// prompt rows: FLOP/s), a dense GEMV (lm_head, KV reads), a small op's cost (launch or dispatch,
// graphed and not), and the host <-> GPU copy. Then the predicted decode step and TTFT of a
// placement from its bytes.
#pragma once
#include <string>

#include "backend/backend.h"
#include "io/hf_config.h"
#include "model/decoder.h"
#include "runtime/placement.h"

namespace nf4flash {

struct BackendRates {
  double gemv_bytes_s = 0;        // a layer's linears over one row, the plan's weights (4-bit or dense)
  double gemv_dense_bytes_s = 0;  // one dense [intermediate, hidden] GEMV (lm_head, the KV cache's reads)
  double gemm_flop_s = 0;         // a layer's linears over the prompt rows, the plan's weights
  double op_s = 0;                // one small op issued directly
  double op_graph_s = 0;          // the same replayed from a CUDA graph (op_s where none)
};

// Times `be`'s linears on one layer's weights stored as `p` says, over 1 and `prompt_rows` rows.
// On the CPU the one-row rates cycle through copies of the weights (2 GiB at least, 16 copies at
// most) so that they stream from memory as a decode step does, and take the median of 5 passes.
// Takes ~0.2 s on a GPU and a few seconds on a CPU for an 8B model's shapes.
BackendRates probe_backend(Backend& be, const ModelConfig& cfg, const WeightPolicy& p, int64_t prompt_rows);
// Bytes/s of the hidden state's trip between the GPU and host memory (upload + download of
// `bytes`), and the fixed cost of one such trip in seconds.
struct TransferRate {
  double bytes_s = 0, latency_s = 0;
};
TransferRate probe_transfer(Backend& gpu, size_t bytes);

// Host memory read bandwidth (bytes/s): `threads` threads (0: all cores) summing a 1 GiB buffer,
// the CPU half's bandwidth bound of an offloaded step.
double probe_host_read(int threads);

// Kernels or ops a layer issues in a decode step (norms, q/k/v, RoPE and the cache write,
// attention, o, the MLP's two or three linears and the residual adds): the fixed cost counted
// per layer on top of its bytes.
constexpr int kOpsPerLayer = 9;

struct PlacementPrediction {
  double decode_ms = 0;  // one decode step at context `ctx`
  double ttft_ms = 0;    // a `prompt`-token prompt's prefill
  double gpu_ms = 0, cpu_ms = 0, hop_ms = 0;  // the decode step's parts
  double decode_tok_s() const { return decode_ms > 0 ? 1000.0 / decode_ms : 0; }
};
// gpu: rates of the GPU backend (layers [0, gpu_layers), lm_head); cpu: of the CPU backend
// (the rest). graphs: the GPU part replays a graph (the model wholly resident).
PlacementPrediction predict_placement(const Placement& pl, const ModelBytes& m, const ModelConfig& cfg,
                                      const BackendRates& gpu, const BackendRates& cpu, const TransferRate& link,
                                      int64_t ctx, int64_t prompt, bool graphs);

// "18 of 32 layers on the GPU (7.30 GiB + KV 0.56 GiB), 14 on the CPU (6.10 GiB + KV 1.75 GiB)"
std::string describe_placement(const Placement& pl);

}  // namespace nf4flash
