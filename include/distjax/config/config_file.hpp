// config_file: TrainConfig from TOML files (toml++) and `--set key=value` overrides, both
// typed and checked by one schema; errors name the key, file, line and column.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "distjax/config/train_config.hpp"

namespace distjax::config {

/// The TOML type a key takes.
enum class ValueType : std::uint8_t { Bool, Int, Float, String, IntList, StringList, BoolOrString };
/// "a boolean", "an integer", "a number", "a string", "an array of integers", ...
const char* value_type_name(ValueType t);

/// One key of the schema, e.g. {"run.steps", Int, "optimizer steps; 0 = ...", {}}.
struct ConfigKey {
  std::string name;  ///< dotted: "<table>.<key>" or "parallelism.fsdp.modules"
  ValueType type;
  std::string help;
  std::vector<std::string> choices;  ///< allowed strings (or list items); empty = any
};

/// Every key a config file may set, in documentation order.
const std::vector<ConfigKey>& config_keys();

/// The valid key nearest to `key` (edit distance on the dotted name and on its last
/// part), or "" when none is close: "run.stpes" -> "run.steps", "model.lr" -> "optimizer.lr".
std::string nearest_key(std::string_view key);

/// The candidate nearest to `name` by edit distance, or "" when none is close (used for
/// keys, and by callers for their own names such as programs).
std::string nearest_name(std::string_view name, const std::vector<std::string>& candidates);

/// Applies a TOML document to `config`. `source` names it in errors. Every problem is
/// collected and thrown as one ConfigError, one line each, e.g.
///   [config] run.toml:3:1: unknown key "run.stpes"; did you mean "run.steps"?
///   [config] run.toml:4:9: run.steps must be an integer, got a string
///   [config] run.toml:7:12: TOML syntax error: ...
void apply_toml(TrainConfig& config, std::string_view toml, const std::string& source);

/// Applies one override "table.key=value" (the value typed by the schema: TOML syntax,
/// or a bare string, or a comma-separated list); errors name the override:
///   [config] --set run.steps=abc: run.steps must be an integer, got "abc"
void apply_override(TrainConfig& config, std::string_view assignment);

/// Defaults, then the file at `path` (IoError when unreadable), then `overrides` in order.
/// The result is not resolved against the environment nor validated.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                        const TrainConfig& defaults = {});

/// The config as a TOML document with every key of the schema (what a file giving every
/// key would say); apply_toml of it reproduces the config.
std::string to_toml(const TrainConfig& config);

}  // namespace distjax::config
