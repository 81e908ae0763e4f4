// tilelink: run, check, benchmark and inspect tile-centric overlapped ops.
#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "layer_ops.hpp"
#include "op_registry.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cli {

namespace {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}

std::vector<std::string> split_words(const std::string& s) {
  std::istringstream is(s);
  std::vector<std::string> out;
  for (std::string w; is >> w;) out.push_back(w);
  return out;
}

void print_usage(FILE* f) {
  std::fprintf(f, "usage: tilelink <command> [options]\n\ncommands:\n");
  for (const Command& c : registry())
    std::fprintf(f, "  %-18s %s\n      %s\n", c.path.c_str(), c.summary.c_str(), c.usage.c_str());
}
}  // namespace

bool register_command(Command c) {
  registry().push_back(std::move(c));
  return true;
}
const std::vector<Command>& commands() { return registry(); }

}  // namespace tilelink::cli

int main(int argc, char** argv) {
  using namespace tilelink::cli;
#if defined(TILELINK_HAS_CUDA)
  attach_cuda_ops();
  attach_moe_layers_cuda();
  attach_attention_layers_cuda();
#endif
  register_op_commands();
  std::vector<std::string> words(argv + 1, argv + argc);
  if (words.empty() || words[0] == "help" || words[0] == "--help" || words[0] == "-h") {
    print_usage(words.empty() ? stderr : stdout);
    return words.empty() ? 2 : 0;
  }
  // Longest command path that prefixes the words.
  const Command* best = nullptr;
  size_t best_len = 0;
  for (const Command& c : registry()) {
    auto path = split_words(c.path);
    if (path.size() <= words.size() && path.size() > best_len &&
        std::equal(path.begin(), path.end(), words.begin())) {
      best = &c;
      best_len = path.size();
    }
  }
  if (!best) {
    std::fprintf(stderr, "tilelink: unknown command '%s'\n\n", words[0].c_str());
    print_usage(stderr);
    return 2;
  }
  try {
    Args args(std::vector<std::string>(words.begin() + best_len, words.end()), best->flags);
    return best->fn(args);
  } catch (const tilelink::Error& e) {
    std::fprintf(stderr, "tilelink %s: error: %s\n", best->path.c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tilelink %s: error: %s\n", best->path.c_str(), e.what());
    return 1;
  }
}
