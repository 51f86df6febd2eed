#include "distjax/data/idx.hpp"

#include <zlib.h>

#include <memory>

#include "distjax/core/error.hpp"

namespace distjax::data {

namespace {

struct GzCloser {
  void operator()(gzFile f) const {
    if (f) gzclose(f);
  }
};
using GzPtr = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

void read_exact(gzFile f, void* buf, std::size_t n, const std::string& path, const char* what) {
  auto* p = static_cast<std::uint8_t*>(buf);
  std::size_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
    const int got = gzread(f, p + done, chunk);
    if (got <= 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      DISTJAX_THROW(IoError, "[read_idx] \"", path, "\" is truncated: expected ", n, " bytes of ",
                    what, ", got ", done,
                    errnum != Z_OK ? std::string(" (zlib: ") + msg + ")" : "");
    }
    done += static_cast<std::size_t>(got);
  }
}

std::uint32_t big_endian(const std::uint8_t* b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
         std::uint32_t{b[3]};
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  GzPtr f(gzopen(path.c_str(), "rb"));  // gzopen reads uncompressed files as they are
  DISTJAX_CHECK(f != nullptr, IoError, "[read_idx] cannot open \"", path, "\"");
  std::uint8_t magic[4];
  read_exact(f.get(), magic, 4, path, "header");
  DISTJAX_CHECK(magic[0] == 0 && magic[1] == 0, IoError, "[read_idx] \"", path,
                "\" is not an IDX file (magic bytes ", int(magic[0]), " ", int(magic[1]), ")");
  DISTJAX_CHECK(magic[2] == 0x08, IoError, "[read_idx] \"", path, "\" holds type code 0x", std::hex,
                int(magic[2]), std::dec, "; only unsigned bytes (0x08) are supported");
  const int rank = magic[3];
  DISTJAX_CHECK(rank >= 1 && rank <= 8, IoError, "[read_idx] \"", path, "\" has rank ", rank);
  IdxArray out;
  std::int64_t total = 1;
  for (int d = 0; d < rank; ++d) {
    std::uint8_t b[4];
    read_exact(f.get(), b, 4, path, "header");
    out.dims.push_back(big_endian(b));
    total *= out.dims.back();
  }
  out.data.resize(static_cast<std::size_t>(total));
  read_exact(f.get(), out.data.data(), out.data.size(), path, "data");
  return out;
}

void write_idx(const std::string& path, const IdxArray& array, bool gzip) {
  std::int64_t total = 1;
  for (auto d : array.dims)
    total *= d;
  DISTJAX_CHECK(!array.dims.empty() && array.dims.size() <= 8 &&
                    total == static_cast<std::int64_t>(array.data.size()),
                InvalidArgument, "[write_idx] ", array.data.size(), " bytes for ",
                array.dims.size(), " dimensions of product ", total);
  GzPtr f(gzopen(path.c_str(), gzip ? "wb6" : "wbT"));  // "T": plain, no compression
  DISTJAX_CHECK(f != nullptr, IoError, "[write_idx] cannot create \"", path, "\"");
  std::vector<std::uint8_t> header = {0, 0, 0x08, static_cast<std::uint8_t>(array.dims.size())};
  for (auto d : array.dims) {
    const auto u = static_cast<std::uint32_t>(d);
    header.insert(header.end(),
                  {static_cast<std::uint8_t>(u >> 24), static_cast<std::uint8_t>(u >> 16),
                   static_cast<std::uint8_t>(u >> 8), static_cast<std::uint8_t>(u)});
  }
  auto put = [&](const std::uint8_t* p, std::size_t n) {
    DISTJAX_CHECK(n == 0 || gzwrite(f.get(), p, static_cast<unsigned>(n)) == static_cast<int>(n),
                  IoError, "[write_idx] write to \"", path, "\" failed");
  };
  put(header.data(), header.size());
  put(array.data.data(), array.data.size());
  DISTJAX_CHECK(gzclose(f.release()) == Z_OK, IoError, "[write_idx] closing \"", path, "\" failed");
}

}  // namespace distjax::data
