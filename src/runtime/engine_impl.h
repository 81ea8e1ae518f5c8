// Engine internals shared by engine.cpp (load, generate, score) and the bench/doctor code.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/arch.h"
#include "model/decoder.h"
#include "nf4flash/engine.h"
#include "model/step_graph.h"
#include "runtime/engine_tp.h"
#include "runtime/plan.h"

namespace nf4flash {

struct Engine::Impl {
  LoadOptions opts;
  ModelConfig cfg;
  GenerationConfig gen_cfg;
  ArchFlags arch;
  std::unique_ptr<WeightStore> store;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Backend> host_be;  // the offloaded layers' CPU backend (--gpu-layers), or null
  std::unique_ptr<Decoder> dec;
  std::shared_ptr<Tokenizer> tok;
  std::shared_ptr<ChatTemplate> chat;
  std::string chat_error;
  EngineReport report;
  int64_t ctx = 0;
  KVCacheDesc kv;  // the whole model's KV cache (Decoder::kv_allocate splits it between the backends)

  // device buffers
  std::unique_ptr<Buffer> ids_buf, pos_buf, hist_buf, hist_cnt_buf, logits_buf;  // hist: ctx ids and their count
  int64_t logits_rows = 0;
  StepGraph step_graph;  // the captured decode step (graphs_on)
  StepState state;
  // Tokens whose K/V occupy cache positions [0, size): what generate() may reuse. Anything else
  // that writes the cache (score, bench) clears it.
  std::vector<int32_t> kv_tokens;

  // Runs tokens[0..n) at positions [pos0, pos0+n) in ubatch chunks. For each chunk, calls
  // on_logits(first_row, Act logits_for_rows) with the chunk's logits (all rows when all_rows,
  // else only when the chunk is the last, with its last row).
  void forward_tokens(const int32_t* tokens, int64_t n, int64_t pos0, bool all_rows,
                      const std::function<void(int64_t, Act)>& on_logits);
  // One decode step for `token` at position `pos`; logits of that row land in logits row 0.
  void decode_step(int32_t token, int64_t pos);
  // The same step for the id already in ids_buf at the position already in pos_buf (`pos`: the
  // host's copy of it): the captured graph replayed, or the ops run.
  void run_step(int64_t pos);

  // Pipelined decode (Backend::sample_to_device): the step that consumes a token is queued before
  // that token reaches the host, so the device runs it while the host handles the token. Resolved
  // at load: the backend's default (pipelines_decode: CUDA yes, CPU no), NF4FLASH_DECODE_PIPELINE=0|1
  // overrides; tests set it. Applies with the KV cache (the repetition penalty's history then lives
  // in hist_buf / hist_cnt_buf, appended to on the device).
  bool pipeline = false;
  bool pipelined() const { return pipeline && opts.use_cache; }
  // The whole decode step replays one CUDA graph: asked for, and the step never leaves the GPU
  // (with offloaded layers it crosses to the CPU backend and back: Decoder::set_step_graphs).
  bool offloaded() const { return host_be != nullptr; }
  bool graphs_on() const { return opts.graphs && be->graphs_supported() && !offloaded(); }
  // Queues run_step(pos) and the sampling of its logits into ids_buf / pos_buf (the next step's
  // input), the history (with the penalty) and host slot `slot`, read by be->sampled(slot).
  void queue_step(int64_t pos, const SamplingParams& p, float uniform, int slot);
  Act logits_act(int64_t rows);
  void set_pos(int64_t pos0);
  // The KV cache (kv's capacity contiguous, or n_blocks paged blocks) on every rank that runs the
  // model: the decoder's backends, and under tensor parallel the other ranks too.
  void kv_allocate();
  void kv_allocate_paged(int64_t n_blocks, int block_size);

  // Tensor parallel (LoadOptions::tp > 1, or a follower): declared last, so that rank 0 stops the
  // other ranks before the decoder and the backend go.
  std::unique_ptr<TpEngine> tp;
  bool tp_leads() const { return tp && tp->leader; }
};

// Attaches tokenizer.json (+ tokenizer_config.json) of model_dir when present.
void load_tokenizer_into(Engine::Impl& im, const std::string& model_dir);

// The backend that plays the GPU's part in a placement (tests: a CPU backend, so that
// --gpu-layers splits run without a GPU); null: the plan's device.
using PrimaryBackendFactory = std::function<std::unique_ptr<Backend>(const Plan&)>;

// Resolves options and loads weights from `store` (a folder or a synthetic preset). Under tensor
// parallel (opts.tp > 1) rank 0 first sends the other ranks the load (runtime/engine_tp.h);
// tp_follower: this rank's part of a load rank 0 sent.
std::unique_ptr<Engine::Impl> build_engine(const LoadOptions& opts, ModelConfig cfg, std::unique_ptr<WeightStore> store,
                                           const std::string& model_name, const ProgressFn& progress,
                                           const PrimaryBackendFactory& make_primary = nullptr,
                                           const TpFollowerLoad* tp_follower = nullptr);

}  // namespace nf4flash
