// What a run runs on, parsed once: the reference DMP, an installed TorchRec release, a Python
// interpreter of the user's where TorchRec imports, or a TorchRec commit (its source over the
// environment of the release it descends from).  The text forms ("reference", "torchrec==1.9.2",
// "python:/opt/venv/bin/python", "torchrec@cc482f8") are written and read here only; everything
// else asks the type.  Every kind but the reference runs the same rank program (torchrec_sut/).
#pragma once

#include <cctype>
#include <optional>
#include <string>

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

  static System release(std::string v) { return {Kind::kRelease, std::move(v), {}}; }
  static System python(std::string path) { return {Kind::kPython, std::move(path), {}}; }
  static System commit(std::string rev, std::string over = {}) {
    return {Kind::kCommit, std::move(rev), std::move(over)};
  }
  bool is_release() const { return kind == Kind::kRelease; }
  // Whether the cell runs real TorchRec through the rank program (any kind but the reference).
  bool runs_torchrec() const { return kind != Kind::kReference; }
  std::string name() const {
    switch (kind) {
      case Kind::kRelease: return kReleasePrefix + version;
      case Kind::kPython: return kPythonPrefix + version;
      case Kind::kCommit: return kCommitPrefix + version + (over.empty() ? "" : kOver + over);
      case Kind::kReference: break;
    }
    return "reference";
  }
  bool operator==(const System& o) const { return kind == o.kind && version == o.version && over == o.over; }
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
    const std::string v = text.substr(sizeof(kReleasePrefix) - 1);
    return is_version(v) ? std::optional<System>(release(v)) : std::nullopt;
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
      "'reference', a TorchRec release as 'torchrec==X.Y.Z' (e.g. torchrec==1.9.2), a TorchRec commit as "
      "'torchrec@<rev>' (e.g. torchrec@cc482f8, or 'torchrec@cc482f8 over 0.7.0' to name the release environment "
      "it runs over) or an interpreter as 'python:/path/to/bin/python'";

 private:
  static constexpr const char kReleasePrefix[] = "torchrec==";
  static constexpr const char kPythonPrefix[] = "python:";
  static constexpr const char kCommitPrefix[] = "torchrec@";
  static constexpr const char kOver[] = " over ";
};

}  // namespace dmpcheck::scenario
