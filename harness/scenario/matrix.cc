// The matrix's vocabulary: which keys vary a run, paths into the file, and a cell's name.
#include <algorithm>
#include <set>
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

// A list index as a path part: digits, and few enough that stoul cannot overflow (no list holds a
// billion entries).
bool is_index(const std::string& s) {
  return !s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
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

bool axis_of_scalars(const std::vector<YAML::Node>& values) {
  return std::all_of(values.begin(), values.end(), [](const YAML::Node& v) { return v.IsScalar(); });
}

bool Matrix::varies(const std::string& path) const {
  return std::any_of(axes.begin(), axes.end(), [&](const MatrixAxis& a) {
    return std::find(a.paths.begin(), a.paths.end(), path) != a.paths.end();
  });
}

std::vector<YAML::Node> Matrix::values_of(const std::string& path) const {
  std::vector<YAML::Node> out;
  for (const auto& a : axes) {
    const auto at = std::find(a.paths.begin(), a.paths.end(), path);
    if (at == a.paths.end()) continue;
    for (const auto& value : a.values) out.push_back(value[static_cast<size_t>(at - a.paths.begin())]);
  }
  return out;
}

namespace {

// A path a matrix may vary: under one of kMatrixRoots.
void check_axis_path(const Reader& r, const YAML::Node& key, const std::string& field, const std::string& path) {
  const auto parts = split_path(path);
  if (parts.empty() || std::find(kMatrixRoots.begin(), kMatrixRoots.end(), parts[0]) == kMatrixRoots.end()) {
    r.fail(key, field,
           fmt::format("a matrix varies a run field; expected a path under one of {}", fmt::join(kMatrixRoots, ", ")));
  }
}

// `zip: [{a: 1, b: x}, {a: 2, b: y}]`: one axis whose values set several paths at once, each
// entry naming the same paths (a matrix crossing a and b would make four cells of these two).
MatrixAxis read_zip(const Reader& r, const YAML::Node& rows) {
  if (!rows.IsSequence() || rows.size() == 0) {
    r.expected(rows, "matrix.zip", "a non-empty list of mappings, each setting the same paths (one cell each)");
  }
  MatrixAxis axis;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string field = fmt::format("matrix.zip[{}]", i);
    const YAML::Node row = rows[i];
    if (!row.IsMap() || row.size() == 0) r.expected(row, field, "a mapping of paths to values");
    std::vector<YAML::Node> values(axis.paths.size());
    size_t named = 0;
    for (const auto& kv : row) {
      const std::string path = kv.first.as<std::string>();
      if (i == 0) {  // the first entry names the paths (each once: check_unique_keys)
        check_axis_path(r, kv.first, field + "." + path, path);
        axis.paths.push_back(path);
        axis.keys.push_back(kv.first);
        values.emplace_back();
      }
      const auto at = std::find(axis.paths.begin(), axis.paths.end(), path);
      if (at == axis.paths.end()) {
        r.fail(kv.first, field + "." + path,
               fmt::format("is not set by matrix.zip[0] ({}); every entry sets the same paths",
                           fmt::join(axis.paths, ", ")));
      }
      values[static_cast<size_t>(at - axis.paths.begin())] = kv.second;
      ++named;
    }
    if (named != axis.paths.size()) {
      r.fail(row, field,
             fmt::format("sets {} of the {} paths matrix.zip[0] sets ({}); every entry sets them all", named,
                         axis.paths.size(), fmt::join(axis.paths, ", ")));
    }
    axis.values.push_back(values);
  }
  return axis;
}

}  // namespace

Matrix read_matrix(const Reader& r, YAML::Node root) {
  Matrix m;
  if (YAML::Node matrix = root["matrix"]) {
    r.require_map(matrix, "matrix");
    for (const auto& kv : matrix) {
      const std::string path = kv.first.as<std::string>();
      if (path == "zip") {
        m.axes.push_back(read_zip(r, kv.second));
        continue;
      }
      const std::string field = "matrix." + path;
      check_axis_path(r, kv.first, field, path);
      if (!kv.second.IsSequence() || kv.second.size() == 0) r.expected(kv.second, field, "a non-empty list of values");
      MatrixAxis axis{{path}, {kv.first}, {}};
      for (const auto& v : kv.second) axis.values.push_back({v});
      m.axes.push_back(axis);
    }
    // A path set by two axes (its own and a zip's) would have two values in one cell.
    std::set<std::string> seen;
    for (const auto& a : m.axes) {
      for (size_t p = 0; p < a.paths.size(); ++p) {
        if (!seen.insert(a.paths[p]).second)
          r.fail(a.keys[p], "matrix." + a.paths[p], "is varied twice (on its own axis and in zip, or twice in zip)");
      }
    }
  }
  // Cells are counted before one is made: a few lines of YAML must not ask for 2^30 runs.
  constexpr uint64_t kMostCells = 1024;
  uint64_t cell_count = 1;
  std::vector<size_t> axis_sizes;
  for (const auto& axis : m.axes) {
    axis_sizes.push_back(axis.values.size());
    cell_count = std::min<uint64_t>(cell_count * axis.values.size(), kMostCells + 1);
  }
  if (cell_count > kMostCells) {
    r.fail(root["matrix"], "matrix",
           fmt::format("crosses {} values into more than {} cells; split the file, or narrow an axis",
                       fmt::join(axis_sizes, " x "), kMostCells));
  }
  // A `when` value that selects no cell would never apply, silently: refused.  That is a value of
  // another shape than its path's values (a list or mapping where they are scalars, or the reverse),
  // and a scalar the matrix does not have (a release the `system` axis lacks, a typo), alone or in
  // a list on a path of scalars (which selects any of its values), where the path has two values or more.
  if (const YAML::Node expect = root["expect"]; expect.IsSequence()) {
    for (size_t i = 0; i < expect.size(); ++i) {
      const YAML::Node entry = expect[i];
      if (!entry.IsMap()) continue;
      const YAML::Node when = entry["when"];
      if (!when.IsDefined() || !when.IsMap()) continue;
      for (const auto& kv : when) {
        const std::string key = kv.first.as<std::string>();
        if (!m.varies(key)) continue;  // reported with the cells: not a matrix key
        const std::vector<YAML::Node> values = m.values_of(key);
        const bool one_of = kv.second.IsSequence() && axis_of_scalars(values);
        const bool same_shape = std::any_of(values.begin(), values.end(),
                                            [&](const YAML::Node& v) { return v.Type() == kv.second.Type(); });
        std::vector<std::string> texts;
        for (const auto& v : values) texts.push_back(cell_text(key, v));
        const auto absent = [&](const YAML::Node& v) {
          return v.IsScalar() && std::find(texts.begin(), texts.end(), cell_text(key, v)) == texts.end();
        };
        const std::string field = fmt::format("expect[{}].when.{}", i, key);
        if (!one_of && !same_shape) {
          r.fail(kv.second, field, fmt::format("selects no cell: matrix.{} has {}", key, fmt::join(texts, ", ")));
        }
        // A path narrowed to one value (a file written for several releases, run on one) keeps the
        // entries of the others: only a path that still varies is held to them.
        if (axis_of_scalars(values) && values.size() > 1) {
          for (const auto& v : one_of ? std::vector<YAML::Node>(kv.second.begin(), kv.second.end())
                                      : std::vector<YAML::Node>{kv.second}) {
            if (absent(v)) {
              r.fail(v, field,
                     fmt::format("'{}' selects no cell: matrix.{} has {}", v.Scalar(), key, fmt::join(texts, ", ")));
            }
          }
        }
      }
    }
  }
  m.cells = {{}};
  for (const auto& axis : m.axes) {
    std::vector<std::vector<size_t>> next;
    for (const auto& cell : m.cells) {
      for (size_t i = 0; i < axis.values.size(); ++i) {
        next.push_back(cell);
        next.back().push_back(i);
      }
    }
    m.cells = next;
  }
  return m;
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
