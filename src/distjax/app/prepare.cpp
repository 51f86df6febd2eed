// What train does before it runs: the configs built into the library, the checks of a
// config against its model, the output directory and its lock.
#include "distjax/app/train.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "distjax/comm/launch_environment.hpp"
#include "distjax/config/config_file.hpp"
#include "distjax/app/detail/builtin_configs.hpp"
#include "distjax/app/run.hpp"
#include "distjax/core/error.hpp"
#include "distjax/train/checkpointer.hpp"

namespace distjax::app {

std::vector<std::string> builtin_configs() {
  std::vector<std::string> names;
  for (const detail::BuiltinConfig& b : detail::builtin_config_files())
    names.emplace_back(b.name);
  return names;
}

config::TrainConfig builtin_config(const std::string& name) {
  for (const detail::BuiltinConfig& b : detail::builtin_config_files())
    if (name == b.name) {
      config::TrainConfig c;
      config::apply_toml(c, b.toml, "configs/" + name + ".toml");
      return c;
    }
  std::string msg = "no config \"" + name + "\" is built into the library";
  const std::vector<std::string> names = builtin_configs();
  if (const std::string near = config::nearest_name(name, names); !near.empty())
    msg += "; did you mean \"" + near + "\"?";
  msg += " (configs:";
  for (const std::string& n : names)
    msg += " " + n;
  throw ConfigError(msg + ")");
}

config::TrainConfig prepare_program(config::TrainConfig c, const std::string& source) {
  if (comm::discover_launch_environment().rank == 0)
    for (const std::string& n : c.notices)
      std::fprintf(stderr, "[config] note: %s\n", n.c_str());
  const ModelSpec model = find_model(c.run.program);
  c.distributed = config::resolve(c.distributed, comm::discover_launch_environment());
  c.validate(source);
  DISTJAX_CHECK(c.run.steps > 0 || (model.epochs && c.run.epochs > 0), ConfigError, "[",
                c.run.program, "] needs run.steps > 0",
                model.epochs ? " or run.epochs > 0" : " (it reads no run.epochs)");
  check_program(c);
  make_out_dir(c);
  // The process that writes the run's files holds its directory (every process of a
  // threads run; the first under a launcher).
  if (comm::discover_launch_environment().rank == 0) hold_out_dir(c);
  train::check_restore(checkpoint_config(c));
  return c;
}

void check_program(const config::TrainConfig& c) {
  const ModelSpec model = find_model(c.run.program);
  std::string refused;
  for (const std::string& p : model.capabilities.problems(c))
    refused += (refused.empty() ? "[" : "\n[") + c.run.program + "] " + p;
  DISTJAX_CHECK(refused.empty(), NotImplemented, refused);
  if (model.check) model.check(c, model_mesh(c, model));
}

void make_out_dir(const config::TrainConfig& c) {
  const std::string& dir = c.run.out_dir;
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DISTJAX_CHECK(!ec, ConfigError, "[config] run.out_dir = \"", dir,
                "\": cannot create the directory: ", ec.message());
  // Writable: a probe file made and removed (permission bits alone miss read-only mounts).
  std::string probe = (std::filesystem::path(dir) / ".distjax_probe_XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  DISTJAX_CHECK(fd >= 0, ConfigError, "[config] run.out_dir = \"", dir,
                "\": cannot write in the directory: ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

void hold_out_dir(const config::TrainConfig& c) {
  if (c.run.out_dir.empty()) return;
  // One lock per directory and process, kept until the process ends (the kernel releases
  // it then, however the process ends): a later run in the same process reuses it.
  static std::mutex mu;
  static std::map<std::string, int> held;  // canonical directory -> the lock file's fd
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::canonical(c.run.out_dir, ec);
  DISTJAX_CHECK(!ec, ConfigError, "[config] run.out_dir = \"", c.run.out_dir,
                "\": cannot resolve the directory: ", ec.message());
  std::lock_guard lock(mu);
  if (held.count(dir.string()) != 0) return;
  const std::filesystem::path file = dir / ".distjax.lock";
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  DISTJAX_CHECK(fd >= 0, ConfigError, "[config] run.out_dir = \"", c.run.out_dir,
                "\": cannot open ", file.string(), ": ", std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string owner;
    std::getline(std::ifstream(file), owner);
    ::close(fd);
    DISTJAX_CHECK(err != EWOULDBLOCK, ConfigError, "[config] run.out_dir = \"", c.run.out_dir,
                  "\" is in use by another run",
                  owner.empty() ? std::string() : " (" + owner + ")",
                  ": wait for it to finish, or choose another --out");
    throw ConfigError("[config] run.out_dir = \"" + c.run.out_dir + "\": cannot lock " +
                      file.string() + ": " + std::strerror(err));
  }
  // Who holds it, for the message a second run gets.
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  char when[32] = {};
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  std::ostringstream who;
  who << "pid " << ::getpid() << " on " << host << " since " << when << "\n";
  const std::string text = who.str();
  if (::ftruncate(fd, 0) == 0) {
    const ssize_t written = ::pwrite(fd, text.data(), text.size(), 0);
    (void)written;  // the note is for the message only: the lock is what counts
  }
  held.emplace(dir.string(), fd);
}

int run_main(const char* program, const std::function<int()>& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

std::string command_line_hint(const std::vector<std::string>& args,
                              const std::vector<std::string>& subcommands,
                              const std::vector<std::string>& flags) {
  std::string hint;
  const auto known = [](const std::vector<std::string>& names, const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  if (!subcommands.empty() && !args.empty() && args[0].rfind('-', 0) != 0 &&
      !known(subcommands, args[0]))
    if (const std::string near = config::nearest_name(args[0], subcommands); !near.empty())
      hint += "did you mean \"" + near + "\"?\n";
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) == 0 && a.size() > 2) {
      const std::string name = a.substr(0, a.find('='));
      if (!known(flags, name))
        if (const std::string near = config::nearest_name(name, flags); !near.empty())
          hint += "did you mean " + near + " (not " + name + ")?\n";
    }
    if (a == "--set" && i + 2 < args.size() && args[i + 1].find('=') == std::string::npos &&
        args[i + 2].rfind('-', 0) != 0)
      hint += "did you mean --set " + args[i + 1] + "=" + args[i + 2] + "?\n";
  }
  return hint;
}

}  // namespace distjax::app
