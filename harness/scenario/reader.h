// The scenario loader's reader: every field is read through it, knowing the file and the field's
// path, so every error says where and what was expected.  Internal to scenario/.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "common/error.h"
#include "common/names.h"

namespace dmpcheck::scenario::detail {

inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

inline std::string scalar_text(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  return "a mapping";
}

class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const YAML::Node& node, const std::string& path, const std::string& message) const {
    int line = 0;
    if (node.IsDefined() && node.Mark().line >= 0) line = node.Mark().line + 1;
    throw_error(ErrorKind::kInvalidScenario,
                fmt::format("{}: field '{}': {}", line > 0 ? fmt::format("{}:{}", file_, line) : file_, path, message));
  }
  // Runs one part of the file.  An invalid-scenario error there is recorded and reading goes on,
  // so that one pass reports every error in the file (throw_recorded), not only the first.
  template <typename F>
  void section(F&& part) const {
    try {
      part();
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kInvalidScenario) throw;
      if (std::find(errors_.begin(), errors_.end(), e.what()) == errors_.end()) errors_.push_back(e.what());
    }
  }
  // The recorded errors as one Error(kInvalidScenario): the first alone, or all of them.
  void throw_recorded() const {
    if (errors_.empty()) return;
    if (errors_.size() == 1) throw_error(ErrorKind::kInvalidScenario, errors_.front());
    std::string text = fmt::format("{}: {} errors:", file_, errors_.size());
    for (const auto& e : errors_) text += "\n  " + e;
    throw_error(ErrorKind::kInvalidScenario, text);
  }

  [[noreturn]] void expected(const YAML::Node& node, const std::string& path, const std::string& what) const {
    fail(node, path, fmt::format("expected {}, got {}", what, scalar_text(node)));
  }

  void require_map(const YAML::Node& node, const std::string& path) const {
    if (!node.IsMap()) expected(node, path, "a mapping");
  }

  // Every key of `node` must be in `allowed`; suggests the closest allowed key.
  void check_keys(const YAML::Node& node, const std::string& path, const std::vector<std::string>& allowed) const {
    require_map(node, path);
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
      const auto best = std::min_element(allowed.begin(), allowed.end(), [&](const auto& a, const auto& b) {
        return edit_distance(key, a) < edit_distance(key, b);
      });
      const bool close = best != allowed.end() && edit_distance(key, *best) < 3;  // within two edits
      fail(kv.first, join(path, key),
           fmt::format("unknown key{}; allowed here: {}", close ? " (did you mean '" + *best + "'?)" : "",
                       fmt::join(allowed, ", ")));
    }
  }

  YAML::Node required(const YAML::Node& map, const std::string& path, const std::string& key) const {
    YAML::Node value = map[key];
    if (!value.IsDefined() || value.IsNull()) { fail(map, join(path, key), "is required"); }
    return value;
  }

  // A scalar that `parse` (std::stoll, std::stod) reads whole and `ok` accepts; otherwise "expected <what>".
  template <typename T, typename Parse, typename Ok>
  T parsed(const YAML::Node& node, const std::string& path, const std::string& what, Parse parse, Ok ok) const {
    size_t used = 0;
    T value{};
    try {
      if (node.IsScalar()) value = parse(node.Scalar(), &used);
    } catch (const std::exception&) { used = 0; }
    if (!node.IsScalar() || node.Scalar().empty() || used != node.Scalar().size() || !ok(value)) {
      expected(node, path, what);
    }
    return value;
  }
  int64_t integer(const YAML::Node& node, const std::string& path, int64_t min, int64_t max) const {
    return parsed<int64_t>(
        node, path, fmt::format("an integer in [{}, {}]", min, max),
        [](const std::string& t, size_t* used) { return std::stoll(t, used); },
        [&](int64_t v) { return v >= min && v <= max; });
  }
  // Finite numbers only: inf or nan in a tolerance or a time would compare as nothing does.
  double number(const YAML::Node& node, const std::string& path, double min_exclusive,
                double max_inclusive = 1e15) const {
    return parsed<double>(
        node, path, fmt::format("a finite number > {} and <= {}", min_exclusive, max_inclusive),
        [](const std::string& t, size_t* used) { return std::stod(t, used); },
        [&](double v) { return std::isfinite(v) && v > min_exclusive && v <= max_inclusive; });
  }
  double non_negative(const YAML::Node& node, const std::string& path) const {
    return parsed<double>(
        node, path, "a finite number >= 0", [](const std::string& t, size_t* used) { return std::stod(t, used); },
        [](double v) { return std::isfinite(v) && v >= 0; });
  }

  std::string string(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar() || node.Scalar().empty()) expected(node, path, "a non-empty string");
    return node.Scalar();
  }

  std::string choice(const YAML::Node& node, const std::string& path, const std::vector<std::string>& options) const {
    std::string value = node.IsScalar() ? node.Scalar() : std::string();
    if (!node.IsScalar() || std::find(options.begin(), options.end(), value) == options.end()) {
      expected(node, path, fmt::format("one of {}", fmt::join(options, ", ")));
    }
    return value;
  }

  // One of an enum's names (common/names.h), as its value.
  template <typename E, size_t N>
  E choice_of(const YAML::Node& node, const std::string& path, const Named<E> (&table)[N]) const {
    return *value_in(table, choice(node, path, names_in(table)));
  }

  // A path, relative to the scenario file's folder unless absolute.
  std::string path(const YAML::Node& node, const std::string& field) const {
    const std::string text = string(node, field);
    const std::filesystem::path base = std::filesystem::path(file_).parent_path();
    return std::filesystem::path(text).is_absolute() || base.empty() ? text : (base / text).string();
  }

  std::vector<std::string> string_list(const YAML::Node& node, const std::string& path) const {
    if (!node.IsSequence()) expected(node, path, "a list of strings");
    std::vector<std::string> out;
    for (size_t i = 0; i < node.size(); ++i) out.push_back(string(node[i], fmt::format("{}[{}]", path, i)));
    return out;
  }

  // A list of integers in [min, max], at least `least` of them (`what` says what the list is),
  // appended to `out` as they are read: what was read before an error stays, as the checks after
  // this section see it.
  template <typename T>
  void integer_list(const YAML::Node& node, const std::string& path, const std::string& what, int64_t min, int64_t max,
                    std::vector<T>& out, size_t least = 0) const {
    if (!node.IsSequence() || node.size() < least) expected(node, path, what);
    for (size_t i = 0; i < node.size(); ++i)
      out.push_back(static_cast<T>(integer(node[i], fmt::format("{}[{}]", path, i), min, max)));
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

 private:
  std::string file_;
  mutable std::vector<std::string> errors_;
};

}  // namespace dmpcheck::scenario::detail
