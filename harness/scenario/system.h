// What a run runs on, parsed once: the reference DMP, an installed TorchRec release (alone, or
// with some of its packages pinned otherwise: a set of pins), a Python interpreter of the user's
// where TorchRec imports, or a TorchRec commit (its source over the environment of the release it
// descends from).  The text forms ("reference", "torchrec==1.9.2", "torchrec==1.2.0
// fbgemm-gpu-cpu==1.1.0", "python:/opt/venv/bin/python", "torchrec@cc482f8") are written and read
// here only; everything else asks the type.  Every kind but the reference runs the same rank
// program (torchrec_sut/).
#pragma once

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dmpcheck::scenario {

struct System {
  enum class Kind { kReference, kRelease, kPython, kCommit };
  Kind kind = Kind::kReference;
  // kRelease: the version ("1.9.2"); kPython: the interpreter's path; kCommit: the revision as
  // written (a hash, a tag, any name git resolves in the TorchRec repository).
  std::string version;
  // kCommit: the pinned release whose environment its source runs over ("torchrec@<rev> over
  // 0.7.0"); empty: the release it descends from (release/torchrec_systems.h).
  std::string over;
  // kRelease: packages pinned beside TorchRec, by their normalised names, sorted ("fbgemm-gpu-cpu"
  // -> "1.1.0", "python" -> "3.10", "torch" -> "2.6.0"); the rest come from the release's own row of
  // torchrec_sut/pins.tsv (ci/torchrec-env.sh).  Empty: the release as pinned.
  std::vector<std::pair<std::string, std::string>> pins;

  static System release(std::string v) { return {Kind::kRelease, std::move(v), {}, {}}; }
  static System python(std::string path) { return {Kind::kPython, std::move(path), {}, {}}; }
  static System commit(std::string rev, std::string over = {}) {
    return {Kind::kCommit, std::move(rev), std::move(over), {}};
  }
  bool is_release() const { return kind == Kind::kRelease; }
  // Whether the cell runs real TorchRec through the rank program (any kind but the reference).
  bool runs_torchrec() const { return kind != Kind::kReference; }
  std::string name() const {
    switch (kind) {
      case Kind::kRelease: {
        std::string out = kReleasePrefix + version;
        for (const auto& [package, pinned] : pins) out += " " + package + "==" + pinned;
        return out;
      }
      case Kind::kPython: return kPythonPrefix + version;
      case Kind::kCommit: return kCommitPrefix + version + (over.empty() ? "" : kOver + over);
      case Kind::kReference: break;
    }
    return "reference";
  }
  bool operator==(const System& o) const {
    return kind == o.kind && version == o.version && over == o.over && pins == o.pins;
  }
  bool operator!=(const System& o) const { return !(*this == o); }

  // One of the text forms above; nullopt for anything else.
  static std::optional<System> parse(const std::string& text) {
    if (text == "reference") return System{};
    if (text.rfind(kPythonPrefix, 0) == 0) {
      std::string path = text.substr(sizeof(kPythonPrefix) - 1);
      if (path.empty()) return std::nullopt;
      return python(std::move(path));
    }
    if (text.rfind(kCommitPrefix, 0) == 0) {
      std::string rev = text.substr(sizeof(kCommitPrefix) - 1);
      std::string base;
      if (const auto at = rev.find(kOver); at != std::string::npos) {
        base = rev.substr(at + sizeof(kOver) - 1);
        rev.resize(at);
        if (!is_version(base)) return std::nullopt;
      }
      // What git accepts in a revision that names one commit, without options or ranges.
      if (rev.empty() || rev[0] == '-' || rev.find("..") != std::string::npos) return std::nullopt;
      for (char c : rev) {
        if (!std::isalnum(static_cast<unsigned char>(c)) && std::string("._/~^-").find(c) == std::string::npos) {
          return std::nullopt;
        }
      }
      return commit(std::move(rev), std::move(base));
    }
    if (text.rfind(kReleasePrefix, 0) != 0) return std::nullopt;
    // "torchrec==X.Y.Z", then any pins as pip reads them: "NAME==VERSION" separated by spaces.
    std::vector<std::string> words;
    for (size_t i = 0; i < text.size();) {
      const size_t end = std::min(text.find(' ', i), text.size());
      if (end > i) words.push_back(text.substr(i, end - i));
      i = end + 1;
    }
    const std::string v = words[0].substr(sizeof(kReleasePrefix) - 1);
    if (!is_version(v)) return std::nullopt;
    System out = release(v);
    for (size_t i = 1; i < words.size(); ++i) {
      const auto eq = words[i].find("==");
      if (eq == std::string::npos || eq == 0) return std::nullopt;
      auto pin = std::make_pair(package_name(words[i].substr(0, eq)), words[i].substr(eq + 2));
      if (pin.first.empty() || pin.first == "torchrec" || !is_pin_version(pin.second)) return std::nullopt;
      if (pin.first == "python" && pin.second.find_first_not_of("0123456789.") != std::string::npos)
        return std::nullopt;
      for (const auto& [package, _] : out.pins) {
        if (package == pin.first) return std::nullopt;
      }
      out.pins.push_back(std::move(pin));
    }
    std::sort(out.pins.begin(), out.pins.end());
    return out;
  }
  // A package's name as pip compares them (PEP 503: lower case, runs of "-_." as one "-"); empty
  // when it has a character no package name has.
  static std::string package_name(const std::string& name) {
    std::string out;
    for (char c : name) {
      if (std::isalnum(static_cast<unsigned char>(c))) {
        out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      } else if (c == '-' || c == '_' || c == '.') {
        if (out.empty() || out.back() != '-') out += '-';
      } else {
        return "";
      }
    }
    if (out.empty() || out.front() == '-' || out.back() == '-') return "";
    return out;
  }
  // An exact version pip can pin: "2.6.0", "2.6.0+cpu", "1.0.0rc1".
  static bool is_pin_version(const std::string& v) {
    if (v.empty() || !std::isdigit(static_cast<unsigned char>(v[0])) || v.size() > 40) return false;
    return std::all_of(v.begin(), v.end(),
                       [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '+'; });
  }
  // "X.Y.Z", three whole numbers.
  static bool is_version(const std::string& v) {
    int numbers = 0;
    bool digit = false;
    for (char c : v) {
      if (std::isdigit(static_cast<unsigned char>(c))) {
        if (!digit) ++numbers;
        digit = true;
      } else if (c == '.' && digit) {
        digit = false;
      } else {
        return false;
      }
    }
    return numbers == 3 && digit;
  }
  static constexpr const char* kExpected =
      "'reference', a TorchRec release as 'torchrec==X.Y.Z' (e.g. torchrec==1.9.2), with pins beside it as pip "
      "takes them ('torchrec==1.2.0 fbgemm-gpu-cpu==1.1.0', 'torchrec==0.5.0 python==3.10'), a TorchRec commit as "
      "'torchrec@<rev>' (e.g. torchrec@cc482f8, or 'torchrec@cc482f8 over 0.7.0' to name the release environment "
      "it runs over) or an interpreter as 'python:/path/to/bin/python'";

 private:
  static constexpr const char kReleasePrefix[] = "torchrec==";
  static constexpr const char kPythonPrefix[] = "python:";
  static constexpr const char kCommitPrefix[] = "torchrec@";
  static constexpr const char kOver[] = " over ";
};

}  // namespace dmpcheck::scenario
