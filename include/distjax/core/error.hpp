// Error types of DistJax and the one check macro that raises them with file and line.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace distjax {

/// Base class of every error DistJax raises on API misuse or backend failure.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller passed a value the operation cannot accept (shape, dtype, option).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};
/// A PartitionSpec / sharding is invalid for the array or mesh it is used with.
class ShardingError : public Error {
 public:
  using Error::Error;
};
/// A collective failed, timed out, or devices disagreed on it.
class CommError : public Error {
 public:
  using Error::Error;
};
/// A configuration value is missing, malformed or inconsistent.
class ConfigError : public Error {
 public:
  using Error::Error;
};
/// The operation exists but not for this device, dtype or build.
class NotImplemented : public Error {
 public:
  using Error::Error;
};
/// Reading or writing a file failed.
class IoError : public Error {
 public:
  using Error::Error;
};

namespace detail {
/// Whether error messages end with the source location that raised them, " (file:line)":
/// with DISTJAX_DEBUG=1 in the environment (read once); off by default, where a user's
/// message ends with what went wrong and what to do.
bool error_locations();

template <class E, class... Args>
[[noreturn]] void raise(const char* file, int line, const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  if (error_locations()) os << " (" << file << ":" << line << ")";
  throw E(os.str());
}
}  // namespace detail

}  // namespace distjax

/// DISTJAX_CHECK(cond, ErrorType, message parts...): throws ErrorType with the streamed
/// message (plus file:line under DISTJAX_DEBUG=1) when cond is false. Messages start with
/// "[op] ".
#define DISTJAX_CHECK(cond, E, ...)                                            \
  do {                                                                         \
    if (!(cond)) ::distjax::detail::raise<E>(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

/// DISTJAX_THROW(ErrorType, message parts...): throws unconditionally.
#define DISTJAX_THROW(E, ...) ::distjax::detail::raise<E>(__FILE__, __LINE__, __VA_ARGS__)
