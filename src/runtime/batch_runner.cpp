// BatchRunner (batch_runner.h): one step = the scheduler's plan, the KV blocks it needs, one
// forward over every scheduled row, per-sequence sampling, then finish / commit.
#include "runtime/batch_runner.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/engine_impl.h"

namespace nf4flash {

namespace {
std::unique_ptr<Buffer> upload_ints(Backend& be, const std::vector<int32_t>& v) {
  auto b = be.alloc(std::max<size_t>(v.size(), 1) * 4);
  be.upload(b->data(), v.data(), v.size() * 4);
  return b;
}
}  // namespace

BatchRunner::BatchRunner(Engine& engine, const BatchRunnerOptions& o) : engine_(engine), on_token_(o.on_token) {
  Engine::Impl& im = engine.internals();
  NF4FLASH_CHECK(o.block_size >= 1, "batch: block size ", o.block_size);
  SchedulerConfig c = o.sched;
  c.max_tokens_per_step = std::min(c.max_tokens_per_step, im.dec->max_rows());
  c.max_seqs_per_step = std::min(c.max_seqs_per_step, c.max_tokens_per_step);
  c.max_context = std::min(c.max_context, im.ctx);
  const int64_t per_seq = (c.max_context + o.block_size - 1) / o.block_size;
  const int64_t n_blocks = o.n_blocks > 0 ? o.n_blocks : per_seq * c.max_seqs_per_step;
  pool_ = std::make_unique<KvBlockPool>(n_blocks, o.block_size);
  im.be->kv_allocate_paged(im.be->kv_desc(), n_blocks, o.block_size);  // Error naming the backend without it
  im.kv_tokens.clear();
  kv_ = std::make_unique<PoolAdmission>(*pool_);
  sched_ = std::make_unique<Scheduler>(c, *kv_);
}

// The engine's single-sequence calls use the contiguous cache again afterwards.
BatchRunner::~BatchRunner() {
  Engine::Impl& im = engine_.internals();
  KVCacheDesc d = im.be->kv_desc();
  d.capacity = im.ctx;
  im.be->kv_allocate(d);
}

SubmitResult BatchRunner::submit(BatchRequest r) {
  const int64_t V = engine_.vocab_size();
  NF4FLASH_CHECK(!r.prompt.empty(), "request ", r.id, ": empty prompt");
  for (int32_t t : r.prompt) NF4FLASH_CHECK(t >= 0 && t < V, "request ", r.id, ": token id ", t, " outside the vocabulary (", V, ")");
  NF4FLASH_CHECK(!seqs_.count(r.id), "request ", r.id, " is already running");
  const int64_t cached = kv_->start(r.id, r.prompt);
  const SubmitResult s =
      sched_->submit({r.id, int64_t(r.prompt.size()), cached, int64_t(r.gen.max_new_tokens)});
  if (s.status != SubmitResult::Status::Accepted) {
    kv_->release(r.id);
    if (s.status == SubmitResult::Status::Finished)
      done_.push_back({r.id, {}, "length", int64_t(r.prompt.size()), 0});
    return s;
  }
  Seq q;
  q.tokens = r.prompt;
  q.stops = r.gen.stop_ids.empty() ? engine_.eos_ids() : r.gen.stop_ids;
  if (r.gen.ignore_eos) q.stops.clear();
  q.sampler = std::make_unique<Sampler>(r.gen.sampling);
  q.out.id = r.id;
  q.out.prompt_tokens = int64_t(r.prompt.size());
  q.out.cached_tokens = cached;
  q.req = std::move(r);
  seqs_.emplace(q.req.id, std::move(q));
  return s;
}

void BatchRunner::end(int64_t id, const char* reason) {
  kv_->release(id);
  auto it = seqs_.find(id);
  it->second.out.finish_reason = reason;
  done_.push_back(std::move(it->second.out));
  seqs_.erase(it);
}

std::vector<BatchOutput> BatchRunner::step() {
  Engine::Impl& im = engine_.internals();
  Backend& be = *im.be;
  const StepPlan plan = sched_->plan_step();
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
    const int64_t n_logits = std::max<int64_t>(1, int64_t(logit_rows.size()));
    if (logit_rows.empty()) logit_rows.push_back(row_start.back() - 1);  // forward gives one row at least
    auto idb = upload_ints(be, ids), rsb = upload_ints(be, row_start), p0b = upload_ints(be, pos0),
         tbb = upload_ints(be, tables), lrb = upload_ints(be, logit_rows);
    PagedSeqs ps;
    ps.n_seqs = n;
    ps.row_start = static_cast<const int32_t*>(rsb->data());
    ps.pos0 = static_cast<const int32_t*>(p0b->data());
    ps.block_tables = static_cast<const int32_t*>(tbb->data());
    ps.max_blocks = max_blocks;
    StepState s;
    s.paged = &ps;
    const int64_t V = engine_.vocab_size();
    auto lg = be.alloc(size_t(n_logits * V) * 4);
    im.dec->forward(static_cast<const int32_t*>(idb->data()), int64_t(ids.size()), s,
                    Act{lg->data(), DType::F32, n_logits, V}, n_logits, static_cast<const int32_t*>(lrb->data()));
    std::vector<float> logits(size_t(n_logits * V));
    be.download(logits.data(), lg->data(), logits.size() * 4);
    // the computed full blocks enter the prefix cache (before a finish releases them)
    for (const StepEntry& e : plan.seqs) kv_->computed(e.seq_id, seqs_.at(e.seq_id).tokens);
    for (size_t k = 0; k < sampling.size(); ++k) {
      const StepEntry& e = plan.seqs[size_t(sampling[k])];
      Seq& q = seqs_.at(e.seq_id);
      const SamplingParams& sp = q.req.gen.sampling;
      const float u = sp.greedy() ? 0.0f : q.sampler->next_uniform();
      const int32_t t = sample_with_uniform(logits.data() + k * V, V, sp, q.tokens, u);
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
