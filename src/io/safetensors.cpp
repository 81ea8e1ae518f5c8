#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace nf4flash {

namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path, ": cannot stat");
  }
  map_size_ = static_cast<size_t>(st.st_size);
  if (map_size_ < 8) {
    ::close(fd);
    fail(path, ": not a safetensors file (", map_size_, " bytes, shorter than the 8-byte header length)");
  }
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(path, ": mmap failed");
  }
  try {
    parse_header();
  } catch (...) {  // the destructor does not run for a constructor that throws: unmap here
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

void SafetensorsFile::parse_header() {
  const std::string& path = path_;
  const auto* base = static_cast<const uint8_t*>(map_);
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);
  if (header_len > map_size_ - 8 || header_len > (100u << 20))
    fail(path, ": header length ", header_len, " exceeds the file size ", map_size_);
  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(base + 8),
                         reinterpret_cast<const char*>(base + 8 + header_len));
  } catch (const std::exception& e) {
    fail(path, ": header is not valid JSON (", e.what(), ")");
  }
  if (!header.is_object()) fail(path, ": header is not a JSON object");
  const size_t data_start = 8 + header_len;
  const size_t data_size = map_size_ - data_start;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_object())
        for (auto m = it->begin(); m != it->end(); ++m)
          if (m->is_string()) metadata_[m.key()] = m->get<std::string>();
      continue;
    }
    const std::string& name = it.key();
    const json& e = *it;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      fail(path, ": tensor ", name, ": entry lacks dtype, shape or data_offsets");
    TensorInfo t;
    t.name = name;
    t.file = path;
    if (!e["dtype"].is_string() || !dtype_from_name(e["dtype"].get<std::string>(), &t.dtype))
      fail(path, ": tensor ", name, ": unsupported dtype ", e["dtype"].dump());
    const json& shp = e["shape"];
    if (!shp.is_array()) fail(path, ": tensor ", name, ": shape is not an array");
    int64_t numel = 1;
    for (const auto& d : shp) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        fail(path, ": tensor ", name, ": bad dimension ", d.dump());
      const int64_t v = d.get<int64_t>();
      if (v != 0 && numel > (int64_t{1} << 50) / v) fail(path, ": tensor ", name, ": shape too large");
      numel *= v;
      t.shape.push_back(v);
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(path, ": tensor ", name, ": data_offsets must be two non-negative integers");
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > data_size)
      fail(path, ": tensor ", name, ": data_offsets [", b, ", ", en, "] outside the data region of ",
           data_size, " bytes (truncated file?)");
    const uint64_t expect = static_cast<uint64_t>(numel) * dtype_size(t.dtype);
    if (en - b != expect)
      fail(path, ": tensor ", name, ": ", en - b, " bytes for ", dtype_name(t.dtype), " ", t.shape_str(),
           ", expected ", expect);
    t.data = base + data_start + b;
    t.nbytes = en - b;
    ranges.emplace_back(b, en);
    index_[name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second && ranges[i].first != ranges[i].second)
      fail(path, ": tensors overlap in the data region at byte ", ranges[i].first);
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::unique_ptr<WeightStore> WeightStore::open_file(const std::string& path) {
  auto ws = std::unique_ptr<WeightStore>(new WeightStore());
  ws->source_ = path;
  ws->files_.push_back(std::make_unique<SafetensorsFile>(path));
  for (const auto& t : ws->files_.back()->tensors()) ws->by_name_[t.name] = &t;
  return ws;
}

std::unique_ptr<WeightStore> WeightStore::open_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) fail(dir, ": not a directory");
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  auto ws = std::unique_ptr<WeightStore>(new WeightStore());
  ws->source_ = dir;
  if (fs::exists(index)) {
    json j;
    try {
      std::ifstream in(index);
      j = json::parse(in);
    } catch (const std::exception& e) {
      fail(index.string(), ": not valid JSON (", e.what(), ")");
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail(index.string(), ": no weight_map object");
    std::map<std::string, std::vector<std::string>> by_shard;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string()) fail(index.string(), ": weight_map entry ", it.key(), " is not a file name");
      const std::string shard = it->get<std::string>();
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos)
        fail(index.string(), ": shard name ", shard, " must be a plain file name");
      by_shard[shard].push_back(it.key());
    }
    for (const auto& [shard, names] : by_shard) {
      ws->files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / shard).string()));
      const auto& f = *ws->files_.back();
      for (const auto& n : names) {
        const TensorInfo* t = f.find(n);
        if (!t) fail(f.path(), ": index says it holds tensor ", n, " but it does not");
        ws->by_name_[n] = t;
      }
    }
  } else if (fs::exists(single)) {
    ws->files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const auto& t : ws->files_.back()->tensors()) ws->by_name_[t.name] = &t;
  } else {
    fail(dir, ": no model.safetensors or model.safetensors.index.json");
  }
  return ws;
}

const TensorInfo* WeightStore::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorInfo& WeightStore::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) fail(source_, ": missing tensor ", name);
  return *t;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  for (const auto& [n, t] : by_name_) out.push_back(n);
  return out;
}

size_t WeightStore::total_bytes() const {
  size_t n = 0;
  for (const auto& [name, t] : by_name_) n += t->nbytes;
  return n;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (static_cast<size_t>(numel) * dtype_size(t.dtype) != t.nbytes)
      fail("write ", path, ": tensor ", t.name, ": byte size does not match dtype and shape");
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("cannot write ", path);
  const uint64_t n = h.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& t : tensors) out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.nbytes));
  if (!out.good()) fail("write ", path, ": I/O error");
}

}  // namespace nf4flash
