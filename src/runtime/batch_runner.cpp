// BatchRunner (batch_runner.h): one step = the scheduler's plan, the KV blocks it needs, one
// forward over every scheduled row, per-sequence sampling, then finish / commit.
#include "runtime/batch_runner.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "runtime/engine_impl.h"

namespace nf4flash {

BatchRunner::BatchRunner(Engine& engine, const BatchRunnerOptions& o) : engine_(engine), on_token_(o.on_token) {
  Engine::Impl& im = engine.internals();
  NF4FLASH_CHECK(o.block_size >= 1, "batch: block size ", o.block_size);
  SchedulerConfig c = o.sched;
  c.max_tokens_per_step = std::min(c.max_tokens_per_step, im.dec->max_rows());
  c.max_seqs_per_step = std::min(c.max_seqs_per_step, c.max_tokens_per_step);
  c.max_context = std::min(c.max_context, im.ctx);
  const int64_t per_seq = (c.max_context + o.block_size - 1) / o.block_size;
  int64_t n_blocks = o.n_blocks > 0 ? o.n_blocks : per_seq * c.max_seqs_per_step;
  if (o.n_blocks <= 0 && im.be->free_memory() > 0) {
    // the default pool: every slot's whole context, capped by the device memory left once the
    // contiguous cache is freed, less a reserve for the activation workspace, prompt-chunk gathers
    // and logits (the primary's layers: offloaded ones keep their blocks in host memory)
    const KVCacheDesc& d = im.be->kv_desc();
    const size_t block_bytes = size_t(2) * d.n_layers * d.n_kv_heads * o.block_size * d.head_dim * dtype_size(d.dtype);
    const size_t avail = im.be->free_memory() + im.be->kv_bytes();
    const size_t reserve = (size_t(1) << 30) + size_t(2) * d.n_kv_heads * c.max_context * d.head_dim * dtype_size(d.dtype);
    NF4FLASH_CHECK(avail > reserve + block_bytes, "batch: no device memory left for the paged KV cache (",
                   avail >> 20, " MiB free)");
    n_blocks = std::min<int64_t>(n_blocks, int64_t((avail - reserve) / block_bytes));
  }
  pool_ = std::make_unique<KvBlockPool>(n_blocks, o.block_size);
  if (!im.tp_leads()) {
    runner_ = std::make_unique<TpStepRunner>(*im.dec, *im.be);
    runner_->set_graphs(im.graphs_on());  // decode-only steps replay a graph per shape
  }
  im.kv_allocate_paged(n_blocks, o.block_size);  // Error naming the backend without it
  im.kv_tokens.clear();
  kv_ = std::make_unique<PoolAdmission>(*pool_);
  sched_ = std::make_unique<Scheduler>(c, *kv_);
}

// The engine's single-sequence calls use the contiguous cache again afterwards.
BatchRunner::~BatchRunner() {
  try {
    engine_.internals().kv_allocate();
  } catch (const std::exception&) {
    // the engine's group failed (tensor parallel): its next use reports it
  }
}

SubmitResult BatchRunner::submit(BatchRequest r) {
  const int64_t V = engine_.vocab_size();
  NF4FLASH_CHECK(!r.prompt.empty(), "request ", r.id, ": empty prompt");
  for (int32_t t : r.prompt) NF4FLASH_CHECK(t >= 0 && t < V, "request ", r.id, ": token id ", t, " outside the vocabulary (", V, ")");
  NF4FLASH_CHECK(!seqs_.count(r.id), "request ", r.id, " is already running");
  const SchedRequest sr{r.id, int64_t(r.prompt.size()), 0, int64_t(r.gen.max_new_tokens)};
  int64_t share = 0;
  const int64_t sibling = sched_->check(sr).status == SubmitResult::Status::Accepted ? prefill_sibling(r.prompt, share) : -1;
  Seq q;
  q.tokens = r.prompt;
  q.stops = r.gen.stop_ids.empty() ? engine_.eos_ids() : r.gen.stop_ids;
  if (r.gen.ignore_eos) q.stops.clear();
  q.sampler = std::make_unique<Sampler>(r.gen.sampling);
  q.out.id = r.id;
  q.out.prompt_tokens = int64_t(r.prompt.size());
  q.req = std::move(r);
  const int64_t id = q.req.id;
  if (sibling >= 0) {
    q.wait_for = sibling;
    q.share = share;
    deferred_.push_back(id);
    seqs_.emplace(id, std::move(q));
    return SubmitResult{};
  }
  const SubmitResult s = enter(q);
  if (s.status == SubmitResult::Status::Accepted) seqs_.emplace(id, std::move(q));
  return s;
}

SubmitResult BatchRunner::enter(Seq& q) {
  const BatchRequest& r = q.req;
  const int64_t cached = kv_->start(r.id, r.prompt);
  const SubmitResult s = sched_->submit({r.id, int64_t(r.prompt.size()), cached, int64_t(r.gen.max_new_tokens)});
  if (s.status != SubmitResult::Status::Accepted) {
    kv_->release(r.id);
    if (s.status == SubmitResult::Status::Finished) done_.push_back({r.id, {}, "length", int64_t(r.prompt.size()), 0});
    return s;
  }
  q.out.cached_tokens = cached;
  return s;
}

int64_t BatchRunner::prefill_sibling(const std::vector<int32_t>& prompt, int64_t& share) const {
  const int64_t bs = pool_->block_size();
  const int64_t cap = int64_t(prompt.size()) - 1;  // the last prompt token is always computed
  int64_t best = -1, best_full = 0, ready_full = 0;
  for (const auto& [id, q] : seqs_) {
    if (q.wait_for >= 0) continue;
    const size_t n = std::min(prompt.size(), q.tokens.size());
    const size_t common = size_t(std::mismatch(prompt.begin(), prompt.begin() + ptrdiff_t(n), q.tokens.begin()).first - prompt.begin());
    const int64_t full = std::min<int64_t>(int64_t(common), cap) / bs * bs;
    if (full < bs) continue;
    const KvBlockTable* t = kv_->table(id);
    if (t && t->n_tokens >= full) ready_full = std::max(ready_full, full);
    else if (full > best_full) best = id, best_full = full;
  }
  if (best < 0 || best_full <= ready_full) return -1;
  share = best_full;
  return best;
}

void BatchRunner::release_deferred() {
  for (size_t i = 0; i < deferred_.size();) {
    Seq& q = seqs_.at(deferred_[i]);
    auto sib = seqs_.find(q.wait_for);
    const KvBlockTable* t = sib == seqs_.end() ? nullptr : kv_->table(q.wait_for);
    if (sib != seqs_.end() && (!t || t->n_tokens < q.share)) {
      ++i;
      continue;
    }
    const int64_t id = deferred_[i];
    deferred_.erase(deferred_.begin() + ptrdiff_t(i));
    q.wait_for = -1;
    if (enter(q).status != SubmitResult::Status::Accepted) seqs_.erase(id);  // checked at submit: not expected
  }
}

void BatchRunner::end(int64_t id, const char* reason) {
  kv_->release(id);
  auto it = seqs_.find(id);
  it->second.out.finish_reason = reason;
  done_.push_back(std::move(it->second.out));
  seqs_.erase(it);
}

TokenLogprobs token_logprobs(const float* l, int64_t V, int32_t token, int top_n) {
  double mx = -INFINITY;
  for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(l[j]));
  double sum = 0;
  for (int64_t j = 0; j < V; ++j) sum += std::exp(double(l[j]) - mx);
  const double lse = mx + std::log(sum);
  TokenLogprobs r;
  r.logprob = float(double(l[token]) - lse);
  const int n = int(std::min<int64_t>(std::max(top_n, 0), V));
  if (n > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int64_t j = 0; j < V; ++j) idx[size_t(j)] = int32_t(j);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (int i = 0; i < n; ++i) r.top.emplace_back(idx[size_t(i)], float(double(l[idx[size_t(i)]]) - lse));
  }
  return r;
}

size_t BatchRunner::step_graphs() const {
  Engine::Impl& im = engine_.internals();
  const TpStepRunner* r = runner_ ? runner_.get() : im.tp->runner.get();
  return r->paged_graphs();
}

bool BatchRunner::cancel(int64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  if (it->second.wait_for >= 0) {  // deferred: the scheduler and the cache hold nothing of it yet
    deferred_.erase(std::find(deferred_.begin(), deferred_.end(), id));
    it->second.out.finish_reason = "abort";
    done_.push_back(std::move(it->second.out));
    seqs_.erase(it);
    return true;
  }
  sched_->finish(id, FinishReason::Abort);
  end(id, "abort");
  return true;
}

std::vector<BatchOutput> BatchRunner::step() {
  Engine::Impl& im = engine_.internals();
  Backend& be = *im.be;
  release_deferred();
  const StepPlan plan = sched_->plan_step();
  last_ = StepInfo{};
  if (!plan.empty()) {
    for (int64_t id : plan.preempted) kv_->release(id);
    std::vector<KvBlockCopy> copies;
    for (const StepEntry& e : plan.seqs) kv_->reserve(e, &copies);
    NF4FLASH_CHECK(copies.empty(), "batch: block copies are not supported here (no sequence is forked)");
    // the step's rows: each entry's positions [pos0, pos0 + n) of its tokens, sequence after sequence
    const int n = int(plan.seqs.size());
    int max_blocks = 1;
    for (const StepEntry& e : plan.seqs) max_blocks = std::max(max_blocks, int(kv_->table(e.seq_id)->blocks.size()));
    std::vector<int32_t> ids, row_start{0}, pos0, tables(size_t(n) * max_blocks, 0), logit_rows;
    std::vector<int64_t> sampling;  // the entries that sample, in logit-row order
    for (int i = 0; i < n; ++i) {
      const StepEntry& e = plan.seqs[size_t(i)];
      const Seq& q = seqs_.at(e.seq_id);
      ids.insert(ids.end(), q.tokens.begin() + e.pos0, q.tokens.begin() + e.pos0 + e.n_tokens);
      row_start.push_back(int32_t(ids.size()));
      pos0.push_back(int32_t(e.pos0));
      const std::vector<int32_t>& b = kv_->table(e.seq_id)->blocks;
      std::copy(b.begin(), b.end(), tables.begin() + size_t(i) * max_blocks);
      if (e.samples) {
        logit_rows.push_back(row_start.back() - 1);
        sampling.push_back(i);
      }
    }
    last_.seqs = n;
    last_.rows = int64_t(ids.size());
    last_.sampled = int64_t(sampling.size());
    last_.decode_only = last_.rows == n && last_.sampled == n;
    const int64_t n_logits = std::max<int64_t>(1, int64_t(logit_rows.size()));
    if (logit_rows.empty()) logit_rows.push_back(row_start.back() - 1);  // forward gives one row at least
    const int64_t V = engine_.vocab_size();
    const size_t lbytes = size_t(n_logits * V) * 4;
    if (!buf_logits_ || buf_logits_->bytes() < lbytes) {
      buf_logits_.reset();
      buf_logits_ = be.alloc(lbytes);
    }
    const Act lg{buf_logits_->data(), DType::F32, n_logits, V};
    TpStep ts;
    ts.ids = std::move(ids);
    ts.row_start = std::move(row_start);
    ts.seq_pos0 = std::move(pos0);
    ts.block_tables = std::move(tables);
    ts.max_blocks = max_blocks;
    ts.n_logits = int32_t(n_logits);
    ts.logit_rows = std::move(logit_rows);
    if (im.tp_leads()) im.tp->leader->forward(ts, lg);  // the other ranks run it too
    else runner_->run(ts, lg);
    // the computed full blocks enter the prefix cache (before a finish releases them)
    for (const StepEntry& e : plan.seqs) kv_->computed(e.seq_id, seqs_.at(e.seq_id).tokens);
    // one token per sampling sequence, each with its own parameters and random stream: on the
    // backend when it samples rows, else on the host from the downloaded logits
    const size_t ns = sampling.size();
    std::vector<SamplingParams> params(ns);
    std::vector<const std::vector<int32_t>*> hists(ns);
    std::vector<float> uniforms(ns);
    for (size_t k = 0; k < ns; ++k) {
      Seq& q = seqs_.at(plan.seqs[size_t(sampling[k])].seq_id);
      params[k] = q.req.gen.sampling;
      hists[k] = &q.tokens;
      uniforms[k] = params[k].greedy() ? 0.0f : q.sampler->next_uniform();
    }
    std::vector<int32_t> picked(ns);
    std::vector<float> logits;  // all sampling rows on the host, when the host samples
    if (ns && !be.sample_rows(lg.slice_rows(0, int64_t(ns)), params.data(), hists.data(), uniforms.data(), picked.data())) {
      logits.resize(ns * size_t(V));
      be.download(logits.data(), lg.data, logits.size() * 4);
      for (size_t k = 0; k < ns; ++k)
        picked[k] = sample_with_uniform(logits.data() + k * V, V, params[k], *hists[k], uniforms[k]);
    }
    step_lp_.clear();
    std::vector<float> row;
    for (size_t k = 0; k < ns; ++k) {
      const int64_t id = plan.seqs[size_t(sampling[k])].seq_id;
      const int n_top = seqs_.at(id).req.logprobs;
      if (n_top < 0) continue;
      const float* l = nullptr;
      if (!logits.empty()) {
        l = logits.data() + k * V;
      } else {  // only the rows of the requests that ask come back
        row.resize(size_t(V));
        be.download(row.data(), static_cast<const char*>(lg.data) + k * size_t(V) * 4, size_t(V) * 4);
        l = row.data();
      }
      step_lp_[id] = token_logprobs(l, V, picked[k], n_top);
    }
    for (size_t k = 0; k < ns; ++k) {
      const StepEntry& e = plan.seqs[size_t(sampling[k])];
      Seq& q = seqs_.at(e.seq_id);
      const int32_t t = picked[k];
      q.tokens.push_back(t);
      q.out.tokens.push_back(t);
      const bool go_on = !on_token_ || on_token_(e.seq_id, t);
      if (!go_on || std::find(q.stops.begin(), q.stops.end(), t) != q.stops.end()) {
        sched_->finish(e.seq_id, FinishReason::Eos);
        end(e.seq_id, "stop");
      }
    }
    for (int64_t id : sched_->commit(plan)) {
      sched_->finish(id, FinishReason::Length);
      end(id, "length");
    }
  }
  std::vector<BatchOutput> out = std::move(done_);
  done_.clear();
  return out;
}

}  // namespace nf4flash
