// Engine: resolves options into a concrete plan (device, compute dtype, quantization, attention,
// context size), loads the weights through the generic decoder, and runs prefill/decode/score.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <unistd.h>

#include "core/error.h"
#include "quant/quant4.h"
#include "runtime/engine_impl.h"
#include "runtime/placement.h"
#include "runtime/plan.h"
#include "sampling/sampler.h"

namespace nf4flash {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

Act Engine::Impl::logits_act(int64_t rows) {
  if (rows > logits_rows) {
    logits_buf.reset();
    logits_buf = be->alloc(static_cast<size_t>(rows) * cfg.vocab_size * 4);
    logits_rows = rows;
  }
  return logits_buf->as_act(DType::F32, rows, cfg.vocab_size);
}

void Engine::Impl::set_pos(int64_t pos0) {
  const int32_t p = static_cast<int32_t>(pos0);
  be->upload(pos_buf->data(), &p, 4);
  state.pos0_host = pos0;
}

void Engine::Impl::forward_tokens(const int32_t* tokens, int64_t n, int64_t pos0, bool all_rows,
                                  const std::function<void(int64_t, Act)>& on_logits) {
  NF4FLASH_CHECK(pos0 + n <= ctx, "context of ", pos0 + n, " tokens exceeds the context size ", ctx,
                 " (raise --ctx-size; the model allows ", cfg.max_positions, ")");
  const int64_t chunk = dec->max_rows();
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t T = std::min(chunk, n - c0);
    const bool last = c0 + T == n;
    if (!all_rows && !last) {
      // logits of intermediate chunks are not needed, but the forward must still run
    }
    const int64_t nl = all_rows ? T : 1;
    Act lg = logits_act(all_rows ? chunk : 1).slice_rows(0, nl);
    if (tp_leads()) {
      TpStep s;
      s.ids.assign(tokens + c0, tokens + c0 + T);
      s.pos0 = static_cast<int32_t>(pos0 + c0);
      s.n_logits = static_cast<int32_t>(nl);
      tp->leader->forward(s, lg);
    } else {
      be->upload(ids_buf->data(), tokens + c0, static_cast<size_t>(T) * 4);
      set_pos(pos0 + c0);
      dec->forward(static_cast<const int32_t*>(ids_buf->data()), T, state, lg, nl);
    }
    if (all_rows || last) on_logits(all_rows ? c0 : n - 1, lg);
  }
}

void Engine::Impl::decode_step(int32_t token, int64_t pos) {
  NF4FLASH_CHECK(pos + 1 <= ctx, "context of ", pos + 1, " tokens exceeds the context size ", ctx);
  if (tp_leads()) {  // every rank's runner replays its captured step (TpStepRunner)
    TpStep s;
    s.ids = {token};
    s.pos0 = static_cast<int32_t>(pos);
    tp->leader->forward(s, logits_act(1).slice_rows(0, 1));
    return;
  }
  be->upload(ids_buf->data(), &token, 4);
  set_pos(pos);
  run_step(pos);
}

void Engine::Impl::run_step(int64_t pos) {
  NF4FLASH_CHECK(pos + 1 <= ctx, "context of ", pos + 1, " tokens exceeds the context size ", ctx);
  Act lg = logits_act(1).slice_rows(0, 1);
  if (graphs_on()) {
    step_graph.run(*dec, *be, lg.data, [&] {
      state.pos0_host = -1;  // replays run at other positions: nothing may depend on this one
      dec->forward(static_cast<const int32_t*>(ids_buf->data()), 1, state, lg, 1);
    });
  } else {
    state.pos0_host = pos;
    dec->set_step_graphs(opts.graphs && be->graphs_supported());  // the GPU's parts of an offloaded step
    dec->forward(static_cast<const int32_t*>(ids_buf->data()), 1, state, lg, 1);
    dec->set_step_graphs(false);
  }
}

void Engine::Impl::kv_allocate() {
  if (tp_leads()) tp->leader->kv_allocate(kv.capacity, kv.dtype);
  else dec->kv_allocate(kv);
}

void Engine::Impl::kv_allocate_paged(int64_t n_blocks, int block_size) {
  if (tp_leads()) tp->leader->kv_allocate(kv.capacity, kv.dtype, n_blocks, block_size);
  else dec->kv_allocate_paged(kv, n_blocks, block_size);
}

void Engine::Impl::queue_step(int64_t pos, const SamplingParams& p, float uniform, int slot) {
  NF4FLASH_CHECK(!tp, "pipelined decode under tensor parallel (rank 0 sends each token to the other ranks)");
  run_step(pos);
  // the penalty's history (hist_buf: ctx ids, count in hist_cnt_buf); none without the penalty
  const bool pen = p.repeat_penalty != 1.0f;
  int32_t* hist = pen ? static_cast<int32_t*>(hist_buf->data()) : nullptr;
  int32_t* hist_cnt = pen ? static_cast<int32_t*>(hist_cnt_buf->data()) : nullptr;
  NF4FLASH_CHECK(be->sample_to_device(logits_act(1).slice_rows(0, 1), p, uniform, static_cast<int32_t*>(ids_buf->data()),
                                      state.pos0, slot, hist, hist_cnt, pen ? static_cast<int>(ctx) : 0),
                 "pipelined decode: the ", be->name(), " backend cannot sample on the device (NF4FLASH_DECODE_PIPELINE=0)");
}

namespace {
// --gpu-layers / --max-vram: the split of the model's layers between the GPU backend `gpu` and
// the CPU backend, with the context its KV cache is planned for.
Placement resolve_placement(const LoadOptions& o, const ModelConfig& cfg, const Plan& plan, const Backend& gpu) {
  const int64_t ctx = o.ctx_size > 0 ? o.ctx_size : std::min<int64_t>(cfg.max_positions, kPlacedDefaultCtx);
  size_t budget = o.max_vram;
  std::string budget_text = cat("--max-vram ", o.max_vram, " bytes");
  if (budget == 0) {
    const size_t free_b = gpu.free_memory();  // 0: not known (no limit)
    budget = free_b == 0 ? 0 : free_b > kFreeMemoryMargin ? free_b - kFreeMemoryMargin : 1;
    budget_text = cat("the GPU's free memory less 1 GiB (", budget >> 20, " MiB)");
  }
  return place_layers(model_bytes(cfg, plan, o), ctx, o.gpu_layers, budget, budget_text);
}
}  // namespace

std::unique_ptr<Engine::Impl> build_engine(const LoadOptions& opts, ModelConfig cfg, std::unique_ptr<WeightStore> store,
                                           const std::string& model_name, const ProgressFn& progress,
                                           const PrimaryBackendFactory& make_primary,
                                           const TpFollowerLoad* tp_follower) {
  const auto t0 = Clock::now();
  auto im = std::make_unique<Engine::Impl>();
  im->opts = opts;
  im->arch = resolve_arch(cfg);
  Plan plan = make_plan(opts, cfg);
  if (opts.tp > 1 || tp_follower) {
    NF4FLASH_CHECK(!make_primary, "tensor parallel with a test's primary backend");
    im->tp = tp_engine_begin(opts, plan, model_name, tp_follower);
  }
  const bool gpu_primary = plan.device == Device::CUDA || make_primary;
  const bool placing = opts.gpu_layers != kAllLayers || opts.max_vram > 0;
  if (placing && !gpu_primary && (opts.gpu_layers != 0 || opts.max_vram > 0))
    fail("--gpu-layers / --max-vram place layers on a GPU, but the model runs on the CPU backend (--device cpu, or no "
         "CUDA device found)");
  if (make_primary) im->be = make_primary(plan);
  else if (plan.device == Device::CUDA) im->be = make_cuda_backend({plan.compute, im->tp ? im->tp->local_rank : 0, opts.tf32, std::nullopt});
  std::optional<Placement> placed;
  if (placing && gpu_primary) {
    placed = resolve_placement(opts, cfg, plan, *im->be);
    if (placed->gpu_layers == 0) {
      plan.device = Device::CPU;  // no layer on the GPU: the CPU backend runs the whole model
      im->be.reset();
    } else if (placed->offloaded()) {
      if (plan.compute == DType::F16)
        fail("--gpu-layers ", placed->gpu_layers, " with --compute-dtype f16: the CPU backend's layers store bf16 or f32 "
             "weights (use --compute-dtype bf16)");
      im->host_be = make_cpu_backend({plan.compute, opts.threads});
    }
  }
  if (!im->be) im->be = make_cpu_backend({plan.compute, opts.threads});
  // Attention: an explicit request must be servable (else an error, never a fallback); auto
  // takes the first implementation the backend serves, in the order flash, sdpa, eager.
  AttnImpl attn = plan.attn;
  if (attn != AttnImpl::Auto) {
    const std::string why = im->be->attn_unsupported_reason(attn, cfg.head_dim);
    if (!why.empty()) fail(why);
  } else {
    std::string why;
    for (AttnImpl a : {AttnImpl::Flash, AttnImpl::Sdpa, AttnImpl::Eager}) {
      const std::string w = im->be->attn_unsupported_reason(a, cfg.head_dim);
      if (w.empty()) {
        attn = a;
        break;
      }
      why = w;
    }
    if (attn == AttnImpl::Auto) fail(why);
  }
  im->cfg = cfg;
  im->store = std::move(store);

  const WeightPolicy wp = weight_policy(plan, opts);
  const int64_t max_rows = resolve_ubatch(opts.ubatch, plan.device);
  auto prog = [&](int done, int total) { if (progress) progress("loading weights", done, total); };
  const OffloadSplit split{im->host_be.get(), placed ? placed->gpu_layers : cfg.n_layers};
  if (im->tp) tp_engine_connect(*im->tp, *im->be);
  im->dec = std::make_unique<Decoder>(cfg, im->arch, *im->be, *im->store, wp, max_rows, prog,
                                      im->tp ? im->tp->shard() : TpShard{}, split);
  im->dec->set_attn_impl(attn);

  // context size: requested, else the model's maximum capped by what memory allows
  const size_t kv_elt = plan.device == Device::CPU ? 4 : dtype_size(plan.compute);
  const size_t per_token = static_cast<size_t>(2) * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * kv_elt;
  int64_t ctx = opts.ctx_size > 0 ? opts.ctx_size : cfg.max_positions;
  // dynamic NTK RoPE exists to run past max_position_embeddings
  if (opts.ctx_size > cfg.max_positions && cfg.rope.type != "dynamic")
    fail("--ctx-size ", opts.ctx_size, " exceeds the model's max_position_embeddings ", cfg.max_positions);
  // (less what the activation workspace may still grow by: it starts small, see Decoder)
  size_t free_mem = im->be->free_memory();
  const size_t ws_growth = im->dec->workspace_bytes(max_rows) - im->dec->workspace_bytes(im->dec->workspace_rows());
  if (free_mem > 0) free_mem = free_mem > ws_growth ? free_mem - ws_growth : 1;
  if (free_mem == 0 && plan.device == Device::CPU) {
    const long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0) free_mem = static_cast<size_t>(pages) * psz;
  }
  if (placed) {
    ctx = placed->ctx;  // the plan holds its KV cache (place_layers checked it against the budget)
  } else if (free_mem > 0) {
    const int64_t fit = static_cast<int64_t>(free_mem * 0.8 / per_token);
    if (opts.ctx_size > 0 && fit < opts.ctx_size)
      fail("--ctx-size ", opts.ctx_size, " needs ", opts.ctx_size * per_token >> 20, " MiB of KV cache but only ",
           free_mem >> 20, " MiB are free");
    ctx = std::min(ctx, fit);
  }
  NF4FLASH_CHECK(ctx >= 1, "no memory left for the KV cache");
  im->ctx = ctx;
  im->kv = {cfg.n_layers, im->dec->kv_heads(), cfg.head_dim, ctx, plan.compute};
  if (im->tp) tp_engine_finish(*im->tp, *im->dec, *im->be, opts.graphs && im->be->graphs_supported());
  if (!tp_follower) im->kv_allocate();  // a follower's cache comes with rank 0's (a TpStep)

  im->ids_buf = im->be->alloc(static_cast<size_t>(max_rows) * 4);
  im->pos_buf = im->be->alloc(4);
  im->hist_buf = im->be->alloc(static_cast<size_t>(ctx) * 4);
  im->hist_cnt_buf = im->be->alloc(4);
  im->state.pos0 = static_cast<int32_t*>(im->pos_buf->data());
  // offloaded, every step waits for the CPU backend's layers: nothing to queue ahead
  // under tensor parallel each token goes from rank 0's host to the other ranks before its step
  im->pipeline = !im->offloaded() && !im->tp && resolve_decode_pipeline(*im->be);

  EngineReport& r = im->report;
  r.model = model_name;
  r.architecture = cfg.architecture;
  r.device = plan.device == Device::CUDA ? "cuda" : "cpu";
  r.backend = im->be->name();
  r.compute_dtype = plan.compute == DType::F32 ? "f32" : plan.compute == DType::BF16 ? "bf16" : "f16";
  r.quant = std::string(quant_type_name(plan.quant));
  r.double_quant = plan.double_quant;
  r.prequantized = plan.prequantized;
  r.attn = plan.device == Device::CPU ? std::string("cpu-eager") : im->be->attn_path(attn);
  r.linear_decode = im->dec->linear_path(1);
  r.linear_prefill = im->dec->linear_path(max_rows);
  r.use_cache = opts.use_cache;
  r.graphs = opts.graphs && im->be->graphs_supported();  // offloaded: the GPU's parts of a decode step
  r.decode_pipelined = im->pipeline;
  r.weight_bytes = im->dec->stats().weight_bytes;
  r.kv_bytes = im->be->kv_bytes() + (im->host_be ? im->host_be->kv_bytes() : 0);
  r.n_layers = cfg.n_layers;
  r.gpu_layers = gpu_primary && !(placed && placed->gpu_layers == 0) ? im->dec->offload_first_layer() : 0;
  r.offload_device = im->offloaded() ? "cpu" : "";
  r.offloaded_bytes = im->dec->stats().offloaded_bytes;
  r.kv_offloaded_bytes = im->host_be ? im->host_be->kv_bytes() : 0;
  r.ctx_size = ctx;
  r.tp = im->tp ? im->tp->world : 1;
  r.ubatch = max_rows;
  r.checkpoint_bytes = im->store->total_bytes();
  r.load_ms = ms_since(t0);
  return im;
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
std::unique_ptr<Engine> Engine::from_internals(std::unique_ptr<Impl> impl) {
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::load(const LoadOptions& opts, const ProgressFn& progress) {
  if (opts.model_dir.empty()) fail("--model: no model folder given");
  if (!std::filesystem::is_directory(opts.model_dir)) fail("--model ", opts.model_dir, ": not a directory");
  ModelConfig cfg = load_model_config(opts.model_dir);
  resolve_arch(cfg);  // refuse unknown architectures before touching the weights
  auto store = WeightStore::open_dir(opts.model_dir);
  auto im = build_engine(opts, cfg, std::move(store), opts.model_dir, progress);
  im->gen_cfg = load_generation_config(opts.model_dir);
  if (opts.load_tokenizer) {
    const auto t0 = std::chrono::steady_clock::now();
    load_tokenizer_into(*im, opts.model_dir);
    im->report.tokenizer_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  return std::unique_ptr<Engine>(new Engine(std::move(im)));
}

const EngineReport& Engine::report() const { return impl_->report; }
const ModelConfig& Engine::config() const { return impl_->cfg; }
const Tokenizer* Engine::tokenizer() const { return impl_->tok.get(); }
const ChatTemplate* Engine::chat_template() const { return impl_->chat.get(); }
const std::string& Engine::chat_template_error() const { return impl_->chat_error; }
int64_t Engine::vocab_size() const { return impl_->cfg.vocab_size; }
int64_t Engine::ctx_size() const { return impl_->ctx; }

std::vector<int32_t> Engine::eos_ids() const {
  if (!impl_->gen_cfg.eos_ids.empty()) return impl_->gen_cfg.eos_ids;
  return impl_->cfg.eos_ids;
}

namespace {
void check_ids(const std::vector<int32_t>& ids, int64_t vocab, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      fail(what, ": token id ", ids[i], " at index ", i, " is outside the vocabulary (size ", vocab, ")");
}
}  // namespace

ScoreResult Engine::score(const std::vector<int32_t>& tokens, bool want_last_logits, bool want_all_logits) {
  Impl& im = *impl_;
  NF4FLASH_CHECK(!tokens.empty(), "score: no tokens");
  check_ids(tokens, im.cfg.vocab_size, "score");
  NF4FLASH_CHECK(static_cast<int64_t>(tokens.size()) <= im.ctx, "score: ", tokens.size(),
                 " tokens exceed the context size ", im.ctx, " (raise --ctx-size)");
  ScoreResult res;
  im.kv_tokens.clear();
  const int64_t n = static_cast<int64_t>(tokens.size()), V = im.cfg.vocab_size;
  res.next_token_logprobs.resize(n - 1);
  std::vector<float> host(static_cast<size_t>(im.dec->max_rows()) * V);
  const auto t0 = Clock::now();
  double nll = 0;
  im.forward_tokens(tokens.data(), n, 0, true, [&](int64_t first, Act lg) {
    im.be->download(host.data(), lg.data, lg.bytes());
    for (int64_t r = 0; r < lg.rows; ++r) {
      const int64_t t = first + r;
      const float* row = host.data() + r * V;
      if (t + 1 < n) {
        const double lp = log_softmax_at(row, V, tokens[t + 1]);
        res.next_token_logprobs[t] = static_cast<float>(lp);
        nll -= lp;
      }
      if (want_all_logits) res.logits.emplace_back(row, row + V);
      if (want_last_logits && t == n - 1) res.last_logits.assign(row, row + V);
    }
  });
  res.timing.prompt_tokens = n;
  res.timing.prefill_ms = ms_since(t0);
  res.perplexity = n > 1 ? std::exp(nll / (n - 1)) : 1.0;
  return res;
}

GenerateResult Engine::generate(const std::vector<int32_t>& prompt, const GenerateOptions& g, const TokenFn& on_token) {
  Impl& im = *impl_;
  NF4FLASH_CHECK(!prompt.empty(), "generate: empty prompt");
  NF4FLASH_CHECK(g.max_new_tokens >= 0, "--max-new-tokens must be >= 0");
  check_ids(prompt, im.cfg.vocab_size, "prompt");
  const int64_t n = static_cast<int64_t>(prompt.size()), V = im.cfg.vocab_size;
  if (n >= im.ctx)
    fail("the prompt has ", n, " tokens but the context size is ", im.ctx, " (raise --ctx-size or shorten the prompt)");
  std::vector<int32_t> stops = g.stop_ids.empty() ? eos_ids() : g.stop_ids;
  if (g.ignore_eos) stops.clear();
  Sampler sampler(g.sampling);
  GenerateResult res;
  res.stop_reason = "length";
  std::vector<int32_t> all = prompt;
  std::vector<float> logits(V);

  // One uniform per non-greedy token, drawn here: the device sampler and the host fallback pick
  // the same id from the same logits and u (sample_with_uniform), so a seeded run's draws do not
  // depend on where sampling runs.
  auto pick = [&](Act lg) -> int32_t {
    int32_t id = -1;
    const float u = g.sampling.greedy() ? 0.0f : sampler.next_uniform();
    if (im.be->sample(lg, g.sampling, all.data(), static_cast<int>(all.size()), u, &id)) return id;
    im.be->download(logits.data(), lg.data, static_cast<size_t>(V) * 4);
    return sample_with_uniform(logits.data(), V, g.sampling, all, u);
  };

  if (g.max_new_tokens == 0) return res;
  // reuse the cached prefix (at least one prompt token is run, for its logits)
  int64_t reuse = 0;
  if (g.reuse_cache && im.opts.use_cache) {
    const int64_t lim = std::min<int64_t>(static_cast<int64_t>(im.kv_tokens.size()), n - 1);
    while (reuse < lim && im.kv_tokens[static_cast<size_t>(reuse)] == prompt[static_cast<size_t>(reuse)]) ++reuse;
  }
  im.kv_tokens.clear();  // until this call has finished writing the cache
  im.be->sync();
  const auto t0 = Clock::now();
  int32_t next = -1;
  im.forward_tokens(prompt.data() + reuse, n - reuse, reuse, false, [&](int64_t, Act lg) { next = pick(lg); });
  res.timing.prompt_tokens = n - reuse;
  res.timing.cached_tokens = reuse;
  res.timing.prefill_ms = ms_since(t0);
  const auto t1 = Clock::now();
  // Pipelined (Impl::pipelined): the step that consumes generated token k is queued before token
  // k reaches the host (its id and position stay on the device), so the device runs it while the
  // host handles token k. It is queued only where the loop below will need it (can_feed); a stop
  // on a token the host had not seen yet leaves at most one step computed in vain (it writes the
  // K/V of that last token at its own position, which kv_tokens does not claim).
  const bool pipe = im.pipelined();
  auto can_feed = [&](int64_t k) { return k + 1 < g.max_new_tokens && n + k + 1 <= im.ctx; };
  auto uniform = [&] { return g.sampling.greedy() ? 0.0f : sampler.next_uniform(); };
  constexpr int S = Backend::kSampleSlots;
  if (pipe && can_feed(0)) {
    im.be->upload(im.ids_buf->data(), &next, 4);
    im.set_pos(n);
    if (g.sampling.repeat_penalty != 1.0f) {  // the penalty's history (prompt + token 0) goes up once
      std::vector<int32_t> h = all;
      h.push_back(next);
      const int32_t c = static_cast<int32_t>(h.size());  // <= ctx (n < ctx)
      im.be->upload(im.hist_buf->data(), h.data(), h.size() * 4);
      im.be->upload(im.hist_cnt_buf->data(), &c, 4);
    }
    im.queue_step(n, g.sampling, uniform(), 0);
  }
  for (int64_t k = 0;; ++k) {
    res.tokens.push_back(next);
    all.push_back(next);
    if (on_token && !on_token(next)) {
      res.stop_reason = "callback";
      break;
    }
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) {
      res.stop_reason = "eos";
      break;
    }
    if (static_cast<int>(res.tokens.size()) >= g.max_new_tokens) break;
    const int64_t pos = static_cast<int64_t>(all.size()) - 1;
    if (pos + 1 > im.ctx) {
      res.stop_reason = "context";
      break;
    }
    if (pipe) {  // here can_feed(k) holds: the step consuming token k is queued, its id goes to slot k % S
      if (can_feed(k + 1)) im.queue_step(pos + 1, g.sampling, uniform(), static_cast<int>((k + 1) % S));
      next = im.be->sampled(static_cast<int>(k % S));
    } else if (im.opts.use_cache) {
      im.decode_step(next, pos);
      next = pick(im.logits_act(1).slice_rows(0, 1));
    } else {
      im.forward_tokens(all.data(), static_cast<int64_t>(all.size()), 0, false, [&](int64_t, Act lg) { next = pick(lg); });
    }
  }
  res.timing.decode_tokens = static_cast<int64_t>(res.tokens.size()) - 1;
  res.timing.decode_ms = res.timing.decode_tokens > 0 ? ms_since(t1) : 0;  // the last token is on the host
  im.be->sync();
  // every token but the last sampled one has its K/V in the cache (no-cache runs rewrite it all)
  if (im.opts.use_cache) im.kv_tokens.assign(all.begin(), all.end() - 1);
  return res;
}

double Engine::bench_prefill(int64_t n, int64_t pos0) {
  Impl& im = *impl_;
  std::vector<int32_t> toks(n);
  for (int64_t i = 0; i < n; ++i) toks[i] = static_cast<int32_t>((i * 7919 + 13) % im.cfg.vocab_size);
  im.kv_tokens.clear();
  im.be->sync();
  const auto t0 = Clock::now();
  im.forward_tokens(toks.data(), n, pos0, false, [](int64_t, Act) {});
  im.be->sync();
  return ms_since(t0);
}

double Engine::bench_decode(int64_t n, int64_t pos0) {
  Impl& im = *impl_;
  NF4FLASH_CHECK(pos0 + n <= im.ctx, "bench: context ", pos0 + n, " exceeds the context size ", im.ctx);
  GenerateOptions g;
  Sampler sampler(g.sampling);
  int32_t tok = 1;
  im.kv_tokens.clear();
  im.be->sync();
  const auto t0 = Clock::now();
  if (im.pipelined()) {  // as generate(): step i+1 queued before token i reaches the host
    constexpr int S = Backend::kSampleSlots;
    if (n > 0) {
      im.be->upload(im.ids_buf->data(), &tok, 4);
      im.set_pos(pos0);
      im.queue_step(pos0, g.sampling, 0.0f, 0);
    }
    for (int64_t i = 0; i < n; ++i) {
      if (i + 1 < n) im.queue_step(pos0 + i + 1, g.sampling, 0.0f, static_cast<int>((i + 1) % S));
      tok = im.be->sampled(static_cast<int>(i % S));
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      im.decode_step(tok, pos0 + i);
      int32_t id = -1;
      Act lg = im.logits_act(1).slice_rows(0, 1);
      if (!im.be->sample(lg, g.sampling, nullptr, 0, 0.0f, &id)) {
        std::vector<float> logits(im.cfg.vocab_size);
        im.be->download(logits.data(), lg.data, logits.size() * 4);
        id = argmax(logits.data(), im.cfg.vocab_size);
      }
      tok = id;
    }
  }
  im.be->sync();
  return ms_since(t0);
}

}  // namespace nf4flash
