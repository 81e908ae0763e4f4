#include "op_registry.hpp"

namespace tilelink::cli {

namespace {
std::vector<OpSpec>& specs() {
  static std::vector<OpSpec> s;
  return s;
}
}  // namespace

bool register_op(OpSpec spec) {
  specs().push_back(std::move(spec));
  return true;
}

const std::vector<OpSpec>& op_specs() { return specs(); }

const OpSpec* find_op(const std::string& name) {
  for (const OpSpec& s : specs())
    if (s.name == name) return &s;
  return nullptr;
}

OpSpec* find_op_mutable(const std::string& name) {
  for (OpSpec& s : specs())
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace tilelink::cli
