// Small open-addressing hash tables for the tokenizer hot path: StrMap (byte string -> int32,
// keys stored in one arena) and PairMap (pair of token ids -> merge rank and result id).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace nf4flash::tok {

inline uint64_t hash_bytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
  }
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 32);
}

inline bool bytes_equal(const char* a, const char* b, size_t n) {
  if (n <= 8) {
    if (n >= 4) {
      uint32_t x0, y0, x1, y1;
      std::memcpy(&x0, a, 4);
      std::memcpy(&y0, b, 4);
      std::memcpy(&x1, a + n - 4, 4);
      std::memcpy(&y1, b + n - 4, 4);
      return x0 == y0 && x1 == y1;
    }
    for (size_t i = 0; i < n; ++i)
      if (a[i] != b[i]) return false;
    return true;
  }
  return std::memcmp(a, b, n) == 0;
}

class StrMap {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
  }
  // Inserts or overwrites.
  void set(std::string_view key, int32_t value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    uint64_t h = hash_bytes(key.data(), key.size());
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.len == kEmpty) {
        s = Slot{h, uint32_t(arena_.size()), uint32_t(key.size()), value};
        arena_.append(key);
        ++size_;
        return;
      }
      if (s.hash == h && s.len == key.size() && bytes_equal(arena_.data() + s.off, key.data(), key.size())) {
        s.value = value;
        return;
      }
    }
  }
  // Returns the value or -1.
  int32_t get(std::string_view key) const { return get_hashed(key, hash_bytes(key.data(), key.size())); }
  // A lookup in two halves, for batches of them: prefetch() hashes the key and starts loading its
  // first slot; get_hashed() with that hash probes once the line has arrived.
  uint64_t prefetch(std::string_view key) const {
    const uint64_t h = hash_bytes(key.data(), key.size());
    if (size_) __builtin_prefetch(&slots_[h & mask_]);
    return h;
  }
  int32_t get_hashed(std::string_view key, uint64_t h) const {
    if (size_ == 0) return -1;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.len == kEmpty) return -1;
      if (s.hash == h && s.len == key.size() && bytes_equal(arena_.data() + s.off, key.data(), key.size()))
        return s.value;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;
  struct Slot {
    uint64_t hash = 0;
    uint32_t off = 0, len = kEmpty;
    int32_t value = -1;
  };
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    size_t cap = old.empty() ? 16 : old.size() * 2;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    for (const Slot& s : old) {
      if (s.len == kEmpty) continue;
      for (size_t i = s.hash & mask_;; i = (i + 1) & mask_)
        if (slots_[i].len == kEmpty) {
          slots_[i] = s;
          break;
        }
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t mask_ = 0, size_ = 0;
};

class PairMap {
 public:
  struct Value {
    int32_t rank = -1, id = -1;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, Value{});
    mask_ = cap - 1;
  }
  void set(int32_t a, int32_t b, Value v) {
    uint64_t k = key(a, b);
    for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == kEmpty || keys_[i] == k) {
        keys_[i] = k;
        vals_[i] = v;
        return;
      }
    }
  }
  // rank -1 when absent.
  Value get(int32_t a, int32_t b) const {
    uint64_t k = key(a, b);
    for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == k) return vals_[i];
      if (keys_[i] == kEmpty) return Value{};
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  static uint64_t hash(uint64_t k) {
    k *= 0x9E3779B97F4A7C15ull;
    return k ^ (k >> 29);
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> vals_;
  size_t mask_ = 0;
};

}  // namespace nf4flash::tok
