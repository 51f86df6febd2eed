// CLI11's parse with DistJax's handling of a refused command line, shared by the distjax
// command and the example binaries: CLI11's message, then "did you mean" lines
// (app::command_line_hint), and exit status 2; --help prints the help and exits 0.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "distjax/app/train.hpp"

namespace distjax::tools {

/// The names of `app`'s subcommands (at every depth) and of their long flags ("--out").
inline void collect_names(CLI::App& app, std::vector<std::string>& subcommands,
                          std::vector<std::string>& flags) {
  for (const CLI::Option* o : app.get_options())
    for (const std::string& n : o->get_lnames()) flags.push_back("--" + n);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    subcommands.push_back(sub->get_name());
    collect_names(*sub, subcommands, flags);
  }
}

/// Parses argv into `cli`. Returns the status to exit with now (0 after --help, 2 for a
/// command line it refused), or nothing when the program should go on.
inline std::optional<int> parse_command_line(CLI::App& cli, int argc, char** argv) {
  try {
    cli.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    if (cli.exit(e) == 0) return 0;  // printed the help (or the version)
    std::vector<std::string> subcommands, flags;
    collect_names(cli, subcommands, flags);
    const std::string hint = app::command_line_hint(
        std::vector<std::string>(argv + 1, argv + argc), subcommands, flags);
    std::fputs(hint.c_str(), stderr);
    return 2;
  }
}

}  // namespace distjax::tools
