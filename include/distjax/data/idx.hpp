// The IDX file format of (Fashion-)MNIST: a big-endian header (magic, dimension sizes)
// followed by the raw elements. Gzipped files are read and written transparently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace distjax::data {

/// An IDX array of unsigned bytes (type code 0x08, the only one (Fashion-)MNIST uses).
struct IdxArray {
  std::vector<std::int64_t> dims;  ///< e.g. (60000, 28, 28) for images, (60000) for labels
  std::vector<std::uint8_t> data;  ///< row-major, product(dims) bytes
};

/// Reads an IDX file, gzipped or not. Throws IoError naming the file when it cannot be
/// opened, is truncated, or is not an unsigned-byte IDX file.
IdxArray read_idx(const std::string& path);

/// Writes an unsigned-byte IDX file, gzipped when `gzip` (tests make small fixtures).
void write_idx(const std::string& path, const IdxArray& array, bool gzip = true);

}  // namespace distjax::data
