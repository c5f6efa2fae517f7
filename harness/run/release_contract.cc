#include "run/release_contract.h"

#include <fstream>

#include "common/error.h"

namespace dmpcheck::run::contract {
namespace {

[[noreturn]] void throw_malformed(const std::string& what, const std::string& why) {
  throw_error(ErrorKind::kRankFailed, fmt::format("{}: not a valid contract document: {}", what, why));
}

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

// Every key of `got` is one of `want`'s and the other way round, at every depth; `want` is the
// document as its type writes it back, so a key the type lacks is unknown and one it has that
// `got` lacks is missing.
void same_fields(const nlohmann::json& got, const nlohmann::json& want, const std::string& path,
                 const std::string& what) {
  if (want.is_object()) {
    if (!got.is_object()) throw_malformed(what, fmt::format("'{}' is {}, expected an object", path, got.type_name()));
    for (const auto& [key, value] : got.items()) {
      if (!want.contains(key)) {
        throw_malformed(what, fmt::format("unknown field '{}' (this dmpcheck's contract, schema version {}, has no "
                                          "such field: the two sides are out of step)",
                                          join(path, key), kSchemaVersion));
      }
      same_fields(value, want.at(key), join(path, key), what);
    }
    for (const auto& [key, value] : want.items()) {
      if (!got.contains(key)) throw_malformed(what, fmt::format("missing field '{}'", join(path, key)));
    }
  } else if (want.is_array()) {
    for (size_t i = 0; i < want.size() && i < got.size(); ++i)
      same_fields(got[i], want[i], fmt::format("{}[{}]", path, i), what);
  }
}

}  // namespace

void read_checked(const nlohmann::json& document, const std::string& what,
                  const std::function<nlohmann::json(const nlohmann::json&)>& parse) {
  if (!document.is_object()) throw_malformed(what, fmt::format("{}, expected an object", document.type_name()));
  const auto it = document.find("schema_version");
  if (it == document.end() || !it->is_number_integer()) throw_malformed(what, "no whole-number 'schema_version'");
  if (it->get<int>() != kSchemaVersion) {
    throw_malformed(what, fmt::format("schema_version {}, this dmpcheck reads {} (the rank program at "
                                      "DMPCHECK_TORCHREC_SUT is from another dmpcheck)",
                                      it->get<int>(), kSchemaVersion));
  }
  nlohmann::json canonical;
  try {
    canonical = parse(document);
  } catch (const nlohmann::json::exception& e) { throw_malformed(what, e.what()); }
  same_fields(document, canonical, "", what);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  DMP_CHECK(in.good(), ErrorKind::kRankFailed, "{} is missing", path);
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw_error(ErrorKind::kRankFailed, fmt::format("{}: not JSON: {}", path, e.what()));
  }
}

}  // namespace dmpcheck::run::contract
