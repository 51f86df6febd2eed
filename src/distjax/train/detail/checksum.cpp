#include "distjax/train/detail/checksum.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "distjax/core/error.hpp"

namespace distjax::train::detail {

std::uint32_t crc32(const void* data, std::uint64_t bytes) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong crc = ::crc32(0L, Z_NULL, 0);
  // zlib takes its length as uInt: feed it in pieces that fit.
  constexpr std::uint64_t kMax = std::numeric_limits<uInt>::max();
  while (bytes > 0) {
    const std::uint64_t n = std::min(bytes, kMax);
    crc = ::crc32(crc, p, static_cast<uInt>(n));
    p += n;
    bytes -= n;
  }
  return static_cast<std::uint32_t>(crc);
}

std::vector<std::uint32_t> chunk_crc32(const void* data, std::uint64_t bytes, std::uint64_t chunk) {
  std::vector<std::uint32_t> out;
  out.reserve(num_chunks(bytes, chunk));
  const auto* p = static_cast<const char*>(data);
  for (std::uint64_t at = 0; at < bytes; at += chunk)
    out.push_back(crc32(p + at, std::min(chunk, bytes - at)));
  return out;
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

CheckedReads::CheckedReads(const SafetensorsReader& file, const SafetensorsEntry& entry,
                           const std::string& name, const std::vector<std::uint32_t>& crc32,
                           std::uint64_t chunk_bytes)
    : file_(file),
      entry_(entry),
      name_(name),
      crc32_(crc32),
      chunk_bytes_(chunk_bytes),
      checked_(crc32.size(), false) {}

void CheckedReads::read(std::uint64_t offset, void* dst, std::uint64_t bytes) {
  if (bytes == 0) return;
  for (std::uint64_t c = offset / chunk_bytes_; c <= (offset + bytes - 1) / chunk_bytes_; ++c)
    check(c);
  file_.read(entry_, offset, dst, bytes);
}

void CheckedReads::check(std::uint64_t chunk) {
  if (checked_[chunk]) return;
  const std::uint64_t begin = chunk * chunk_bytes_;
  const std::uint64_t n = std::min(chunk_bytes_, entry_.end - entry_.begin - begin);
  buffer_.resize(n);
  file_.read(entry_, begin, buffer_.data(), n);
  const std::uint32_t got = crc32(buffer_.data(), n);
  DISTJAX_CHECK(got == crc32_[chunk], IoError, "[load_checkpoint] \"", file_.path(),
                "\": tensor \"", name_, "\": checksum mismatch in bytes [", begin, ", ", begin + n,
                ") of its data (CRC-32 ", hex32(got), ", the index says ", hex32(crc32_[chunk]),
                "): the file is damaged");
  checked_[chunk] = true;
}

}  // namespace distjax::train::detail
