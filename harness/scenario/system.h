// What a run runs on, parsed once: the reference DMP, or an installed TorchRec release.  Its text
// form ("reference", "torchrec==1.9.2") is written and read here only; everything else asks the
// type.  A new kind of system (a user's interpreter, a TorchRec commit) is a new Kind here and a
// runner in run/.
#pragma once

#include <cctype>
#include <optional>
#include <string>

namespace dmpcheck::scenario {

struct System {
  enum class Kind { kReference, kRelease };
  Kind kind = Kind::kReference;
  std::string version;  // kRelease: "1.9.2"

  static System release(std::string v) { return {Kind::kRelease, std::move(v)}; }
  bool is_release() const { return kind == Kind::kRelease; }
  std::string name() const { return is_release() ? kReleasePrefix + version : "reference"; }
  bool operator==(const System& o) const { return kind == o.kind && version == o.version; }
  bool operator!=(const System& o) const { return !(*this == o); }

  // "reference" or "torchrec==X.Y.Z" (three whole numbers); nullopt for anything else.
  static std::optional<System> parse(const std::string& text) {
    if (text == "reference") return System{};
    if (text.rfind(kReleasePrefix, 0) != 0) return std::nullopt;
    const std::string v = text.substr(sizeof(kReleasePrefix) - 1);
    int numbers = 0;
    bool digit = false;
    for (char c : v) {
      if (std::isdigit(static_cast<unsigned char>(c))) {
        if (!digit) ++numbers;
        digit = true;
      } else if (c == '.' && digit) {
        digit = false;
      } else {
        return std::nullopt;
      }
    }
    if (numbers != 3 || !digit) return std::nullopt;
    return release(v);
  }
  static constexpr const char* kExpected =
      "'reference' or a TorchRec release as 'torchrec==X.Y.Z' (e.g. torchrec==1.9.2)";

 private:
  static constexpr const char kReleasePrefix[] = "torchrec==";
};

}  // namespace dmpcheck::scenario
