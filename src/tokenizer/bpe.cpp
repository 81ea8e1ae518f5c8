// BPE model (see bpe.h).
#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer_json.h"

#include <algorithm>
#include <array>
#include <thread>
#include <atomic>
#include <climits>
#include <cstdio>
#include <functional>
#include <queue>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace nf4flash::tok {
namespace {

struct ByteAlphabet {
  uint32_t to_cp[256];
  std::vector<int16_t> from_cp;  // indexed by code point < 512
  ByteAlphabet() : from_cp(512, -1) {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = direct ? uint32_t(b) : uint32_t(256 + n++);
      from_cp[to_cp[b]] = int16_t(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// Maps a byte-level token text back to raw bytes; false if a character is not in the alphabet.
bool byte_level_to_raw(std::string_view tok, std::string& raw) {
  raw.clear();
  for (size_t i = 0; i < tok.size();) {
    int b = unicode_to_byte(utf8_next(tok, i));
    if (b < 0) return false;
    raw.push_back(char(b));
  }
  return true;
}

const char kMeta[] = "\xE2\x96\x81";  // U+2581

std::atomic<uint64_t> g_serial{1};

// Per-thread cache of word -> ids, owned by one model at a time.
struct WordCache {
  uint64_t owner = 0;
  StrMap index;  // word -> entry number
  std::vector<std::pair<uint32_t, uint32_t>> entries;
  std::vector<int32_t> ids;
  void reset(uint64_t o) {
    owner = o;
    index = StrMap();
    index.reserve(1 << 15);
    entries.clear();
    ids.clear();
  }
};
thread_local WordCache t_cache;

struct Scratch {
  std::vector<int32_t> next, prev, rank, newid;
  std::vector<uint64_t> heap;
};
thread_local Scratch t_scratch;

constexpr size_t kMaxCachedWord = 256;
constexpr size_t kMaxCacheEntries = 1 << 17;

}  // namespace

uint32_t byte_to_unicode(uint8_t b) { return alphabet().to_cp[b]; }
int unicode_to_byte(uint32_t cp) { return cp < 512 ? alphabet().from_cp[cp] : -1; }

std::unique_ptr<BpeModel> BpeModel::from_json(const nlohmann::json& m, bool byte_level,
                                              const std::string& where, const BpeTables& tables) {
  auto bpe = std::make_unique<BpeModel>();
  BpeModel& b = *bpe;
  b.serial_ = g_serial.fetch_add(1);
  b.byte_level_ = byte_level;
  if (m.value("dropout", nlohmann::json()).is_number() && m["dropout"].get<double>() > 0)
    fail(where, ": BPE dropout is not supported");
  auto str_or_empty = [&](const char* k) {
    return m.contains(k) && m[k].is_string() ? m[k].get<std::string>() : std::string();
  };
  b.prefix_ = str_or_empty("continuing_subword_prefix");
  b.suffix_ = str_or_empty("end_of_word_suffix");
  b.byte_fallback_ = m.value("byte_fallback", false);
  b.fuse_unk_ = m.value("fuse_unk", false);
  b.ignore_merges_ = m.value("ignore_merges", false);
  if (byte_level && (!b.prefix_.empty() || !b.suffix_.empty()))
    fail(where, ": byte-level BPE with continuing_subword_prefix/end_of_word_suffix is not supported");

  if (!tables.has_vocab) fail(where, ": model.vocab is not an object");
  const auto& vocab = tables.vocab;
  b.vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab) {
    if (id < 0 || id > INT32_MAX / 2) fail(where, ": model.vocab id ", id, " out of range");
    b.vocab_.set(tok, int32_t(id));
    max_id = std::max(max_id, int32_t(id));
  }
  b.id_to_tok_.assign(size_t(max_id + 1), std::string());
  for (const auto& [tok, id] : vocab) b.id_to_tok_[size_t(id)] = tok;

  std::string unk = str_or_empty("unk_token");
  if (!unk.empty()) b.unk_id_ = b.vocab_.get(unk);

  for (int i = 0; i < 256; ++i) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", i);
    b.fallback_ids_[i] = b.vocab_.get(name);
    b.byte_ids_[i] = -1;
  }
  b.all_fallback_bytes_ = std::all_of(b.fallback_ids_, b.fallback_ids_ + 256, [](int32_t x) { return x >= 0; });

  if (byte_level) {
    std::string raw;
    b.raw_vocab_.reserve(vocab.size());
    for (int32_t id = 0; id <= max_id; ++id)
      if (!b.id_to_tok_[size_t(id)].empty() && byte_level_to_raw(b.id_to_tok_[size_t(id)], raw))
        b.raw_vocab_.set(raw, id);
    for (int i = 0; i < 256; ++i) {
      std::string s;
      utf8_append(s, byte_to_unicode(uint8_t(i)));
      b.byte_ids_[i] = b.vocab_.get(s);
    }
  }

  if (!tables.has_merges) fail(where, ": model.merges is not an array");
  const auto& merges = tables.merges;
  b.merges_.reserve(merges.size());
  // the ids of each merge's left, right and joined token: three vocab lookups per merge (most of a
  // Llama 3 load), split over two threads where there are two cores; then the pair map in rank order
  std::vector<std::array<int32_t, 3>> ids(merges.size());
  auto lookup = [&](size_t i0, size_t i1) {
    constexpr size_t kBatch = 16;  // lookups whose first slots are fetched together
    std::string joined[kBatch];
    uint64_t hs[kBatch][3];
    for (size_t c0 = i0; c0 < i1; c0 += kBatch) {
      const size_t n = std::min(kBatch, i1 - c0);
      for (size_t j = 0; j < n; ++j) {
        const auto& [left, right] = merges[c0 + j];
        joined[j].assign(left).append(right);
        hs[j][0] = b.vocab_.prefetch(left);
        hs[j][1] = b.vocab_.prefetch(right);
        hs[j][2] = b.vocab_.prefetch(joined[j]);
      }
      for (size_t j = 0; j < n; ++j) {
        const auto& [left, right] = merges[c0 + j];
        ids[c0 + j] = {b.vocab_.get_hashed(left, hs[j][0]), b.vocab_.get_hashed(right, hs[j][1]),
                       b.vocab_.get_hashed(joined[j], hs[j][2])};
      }
    }
  };
  const size_t half = merges.size() / 2;
  if (merges.size() >= 4096 && std::thread::hardware_concurrency() > 1) {
    std::thread t(lookup, half, merges.size());
    lookup(0, half);
    t.join();
  } else {
    lookup(0, merges.size());
  }
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto [a, c, id] = ids[i];
    if (a < 0 || c < 0 || id < 0)
      fail(where, ": model.merges entry ", i, " ('", merges[i].first, "', '", merges[i].second,
           "') uses a token missing from the vocab");
    b.merges_.set(a, c, PairMap::Value{int32_t(i), id});
  }

  if (!byte_level && b.prefix_.empty() && b.suffix_.empty() && b.vocab_.get(kMeta) >= 0) {
    // No token may contain a character followed by U+2581: then no merge can join the symbols on
    // both sides of such a position, and BPE on the parts equals BPE on the whole.
    bool ok = true;
    for (const std::string& t : b.id_to_tok_) {
      for (size_t p = t.find(kMeta, 1); ok && p != std::string::npos; p = t.find(kMeta, p + 3))
        if (p < 3 || t.compare(p - 3, 3, kMeta) != 0) ok = false;
      if (!ok) break;
    }
    b.metaspace_cut_ = ok;
  }
  return bpe;
}

const std::string& BpeModel::id_to_token(int32_t id) const {
  static const std::string empty;
  if (id < 0 || size_t(id) >= id_to_tok_.size()) return empty;
  return id_to_tok_[size_t(id)];
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& out) const {
  if (!metaspace_cut_ || piece.size() <= 3) {
    encode_word(piece, out);
    return;
  }
  // Cut before each U+2581 that follows a character other than U+2581.
  size_t start = 0;
  for (size_t p = piece.find(kMeta, 1); p != std::string_view::npos; p = piece.find(kMeta, p + 3)) {
    if (p >= 3 && piece.compare(p - 3, 3, kMeta) == 0) continue;
    if (p > start) {
      encode_word(piece.substr(start, p - start), out);
      start = p;
    }
  }
  encode_word(piece.substr(start), out);
}

void BpeModel::encode_word(std::string_view w, std::vector<int32_t>& out) const {
  if (w.empty()) return;
  if (ignore_merges_) {
    int32_t id = byte_level_ ? raw_vocab_.get(w) : vocab_.get(w);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  WordCache& cache = t_cache;
  bool cacheable = w.size() <= kMaxCachedWord;
  if (cacheable) {
    if (cache.owner != serial_) cache.reset(serial_);
    int32_t e = cache.index.get(w);
    if (e >= 0) {
      auto [off, len] = cache.entries[size_t(e)];
      out.insert(out.end(), cache.ids.begin() + off, cache.ids.begin() + off + len);
      return;
    }
  }
  size_t first = out.size();
  std::vector<int32_t> syms;
  syms.reserve(w.size());
  initial_symbols(w, syms);
  merge(syms);
  for (int32_t s : syms)
    if (s >= 0) out.push_back(s);
  if (cacheable) {
    if (cache.entries.size() >= kMaxCacheEntries) cache.reset(serial_);
    cache.index.set(w, int32_t(cache.entries.size()));
    cache.entries.emplace_back(uint32_t(cache.ids.size()), uint32_t(out.size() - first));
    cache.ids.insert(cache.ids.end(), out.begin() + first, out.end());
  }
}

void BpeModel::initial_symbols(std::string_view w, std::vector<int32_t>& syms) const {
  if (byte_level_) {
    for (unsigned char c : w) {
      int32_t id = byte_ids_[c];
      if (id >= 0) syms.push_back(id);
      else if (unk_id_ >= 0 && !(fuse_unk_ && !syms.empty() && syms.back() == unk_id_)) syms.push_back(unk_id_);
    }
    return;
  }
  bool pending_unk = false;  // an unk symbol waiting to be pushed (fuse_unk joins runs)
  std::string s;
  for (size_t i = 0; i < w.size();) {
    size_t start = i;
    utf8_next(w, i);
    std::string_view ch = w.substr(start, i - start);
    std::string_view key = ch;
    if ((!prefix_.empty() && start > 0) || (!suffix_.empty() && i == w.size())) {
      s.clear();
      if (!prefix_.empty() && start > 0) s += prefix_;
      s.append(ch);
      if (!suffix_.empty() && i == w.size()) s += suffix_;
      key = s;
    }
    int32_t id = vocab_.get(key);
    if (id >= 0) {
      if (pending_unk) {
        syms.push_back(unk_id_);
        pending_unk = false;
      }
      syms.push_back(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : key) all = all && fallback_ids_[c] >= 0;
      if (all) {
        if (pending_unk) {
          syms.push_back(unk_id_);
          pending_unk = false;
        }
        for (unsigned char c : key) syms.push_back(fallback_ids_[c]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) syms.push_back(unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) syms.push_back(unk_id_);
}

void BpeModel::merge(std::vector<int32_t>& syms) const {
  const int n = int(syms.size());
  if (n < 2) return;
  Scratch& sc = t_scratch;
  sc.next.resize(size_t(n));
  sc.prev.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    sc.next[size_t(i)] = i + 1 < n ? i + 1 : -1;
    sc.prev[size_t(i)] = i - 1;
  }
  int32_t* next = sc.next.data();
  int32_t* prev = sc.prev.data();
  int32_t* s = syms.data();
  auto unlink_right = [&](int i) {  // merge symbol i with its right neighbour
    int j = next[i];
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    s[j] = -1;
  };

  if (n <= 64) {
    sc.rank.resize(size_t(n));
    sc.newid.resize(size_t(n));
    int32_t* rank = sc.rank.data();
    int32_t* newid = sc.newid.data();
    auto update = [&](int i) {
      if (next[i] < 0) {
        rank[i] = INT32_MAX;
        return;
      }
      PairMap::Value v = merges_.get(s[i], s[next[i]]);
      rank[i] = v.rank >= 0 ? v.rank : INT32_MAX;
      newid[i] = v.id;
    };
    for (int i = 0; i < n; ++i) update(i);
    for (;;) {
      int best = -1;
      int32_t best_rank = INT32_MAX;
      for (int i = 0; i >= 0; i = next[i])
        if (rank[i] < best_rank) {
          best_rank = rank[i];
          best = i;
        }
      if (best < 0) break;
      s[best] = newid[best];
      unlink_right(best);
      update(best);
      if (prev[best] >= 0) update(prev[best]);
    }
    return;
  }

  // Long words: a min-heap of (rank, position); stale entries are skipped when popped.
  auto& heap = sc.heap;
  heap.clear();
  auto push = [&](int i) {
    if (next[i] < 0) return;
    PairMap::Value v = merges_.get(s[i], s[next[i]]);
    if (v.rank >= 0) {
      heap.push_back((uint64_t(uint32_t(v.rank)) << 32) | uint32_t(i));
      std::push_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
    }
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
    uint64_t top = heap.back();
    heap.pop_back();
    int i = int(uint32_t(top));
    int32_t r = int32_t(top >> 32);
    if (s[i] < 0 || next[i] < 0) continue;
    PairMap::Value v = merges_.get(s[i], s[next[i]]);
    if (v.rank != r) continue;
    s[i] = v.id;
    unlink_right(i);
    if (prev[i] >= 0) push(prev[i]);
    push(i);
  }
}

}  // namespace nf4flash::tok
