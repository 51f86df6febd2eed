// Checksums of checkpoint data, and reads checked against them: zlib's CRC-32 (the checksum
// of zip, gzip and PNG; Python's zlib.crc32 computes the same) over fixed-size chunks, so
// that a reader checks only the chunks it reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distjax/train/detail/safetensors.hpp"

namespace distjax::train::detail {

/// Bytes of data per checksum in the checkpoints this build writes (the index records it).
inline constexpr std::uint64_t kChecksumChunkBytes = std::uint64_t{1} << 20;

/// CRC-32 of `bytes` bytes at `data`.
std::uint32_t crc32(const void* data, std::uint64_t bytes);

/// CRC-32 of each `chunk`-byte piece of the `bytes` bytes at `data` (the last one
/// shorter; none for no bytes).
std::vector<std::uint32_t> chunk_crc32(const void* data, std::uint64_t bytes, std::uint64_t chunk);

/// Chunks of `chunk` bytes covering `bytes` bytes.
inline std::uint64_t num_chunks(std::uint64_t bytes, std::uint64_t chunk) {
  return (bytes + chunk - 1) / chunk;
}

/// "0x1234abcd".
std::string hex32(std::uint32_t v);

/// Reads of one entry of a safetensors file whose data has the CRC-32s `crc32` (one per
/// `chunk_bytes` chunk): each chunk a read touches is read whole and checked the first
/// time, so a reader checks only (whole chunks of) what it reads. A mismatch is an IoError
/// naming the file, the tensor `name` and the chunk's bytes. The arguments must outlive
/// the object.
class CheckedReads {
 public:
  CheckedReads(const SafetensorsReader& file, const SafetensorsEntry& entry,
               const std::string& name, const std::vector<std::uint32_t>& crc32,
               std::uint64_t chunk_bytes);
  /// SafetensorsReader::read of `bytes` bytes at `offset` into the data, after the check.
  void read(std::uint64_t offset, void* dst, std::uint64_t bytes);

 private:
  void check(std::uint64_t chunk);

  const SafetensorsReader& file_;
  const SafetensorsEntry& entry_;
  const std::string& name_;
  const std::vector<std::uint32_t>& crc32_;
  std::uint64_t chunk_bytes_;
  std::vector<bool> checked_;
  std::vector<char> buffer_;
};

}  // namespace distjax::train::detail
