#include "distjax/train/detail/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "distjax/core/error.hpp"

namespace distjax::train::detail {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this build writes host memory as is");

namespace {

using json = nlohmann::json;

// The safetensors reference implementation refuses headers over 100 MB.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

std::string errno_text() {
  return std::strerror(errno);
}

void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    DISTJAX_CHECK(w > 0, IoError, "[save_checkpoint] cannot write \"", path, "\": ", errno_text());
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void fsync_fd(int fd, const std::string& path) {
  DISTJAX_CHECK(::fsync(fd) == 0, IoError, "[save_checkpoint] fsync of \"", path,
                "\" failed: ", errno_text());
}

}  // namespace

std::optional<std::uint64_t> tensor_bytes(const Shape& shape, std::uint64_t element_bytes) {
  std::uint64_t n = element_bytes;
  for (const std::int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return std::nullopt;
  return n;
}

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::F64:  // not a tensor dtype, but safetensors has a name for it
      return "F64";
  }
  return "?";
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, tensor::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    DISTJAX_CHECK(t.device() == Device::cpu(), InvalidArgument, "[save_checkpoint] tensor \"",
                  name, "\" is on ", t.device().str(), "; the writer takes host tensors");
    const std::uint64_t n = t.nbytes();
    header[name] = {{"dtype", safetensors_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  // Pad with spaces so that the data starts 8-byte aligned (as the reference writer does).
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t len = text.size();

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DISTJAX_CHECK(fd >= 0, IoError, "[save_checkpoint] cannot create \"", path, "\": ", errno_text());
  try {
    write_all(fd, &len, 8, path);
    write_all(fd, text.data(), text.size(), path);
    for (const auto& [name, t] : tensors)
      write_all(fd, t.raw_data(), t.nbytes(), path);
    fsync_fd(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  DISTJAX_CHECK(::close(fd) == 0, IoError, "[save_checkpoint] cannot close \"", path,
                "\": ", errno_text());
}

SafetensorsReader::SafetensorsReader(std::string path, const char* op)
    : path_(std::move(path)), op_(op) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  DISTJAX_CHECK(fd_ >= 0, IoError, "[", op_, "] cannot open \"", path_, "\": ", errno_text());
  try {
    struct stat st {};
    DISTJAX_CHECK(::fstat(fd_, &st) == 0, IoError, "[", op_, "] cannot stat \"", path_, "\"");
    const auto size = static_cast<std::uint64_t>(st.st_size);
    DISTJAX_CHECK(size >= 8, IoError, "[", op_, "] \"", path_,
                  "\": bad header length: the file has ", size,
                  " bytes, fewer than the 8-byte header length (truncated?)");
    std::uint64_t len = 0;
    read(SafetensorsEntry{}, 0, &len, 8);  // data_start_ is 0 here: reads the file's first bytes
    DISTJAX_CHECK(len <= kMaxHeaderBytes && 8 + len <= size, IoError, "[", op_, "] \"", path_,
                  "\": bad header length ", len, ": the file has ", size,
                  " bytes (truncated, or not a safetensors file)");
    std::string text(len, '\0');
    read(SafetensorsEntry{}, 8, text.data(), len);
    data_start_ = 8 + len;
    const std::uint64_t data_bytes = size - data_start_;
    json header;
    try {
      header = json::parse(text);
    } catch (const json::exception& e) {
      DISTJAX_THROW(IoError, "[", op_, "] \"", path_, "\": header is not valid JSON: ", e.what());
    }
    DISTJAX_CHECK(header.is_object(), IoError, "[", op_, "] \"", path_,
                  "\": header is not a JSON object");
    for (const auto& [name, v] : header.items()) {
      if (name == "__metadata__") continue;
      SafetensorsEntry e;
      try {
        e.dtype = v.at("dtype").get<std::string>();
        e.shape = v.at("shape").get<Shape>();
        const auto off = v.at("data_offsets").get<std::vector<std::uint64_t>>();
        DISTJAX_CHECK(off.size() == 2, IoError, "[", op_, "] \"", path_, "\": tensor \"", name,
                      "\": data_offsets must be [begin, end]");
        e.begin = off[0];
        e.end = off[1];
      } catch (const json::exception& ex) {
        DISTJAX_THROW(IoError, "[", op_, "] \"", path_, "\": tensor \"", name,
                      "\": malformed header entry: ", ex.what());
      }
      DISTJAX_CHECK(e.begin <= e.end && e.end <= data_bytes, IoError, "[", op_, "] \"", path_,
                    "\": tensor \"", name, "\": data_offsets [", e.begin, ", ", e.end,
                    "] are beyond the data section of ", data_bytes, " bytes (truncated file?)");
      entries_.emplace(name, std::move(e));
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name, DType dtype,
                                                 const Shape& shape) const {
  auto it = entries_.find(name);
  DISTJAX_CHECK(it != entries_.end(), IoError, "[", op_, "] \"", path_, "\": missing tensor \"",
                name, "\" (the index says this file holds it)");
  const SafetensorsEntry& e = it->second;
  DISTJAX_CHECK(e.dtype == safetensors_dtype(dtype) && e.shape == shape, IoError, "[", op_, "] \"",
                path_, "\": tensor \"", name, "\" is ", e.dtype, " ", to_string(e.shape),
                " but the index says ", safetensors_dtype(dtype), " ", to_string(shape));
  // A shape from the file (and the index): its count of elements may overflow.
  const std::optional<std::uint64_t> want = tensor_bytes(shape, dtype_size(dtype));
  DISTJAX_CHECK(want.has_value(), IoError, "[", op_, "] \"", path_, "\": tensor \"", name,
                "\" has shape ", to_string(shape), ", which no tensor can have");
  DISTJAX_CHECK(e.end - e.begin == *want, IoError, "[", op_, "] \"", path_, "\": tensor \"", name,
                "\": data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin, " bytes; ",
                safetensors_dtype(dtype), " ", to_string(shape), " needs ", *want);
  return e;
}

void SafetensorsReader::read(const SafetensorsEntry& entry, std::uint64_t offset, void* dst,
                             std::uint64_t bytes) const {
  char* p = static_cast<char*>(dst);
  auto at = static_cast<off_t>(data_start_ + entry.begin + offset);
  while (bytes > 0) {
    const ssize_t r = ::pread(fd_, p, bytes, at);
    if (r < 0 && errno == EINTR) continue;
    DISTJAX_CHECK(r > 0, IoError, "[", op_, "] \"", path_, "\": read of ", bytes, " bytes at ", at,
                  " failed: ", r == 0 ? std::string("unexpected end of file") : errno_text());
    p += r;
    at += r;
    bytes -= static_cast<std::uint64_t>(r);
  }
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DISTJAX_CHECK(fd >= 0, IoError, "[save_checkpoint] cannot open directory \"", dir,
                "\": ", errno_text());
  const int rc = ::fsync(fd);
  ::close(fd);
  DISTJAX_CHECK(rc == 0, IoError, "[save_checkpoint] fsync of directory \"", dir,
                "\" failed: ", errno_text());
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DISTJAX_CHECK(fd >= 0, IoError, "[save_checkpoint] cannot create \"", tmp, "\": ", errno_text());
  try {
    write_all(fd, text.data(), text.size(), tmp);
    fsync_fd(fd, tmp);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  DISTJAX_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, IoError,
                "[save_checkpoint] cannot rename \"", tmp, "\" to \"", path, "\": ", errno_text());
  const std::string dir = std::filesystem::path(path).parent_path().string();
  fsync_dir(dir.empty() ? "." : dir);
}

std::string read_text_file(const std::string& path, const char* op) {
  std::ifstream f(path, std::ios::binary);
  DISTJAX_CHECK(f.good(), IoError, "[", op, "] cannot open \"", path, "\": ", errno_text());
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

}  // namespace distjax::train::detail
