// The `tilelink` command line: a registry of commands ("run ag_gemm", "bench gemm", "info", ...) and
// a small argument parser. Each command lives in its own file and registers itself with
// TILELINK_REGISTER_COMMAND; main.cpp dispatches on the longest matching command path.
#pragma once

#include <chrono>
#include <functional>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tilelink::cli {

// Wall-clock time in Unix seconds (the benches' traces, to line up with e.g. nvidia-smi's samples).
inline double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Options are `--name value`, `-x value` or bare flags (`--name`). Everything is read through get*();
// finish() then refuses any option that no getter asked for, so typos fail loudly.
class Args {
 public:
  Args(std::vector<std::string> words, std::vector<std::string> flag_names);

  std::string get(const std::string& name, const std::string& fallback);
  int64_t get_int(const std::string& name, int64_t fallback);
  // An integer in [lo, hi], checked as the 64-bit value it is written as (never narrowed first).
  int64_t get_int_in(const std::string& name, int64_t fallback, int64_t lo, int64_t hi);
  bool has(const std::string& name) const { return options_.count(name) > 0; }
  double get_double(const std::string& name, double fallback);
  bool flag(const std::string& name);
  // A comma-separated integer list, e.g. "--world 1,2,4".
  std::vector<int64_t> get_int_list(const std::string& name, std::vector<int64_t> fallback);
  const std::vector<std::string>& positional() const { return positional_; }
  void finish() const;  // throws tilelink::Error naming unknown options

 private:
  std::map<std::string, std::string> options_;
  std::map<std::string, bool> used_;
  std::vector<std::string> positional_;
};

using CommandFn = std::function<int(Args& args)>;

struct Command {
  std::string path;     // e.g. "bench gemm"
  std::string usage;    // one line of options
  std::string summary;  // what it does
  CommandFn fn;
  std::vector<std::string> flags;  // option names that take no value
};

bool register_command(Command c);
inline Command make_command(Command c) { return c; }
inline Command make_command(std::string path, std::string usage, std::string summary, CommandFn fn,
                            std::vector<std::string> flags = {}) {
  return Command{std::move(path), std::move(usage), std::move(summary), fn, std::move(flags)};
}
const std::vector<Command>& commands();

}  // namespace tilelink::cli

#define TL_CLI_CAT2(a, b) a##b
#define TL_CLI_CAT(a, b) TL_CLI_CAT2(a, b)
// TILELINK_REGISTER_COMMAND(path, usage, summary, fn[, {flag names}])
#define TILELINK_REGISTER_COMMAND(...)                           \
  static const bool TL_CLI_CAT(tl_registered_command_, __LINE__) = \
      ::tilelink::cli::register_command(::tilelink::cli::make_command(__VA_ARGS__))
