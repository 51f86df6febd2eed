// The safetensors format (8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}}, raw little-endian data) and the durable file
// operations of checkpoints (fsync, atomic replace).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "distjax/core/dtype.hpp"
#include "distjax/core/shape.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::train::detail {

/// "F32", "BF16", "F16", "I32", "I64" (safetensors' names).
const char* safetensors_dtype(DType t);

/// Writes `tensors` (name -> contiguous host tensor) as a safetensors file at `path` and
/// fsyncs it. `metadata` goes into "__metadata__". Throws IoError naming the file.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, tensor::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata);

/// The bytes of a tensor of `shape` read from a file, with elements of `element_bytes`; nullopt
/// when a dimension is negative or the count overflows (no tensor has that shape).
std::optional<std::uint64_t> tensor_bytes(const Shape& shape, std::uint64_t element_bytes);

/// One entry of a safetensors header.
struct SafetensorsEntry {
  std::string dtype;  // as written ("F32", ...)
  Shape shape;
  std::uint64_t begin = 0, end = 0;  // data_offsets, relative to the data section
};

/// An open safetensors file whose header is parsed and checked on open: the header
/// length fits the file, the header is a JSON object, each entry has dtype, shape and
/// data_offsets, and the offsets lie within the data section. Errors are IoError
/// "[op] <path>: <what is wrong>".
class SafetensorsReader {
 public:
  SafetensorsReader(std::string path, const char* op);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  /// The entry `name`, checked against the dtype and shape the index expects.
  const SafetensorsEntry& entry(const std::string& name, DType dtype, const Shape& shape) const;
  /// Reads `bytes` bytes at `offset` bytes into the data of `entry` into `dst`.
  void read(const SafetensorsEntry& entry, std::uint64_t offset, void* dst,
            std::uint64_t bytes) const;
  const std::string& path() const { return path_; }
  /// Every entry of the header, by name, as parsed (unchecked against any index).
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }

 private:
  std::string path_;
  const char* op_;
  int fd_ = -1;
  std::uint64_t data_start_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
};

/// fsync of a directory (makes renames and new entries in it durable).
void fsync_dir(const std::string& dir);
/// Writes `text` to `path` atomically: path.tmp, fsync, rename, fsync of the directory.
void write_file_atomic(const std::string& path, const std::string& text);
/// The whole file as text; IoError naming it when it cannot be read.
std::string read_text_file(const std::string& path, const char* op);

}  // namespace distjax::train::detail
