// The serve engine loop (serve_engine.h): submissions and cancellations are picked up between
// steps; each sampled token becomes text (held back while it may start a stop string) pushed to the
// sequence's handle; metrics are updated as sequences start and finish.
#include "serve/serve_engine.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/batch_runner.h"
#include "runtime/stop_text.h"
#include "tokenizer/tokenizer.h"

namespace nf4flash::serve {

using Clock = std::chrono::steady_clock;

std::vector<SeqEvent> SeqHandle::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, timeout, [&] { return !events_.empty(); });
  std::vector<SeqEvent> out(events_.begin(), events_.end());
  events_.clear();
  return out;
}

void SeqHandle::push(SeqEvent e) {
  {
    std::lock_guard<std::mutex> l(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

// A running sequence's text state (engine thread only).
struct ServeEngine::Live {
  Live(std::shared_ptr<SeqHandle> h, const Tokenizer& tok, std::vector<std::string> stop)
      : handle(std::move(h)), text(tok, std::move(stop)) {}
  std::shared_ptr<SeqHandle> handle;
  StopText text;
  size_t sent = 0;  // bytes of the text pushed to the handle
  int64_t tokens = 0;
  Clock::time_point submitted, last_token;
};


ServeEngine::~ServeEngine() {
  stop_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  live_.clear();
  runner_.reset();  // the engine's contiguous cache is back
}

ServeEngine::Submitted ServeEngine::submit(SubmitSpec s) {
  Submitted r;
  if (!accepting_) {
    r.refusal = Refusal::ShuttingDown;
    r.error = "the server is shutting down";
    return r;
  }
  const int64_t need = int64_t(s.prompt.size()) + s.gen.max_new_tokens;
  if (s.prompt.empty()) {
    r.refusal = Refusal::Invalid;
    r.error = "the prompt is empty";
    return r;
  }
  if (need > ctx_) {
    r.refusal = Refusal::TooLong;
    r.error = cat("this model's context is ", ctx_, " tokens; the request needs ", need, " (", s.prompt.size(),
                  " in the prompt, ", s.gen.max_new_tokens, " to generate)");
    return r;
  }
  std::lock_guard<std::mutex> l(mu_);
  if (waiting_.load() + int64_t(pending_.size()) >= opt_.max_waiting) {
    r.refusal = Refusal::QueueFull;
    r.error = cat("the server has ", opt_.max_waiting, " requests waiting; retry later");
    return r;
  }
  const int64_t id = next_id_++;
  r.handle = std::make_shared<SeqHandle>();
  handles_[id] = r.handle;
  pending_.emplace_back(id, std::move(s));
  ++in_flight_;
  cv_.notify_all();
  return r;
}

void ServeEngine::cancel_all() {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [id, h] : handles_) h->cancel();
  cv_.notify_all();
}

ServeEngine::ServeEngine(Engine& e, const ServeOptions& o, Metrics& metrics)
    : engine_(e), opt_(o), metrics_(metrics), ctx_(e.ctx_size()) {
  NF4FLASH_CHECK(e.tokenizer(), "serve: the model needs its tokenizer.json (requests are text)");
  BatchRunnerOptions bo;
  bo.block_size = opt_.block_size;
  bo.n_blocks = opt_.n_blocks;
  bo.sched.max_seqs_per_step = opt_.max_batch;
  bo.sched.max_tokens_per_step = std::max<int64_t>(opt_.step_tokens, opt_.max_batch);
  bo.sched.max_context = ctx_;
  bo.on_token = [this](int64_t id, int32_t t) { return on_token(id, t); };
  runner_ = std::make_unique<BatchRunner>(e, bo);  // Error (the caller reports it) before any thread starts
  thread_ = std::thread([this] { loop(); });
}

bool ServeEngine::on_token(int64_t id, int32_t t) {
  Live& q = live_.at(id);
  const Clock::time_point now = Clock::now();
  if (q.tokens == 0) metrics_.first_token(std::chrono::duration<double>(now - q.submitted).count());
  else metrics_.next_token(std::chrono::duration<double>(now - q.last_token).count());
  q.last_token = now;
  ++q.tokens;
  const bool stopped = q.text.push(t);
  SeqEvent ev;
  ev.tokens = q.tokens;
  ev.ids.push_back(t);
  if (const TokenLogprobs* lp = runner_->step_logprobs(id)) ev.logprobs.push_back(*lp);
  const size_t ready = q.text.ready();
  if (ready > q.sent) {
    ev.delta = q.text.text().substr(q.sent, ready - q.sent);
    q.sent = ready;
  }
  q.handle->push(std::move(ev));
  return !stopped;
}

void ServeEngine::loop() {
  const Tokenizer& tok = *engine_.tokenizer();
  BatchRunner* runner = runner_.get();
  std::map<int64_t, Live>& live = live_;
  while (!stop_) {
    std::deque<std::pair<int64_t, SubmitSpec>> incoming;
    std::vector<int64_t> cancelled;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (pending_.empty() && !runner->has_work())
        cv_.wait_for(l, std::chrono::milliseconds(200), [&] { return stop_ || !pending_.empty(); });
      incoming.swap(pending_);
      for (auto& [id, h] : handles_)
        if (h->cancelled() && live.count(id)) cancelled.push_back(id);
    }
    for (auto& [id, spec] : incoming) {
      std::shared_ptr<SeqHandle> h;
      {
        std::lock_guard<std::mutex> l(mu_);
        h = handles_.at(id);
      }
      live.try_emplace(id, h, tok, spec.stop);
      live.at(id).submitted = Clock::now();
      SubmitResult s;
      try {
        s = runner->submit({id, std::move(spec.prompt), spec.gen, spec.logprobs});
      } catch (const Error& e) {
        s.status = SubmitResult::Status::Rejected;
        s.error = e.what();
      }
      if (s.status == SubmitResult::Status::Rejected) {
        live.erase(id);
        SeqEvent ev;
        ev.finished = true;
        ev.finish_reason = "error: " + s.error;
        h->push(std::move(ev));
        std::lock_guard<std::mutex> l(mu_);
        handles_.erase(id);
        --in_flight_;
      }
    }
    for (int64_t id : cancelled) runner->cancel(id);
    std::vector<BatchOutput> done;
    if (runner->has_work()) {
      try {
        done = runner->step();
      } catch (const Error& e) {
        // a step that fails ends every live sequence with the error (the engine stays up)
        std::fprintf(stderr, "serve: step failed: %s\n", e.what());
        for (auto& [id, q] : live) runner->cancel(id);
        done = runner->step();
      }
    }
    for (BatchOutput& b : done) {
      auto it = live.find(b.id);
      if (it == live.end()) continue;
      Live& q = it->second;
      q.text.flush();  // the held-back text and what the decoder still holds (nothing once stopped)
      if (q.text.text().size() > q.sent) {
        SeqEvent tail;
        tail.tokens = q.tokens;
        tail.delta = q.text.text().substr(q.sent);
        q.handle->push(std::move(tail));
      }
      SeqEvent ev;
      ev.finished = true;
      ev.finish_reason = b.finish_reason;
      ev.tokens = int64_t(b.tokens.size());
      ev.prompt_tokens = b.prompt_tokens;
      ev.cached_tokens = b.cached_tokens;
      metrics_.sequence_done(b.prompt_tokens, b.cached_tokens, int64_t(b.tokens.size()));
      q.handle->push(std::move(ev));
      live.erase(it);
      {
        std::lock_guard<std::mutex> l(mu_);
        handles_.erase(b.id);
      }
      --in_flight_;
    }
    const Scheduler& sc = runner->scheduler();
    waiting_ = sc.n_waiting();
    const KvBlockPool& pool = runner->pool();
    metrics_.engine_state(sc.n_running(), sc.n_waiting(), pool.n_blocks() - pool.available_blocks(),
                          pool.available_blocks(), pool.block_size());
  }
  // shutting down: what is left ends as aborted
  for (auto& [id, q] : live) {
    SeqEvent ev;
    ev.finished = true;
    ev.finish_reason = "abort";
    ev.tokens = q.tokens;
    q.handle->push(std::move(ev));
  }
}

}  // namespace nf4flash::serve
