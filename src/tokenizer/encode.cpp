// The encode pipeline (added tokens -> normalizer -> normalized added tokens -> pre-tokenizer ->
// BPE), multi-threaded encoding of long inputs and batches, and the streaming decoder.
#include <algorithm>
#include <atomic>
#include <thread>

#include "core/thread_pool.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace nf4flash {
namespace tok {
namespace {

// Runs fn(i) for i in [0, n) on up to `threads` threads (the caller takes part).
template <typename F>
void run_tasks(size_t n, int threads, F&& fn) {
  size_t nt = std::min(size_t(std::max(threads, 1)), n);
  if (nt <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(nt - 1);
  for (size_t t = 0; t + 1 < nt; ++t) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

constexpr size_t kParallelMin = 64 * 1024;  // inputs below this are encoded on one thread
constexpr size_t kChunk = 32 * 1024;         // target chunk size for parallel encoding

// A safe cut: a space preceded by printable ASCII (see TokenizerImpl::chunkable_).
inline bool safe_cut(std::string_view s, size_t p) {
  if (p == 0 || p >= s.size() || s[p] != ' ') return false;
  unsigned char c = static_cast<unsigned char>(s[p - 1]);
  return c >= 0x21 && c <= 0x7E;
}

}  // namespace

void TokenizerImpl::encode_normalized(std::string_view norm, bool first, std::vector<int32_t>& out) const {
  const BpeModel& m = *model_;
  pretok_.run(norm, first, [&](std::string_view piece) { m.encode(piece, out); });
}

void TokenizerImpl::encode_segment(std::string_view seg, bool first, bool continuation,
                                   std::vector<int32_t>& out) const {
  if (seg.empty()) return;
  std::string norm_buf;
  std::string_view norm = seg;
  if (!normalizer_.empty()) {
    normalizer_.run(seg, norm_buf, continuation);
    norm = norm_buf;
  }
  if (norm_matcher_.empty()) {
    encode_normalized(norm, first, out);
    return;
  }
  std::vector<Split> splits;
  norm_matcher_.split(norm, splits);
  for (const Split& s : splits) {
    if (s.id >= 0) out.push_back(s.id);
    else encode_normalized(norm.substr(s.begin, s.end - s.begin), first && s.begin == 0, out);
  }
}

void TokenizerImpl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  std::string fixed;
  if (!utf8_valid(text)) {
    fixed = utf8_lossy(text);
    text = fixed;
  }
  if (raw_matcher_.empty()) {
    encode_segment(text, true, false, out);
    return;
  }
  std::vector<Split> splits;
  raw_matcher_.split(text, splits);
  for (const Split& s : splits) {
    if (s.id >= 0) out.push_back(s.id);
    else encode_segment(text.substr(s.begin, s.end - s.begin), s.begin == 0, false, out);
  }
}

void TokenizerImpl::encode_parallel(std::string_view text, std::vector<int32_t>& out, int threads) const {
  if (threads <= 1 || text.size() < kParallelMin || !chunkable_) {
    encode_text(text, out);
    return;
  }
  std::string fixed;
  if (!utf8_valid(text)) {
    fixed = utf8_lossy(text);
    text = fixed;
  }
  std::vector<Split> splits;
  raw_matcher_.split(text, splits);
  struct Task {
    int32_t id;  // added token, or -1
    size_t begin, end;
    bool first, continuation;
  };
  std::vector<Task> tasks;
  for (const Split& s : splits) {
    if (s.id >= 0) {
      tasks.push_back({s.id, s.begin, s.end, false, false});
      continue;
    }
    size_t b = s.begin;
    bool cont = false;
    while (s.end - b > kChunk + kChunk / 2) {
      // Look for a safe cut after b + kChunk, within the next 16 KiB.
      size_t p = b + kChunk, limit = std::min(s.end, p + 16 * 1024);
      std::string_view seg = text.substr(0, s.end);
      while (p < limit && !safe_cut(seg, p)) ++p;
      if (p >= limit) break;
      tasks.push_back({-1, b, p, b == 0, cont});
      b = p;
      cont = true;
    }
    tasks.push_back({-1, b, s.end, b == 0, cont});
  }
  std::vector<std::vector<int32_t>> parts(tasks.size());
  run_tasks(tasks.size(), threads, [&](size_t i) {
    const Task& t = tasks[i];
    if (t.id >= 0) parts[i].push_back(t.id);
    else encode_segment(text.substr(t.begin, t.end - t.begin), t.first, t.continuation, parts[i]);
  });
  size_t total = out.size();
  for (const auto& p : parts) total += p.size();
  out.reserve(total);
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
}

}  // namespace tok

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts,
                                                          bool add_special_tokens, int threads) const {
  if (threads <= 0) threads = num_threads();
  std::vector<std::vector<int32_t>> out(texts.size());
  tok::run_tasks(texts.size(), threads, [&](size_t i) {
    impl_->encode_text(texts[i], out[i]);
    if (add_special_tokens) impl_->add_special(out[i]);
  });
  return out;
}

// ---- streaming decode ------------------------------------------------------------------------

namespace {
bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}
constexpr size_t kMaxPending = 16;  // give up waiting for completion after this many ids
}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(tok), skip_special_(skip_special_tokens) {}

void StreamDecoder::reset() {
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
}

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  std::string s = tok_.decode(ids_, skip_special_);
  bool complete = !ends_with_replacement(s) || ids_.size() - prefix_index_ >= kMaxPending;
  if (s.size() <= prefix_.size() || !complete) return {};
  std::string out = s.compare(0, prefix_.size(), prefix_) == 0 ? s.substr(prefix_.size()) : s;
  // The ids just emitted become the context of the next step.
  ids_.erase(ids_.begin(), ids_.begin() + std::ptrdiff_t(prefix_index_));
  prefix_index_ = ids_.size();
  prefix_ = tok_.decode(ids_, skip_special_);
  return out;
}

std::string StreamDecoder::flush() {
  std::string s = tok_.decode(ids_, skip_special_);
  std::string out;
  if (s.size() > prefix_.size() && s.compare(0, prefix_.size(), prefix_) == 0) out = s.substr(prefix_.size());
  reset();
  return out;
}

}  // namespace nf4flash
