// One captured decode step of a decoder, replayed step after step and captured again when what the
// capture holds has moved: the decoder's workspace (workspace_epoch), the backend's KV cache
// (kv_epoch) or op workspaces (scratch_epoch), or the logits buffer. Its owner keeps the step's
// input buffers (ids, positions, block tables) at fixed addresses. Used by the engine's decode
// steps and by every rank's step runner (parallel/tp_step.h: single-token steps, and the batched
// engine's decode-only steps over the paged cache).
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "model/decoder.h"

namespace nf4flash {

class StepGraph {
 public:
  // Replays the step; `forward` (issuing the step's ops) is captured first when no capture is valid.
  template <typename Forward>
  void run(const Decoder& dec, Backend& be, const void* logits, Forward&& forward) {
    if (id_ >= 0 && (ws_epoch_ != dec.workspace_epoch() || kv_epoch_ != be.kv_epoch() ||
                     scratch_epoch_ != be.scratch_epoch() || logits_ != logits))
      id_ = -1;
    if (id_ < 0) {
      ws_epoch_ = dec.workspace_epoch();
      kv_epoch_ = be.kv_epoch();
      scratch_epoch_ = be.scratch_epoch();
      logits_ = logits;
      be.capture_begin();
      forward();
      id_ = be.capture_end();
    }
    be.replay(id_);
  }
  // The next run() captures again (what the step runs changed, e.g. the attention path).
  void reset() { id_ = -1; }

 private:
  int id_ = -1;
  int64_t ws_epoch_ = -1, kv_epoch_ = -1, scratch_epoch_ = -1;
  const void* logits_ = nullptr;
};

}  // namespace nf4flash
