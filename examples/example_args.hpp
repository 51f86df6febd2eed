// A tiny command-line flag parser shared by the examples: --name value or --name=value,
// with typed defaults and an automatic --help.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

namespace distjax::examples {

/// Flags are declared with their default and help text, or bound to a variable whose
/// current value is the default (a config field), then parsed:
///
///   Args args("train_mnist", "Trains the MLP classifier on Fashion-MNIST.");
///   long long& epochs = args.flag("epochs", 8LL, "passes over the training set");
///   args.bind("steps", &config.run.steps, "optimizer steps");
///   args.parse(argc, argv);   // exits 0 on --help, 2 on a bad flag
class Args {
 public:
  Args(std::string program, std::string about)
      : program_(std::move(program)), about_(std::move(about)) {}

  std::string& flag(const std::string& name, const std::string& def, const std::string& help) {
    return add(name, strings_, def, help);
  }
  long long& flag(const std::string& name, long long def, const std::string& help) {
    return add(name, ints_, def, help);
  }
  double& flag(const std::string& name, double def, const std::string& help) {
    return add(name, doubles_, def, help);
  }

  /// Binds --name to *target (std::string, std::int64_t, int, double or bool as 0/1);
  /// its current value is the default shown by --help.
  template <class T>
  void bind(const std::string& name, T* target, const std::string& help) {
    std::ostringstream os;
    os << *target;
    flags_[name] = Flag{target, help, os.str()};
    order_.push_back(name);
  }

  void parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        usage(stdout);
        std::exit(0);
      }
      if (a.rfind("--", 0) != 0) fail("unexpected argument '" + a + "'");
      std::string name = a.substr(2), value;
      if (const auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name.resize(eq);
      } else {
        if (i + 1 >= argc) fail("flag --" + name + " needs a value");
        value = argv[++i];
      }
      auto it = flags_.find(name);
      if (it == flags_.end()) fail("unknown flag --" + name);
      std::visit(
          [&](auto* p) {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, std::string>) {
              *p = value;
            } else {
              char* end = nullptr;
              if constexpr (std::is_same_v<T, double>)
                *p = std::strtod(value.c_str(), &end);
              else
                *p = static_cast<T>(std::strtoll(value.c_str(), &end, 10));
              if (value.empty() || *end != '\0')
                fail("flag --" + name + ": '" + value + "' is not a number");
            }
          },
          it->second.value);
    }
  }

 private:
  struct Flag {
    std::variant<std::string*, long long*, long*, int*, bool*, double*> value;
    std::string help;
    std::string def;
  };
  template <class T>
  T& add(const std::string& name, std::deque<T>& store, const T& def, const std::string& help) {
    store.push_back(def);  // deque: stable addresses
    std::ostringstream os;
    os << def;
    flags_[name] = Flag{&store.back(), help, os.str()};
    order_.push_back(name);
    return store.back();
  }
  void usage(FILE* out) const {
    std::fprintf(out, "%s: %s\n\nFlags:\n", program_.c_str(), about_.c_str());
    for (const auto& n : order_) {
      const Flag& f = flags_.at(n);
      std::fprintf(out, "  --%-16s %s (default: %s)\n", n.c_str(), f.help.c_str(), f.def.c_str());
    }
  }
  [[noreturn]] void fail(const std::string& msg) const {
    std::fprintf(stderr, "%s: %s\n\n", program_.c_str(), msg.c_str());
    usage(stderr);
    std::exit(2);
  }

  std::string program_, about_;
  std::deque<std::string> strings_;
  std::deque<long long> ints_;
  std::deque<double> doubles_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
};

}  // namespace distjax::examples
