// safetensors reading (mmap, single file or sharded via model.safetensors.index.json) and writing.
// Every header entry is bounds-checked against the file: offsets ordered, inside the data region,
// and consistent with dtype x shape. Errors name the file and tensor.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace nf4flash {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mmapped file
  size_t nbytes = 0;
  std::string file;  // path of the file holding it (for error messages)

  int64_t numel() const;
  std::string shape_str() const;  // "[1024, 256]"
};

class SafetensorsFile {
 public:
  // Opens and validates; throws Error naming the file on any inconsistency.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;

 private:
  void parse_header();

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model folder: model.safetensors, or the shards listed by
// model.safetensors.index.json (each shard checked to hold what the index says).
class WeightStore {
 public:
  static std::unique_ptr<WeightStore> open_dir(const std::string& dir);
  static std::unique_ptr<WeightStore> open_file(const std::string& path);
  virtual ~WeightStore() = default;

  // Subclasses (synthetic presets) may produce tensors on demand; release() says the caller is
  // done with a tensor so its memory can go.
  virtual const TensorInfo* find(const std::string& name) const;
  virtual void release(const std::string& name) const {}
  const TensorInfo& get(const std::string& name) const;  // throws "missing tensor NAME in DIR"
  virtual std::vector<std::string> names() const;
  const std::string& source() const { return source_; }
  size_t total_bytes() const;

 protected:
  WeightStore() = default;
  std::string source_;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> by_name_;
};

// Writing: tensors are laid out in the order given, 8-byte aligned header as the format requires.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  size_t nbytes;
};
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace nf4flash
