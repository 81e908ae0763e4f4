// The command line's argument parser (cli.hpp), in the registry: the layer ops parse their own
// options with it, in the command line and in the tests.
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cli {

Args::Args(std::vector<std::string> words, std::vector<std::string> flag_names) {
  auto is_flag = [&](const std::string& n) {
    for (const auto& f : flag_names)
      if (f == n) return true;
    return false;
  };
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w.size() > 1 && w[0] == '-' && !(w[1] >= '0' && w[1] <= '9')) {
      std::string name = w;
      std::string value;
      if (auto eq = w.find('='); eq != std::string::npos) {
        name = w.substr(0, eq);
        value = w.substr(eq + 1);
      } else if (is_flag(name)) {
        value = "1";
      } else {
        TL_REQUIRE(i + 1 < words.size(), "option " << name << " needs a value");
        value = words[++i];
      }
      options_[name] = value;
      used_[name] = false;
    } else {
      positional_.push_back(w);
    }
  }
}

std::string Args::get(const std::string& name, const std::string& fallback) {
  auto it = options_.find(name);
  if (it == options_.end()) return fallback;
  used_[name] = true;
  return it->second;
}

int64_t Args::get_int(const std::string& name, int64_t fallback) {
  std::string v = get(name, "");
  if (v.empty()) return fallback;
  try {
    size_t pos = 0;
    int64_t x = std::stoll(v, &pos);
    TL_REQUIRE(pos == v.size(), "");
    return x;
  } catch (...) {
    TL_REQUIRE(false, "option " << name << " expects an integer, got '" << v << "'");
  }
  return fallback;
}

int64_t Args::get_int_in(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) {
  const int64_t v = get_int(name, fallback);
  TL_REQUIRE(v >= lo && v <= hi, "option " << name << " must be in [" << lo << ", " << hi << "], got " << v);
  return v;
}

double Args::get_double(const std::string& name, double fallback) {
  std::string v = get(name, "");
  if (v.empty()) return fallback;
  try {
    size_t pos = 0;
    double x = std::stod(v, &pos);
    TL_REQUIRE(pos == v.size(), "");
    return x;
  } catch (...) {
    TL_REQUIRE(false, "option " << name << " expects a number, got '" << v << "'");
  }
  return fallback;
}

bool Args::flag(const std::string& name) { return get(name, "") == "1"; }

std::vector<int64_t> Args::get_int_list(const std::string& name, std::vector<int64_t> fallback) {
  std::string v = get(name, "");
  if (v.empty()) return fallback;
  std::vector<int64_t> out;
  std::stringstream ss(v);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      size_t pos = 0;
      out.push_back(std::stoll(item, &pos));
      TL_REQUIRE(pos == item.size(), "");
    } catch (...) {
      TL_REQUIRE(false, "option " << name << " expects a comma-separated list of integers, got '"
                                   << v << "'");
    }
  }
  return out;
}

void Args::finish() const {
  for (const auto& [name, used] : used_)
    TL_REQUIRE(used, "unknown option " << name << " (see `tilelink help`)");
  (void)0;
}

}  // namespace tilelink::cli
