// The matrix's vocabulary: which keys vary a run, paths into the file, and a cell's name.
#include <algorithm>
#include <sstream>

#include "scenario/parse.h"

namespace dmpcheck::scenario::detail {

// Keys a matrix may vary: everything that describes one run.
extern const std::vector<std::string> kMatrixRoots = {
    "system",      "world_size",      "backend",  "steps",  "batch_size", "timeout_s",  "threads_per_rank", "topology",
    "init",        "profile",         "data",     "tables", "dense",      "optimizers", "resume",           "faults",
    "fingerprint", "broadcast_probe", "torchrec", "script"};
// The scenario's keys: what it is, its runs' fields, and how they vary and are judged.
extern const std::vector<std::string> kTopLevelKeys = [] {
  std::vector<std::string> keys = {"version", "name", "description", "reproduces"};
  keys.insert(keys.end(), kMatrixRoots.begin(), kMatrixRoots.end());
  keys.insert(keys.end(), {"matrix", "expect"});
  return keys;
}();

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream in(path);
  std::string part;
  while (std::getline(in, part, '.')) parts.push_back(part);
  return parts;
}

namespace {

bool is_index(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

bool assign_path(const YAML::Node& root, const std::vector<std::string>& parts, const YAML::Node& value) {
  YAML::Node node = root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (node.IsSequence()) {
      if (!is_index(parts[i]) || std::stoul(parts[i]) >= node.size()) return false;
      node.reset(node[std::stoul(parts[i])]);
    } else {
      if (node.IsDefined() && !node.IsNull() && !node.IsMap()) return false;
      if (!node[parts[i]].IsDefined() || node[parts[i]].IsNull()) node[parts[i]] = YAML::Node(YAML::NodeType::Map);
      node.reset(node[parts[i]]);
    }
  }
  const std::string& last = parts.back();
  if (node.IsSequence()) {
    if (!is_index(last) || std::stoul(last) >= node.size()) return false;
    node[std::stoul(last)] = value;
  } else {
    if (!node.IsMap()) return false;
    node[last] = value;
  }
  return true;
}

// A profile with switches, as a matrix value, on one line ("{base: torchrec-0.6, plan_on_every_rank: true}"):
// its cell's name.
namespace {

std::string flow_text(const YAML::Node& node) {
  YAML::Emitter out;
  out.SetMapFormat(YAML::Flow);
  out.SetSeqFormat(YAML::Flow);
  out << node;
  return out.c_str();
}

}  // namespace

std::string cell_text(const std::string& path, const YAML::Node& value) {
  return value.IsScalar() ? value.Scalar() : path == "profile" ? flow_text(value) : YAML::Dump(value);
}

std::string slug_of(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool keep =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
    out += keep ? c : '_';
  }
  return out;
}

}  // namespace dmpcheck::scenario::detail
