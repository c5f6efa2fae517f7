#include "run/handover.h"

#include <nlohmann/json.hpp>

#include "common/digest.h"
#include "common/error.h"

namespace dmpcheck::run {
namespace {

std::string entries_mac(const std::map<std::string, std::string>& entries, const std::string& secret) {
  return hmac_hex(secret, "dmpcheck entries\n" + nlohmann::json(entries).dump());
}

std::string value_mac(const std::string& key, const std::string& value, const std::string& secret) {
  return hmac_hex(secret, "dmpcheck value\n" + key + "\n" + value);
}

// Every entry, the list of their keys and one MAC over all of them.
void hand_over_entries(comm::Store& store, const std::map<std::string, std::string>& entries,
                       const std::string& secret) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : entries) {
    store.set("entry/" + key, value);
    keys.push_back(key);
  }
  store.set("entries", nlohmann::json(keys).dump());
  store.set("entries#mac", entries_mac(entries, secret));  // last: a rank that sees it sees all
}

// The entries, once their MAC checks; Error(kCommunication) naming them when it does not
// (forged, or written by a run with another secret).
std::map<std::string, std::string> take_over_entries(comm::Store& store, const std::string& secret) {
  const std::string mac = store.get("entries#mac");
  std::map<std::string, std::string> entries;
  std::vector<std::string> keys;
  try {
    keys = nlohmann::json::parse(store.get("entries")).get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorKind::kCommunication,
                fmt::format("the run's list of entries in the store is malformed: {}", e.what()));
  }
  for (const auto& key : keys) entries[key] = store.get("entry/" + key);
  DMP_CHECK(constant_time_equal(mac, entries_mac(entries, secret)), ErrorKind::kCommunication,
            "what the store hands this rank ({}) does not carry the run's MAC: forged, or from a run with another {}; "
            "refused",
            fmt::join(keys, ", "), kSecretVariable);
  return entries;
}

}  // namespace

comm::Store secret_view(const comm::Store& store, const std::string& secret) {
  return store.with_prefix("run-" + hmac_hex(secret, "dmpcheck store keys").substr(0, 32));
}

void set_signed(comm::Store& store, const std::string& key, const std::string& value, const std::string& secret) {
  store.set(key, value);
  store.set(key + "#mac", value_mac(key, value, secret));
}

std::optional<std::string> get_signed(comm::Store& store, const std::string& key, const std::string& secret,
                                      std::string* problem) {
  auto value = store.try_get(key);
  if (!value) return std::nullopt;
  const auto mac = store.try_get(key + "#mac");
  if (!mac || !constant_time_equal(*mac, value_mac(key, *value, secret))) {
    if (problem) *problem = fmt::format("the store's '{}' does not carry the run's MAC (forged?); refused", key);
    return std::nullopt;
  }
  return value;
}

void hand_over(comm::Store& store, const RankTask& task, const std::string& secret) {
  hand_over_entries(store, {{"task", nlohmann::json(task).dump()}}, secret);
}

RankTask take_task(comm::Store& store, const std::string& secret) {
  return nlohmann::json::parse(take_over_entries(store, secret).at("task")).get<RankTask>();
}

}  // namespace dmpcheck::run
