// Who may take part in a run, and what they may believe: every run has a secret (made by
// dmpcheck's launcher and handed to its ranks as DMPCHECK_RUN_SECRET, or set by the user for the
// same value on every rank under an external launcher).  All the run's keys live under a prefix
// derived from it, so a process without it cannot find them to read or overwrite, and what the
// ranks receive (the scenario, the run spec) and what they send back (the result, their errors)
// carries an HMAC-SHA256 under it, so nothing forged is believed.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "comm/store.h"

namespace dmpcheck::run {

inline constexpr const char* kSecretVariable = "DMPCHECK_RUN_SECRET";

// The store's view for the run's keys: prefixed by a name derived from the secret.
comm::Store secret_view(const comm::Store& store, const std::string& secret);

// Launcher (or rank 0 under an external launcher): every entry, the list of their keys and one
// MAC over all of them.
void hand_over(comm::Store& store, const std::map<std::string, std::string>& entries, const std::string& secret);
// A rank: the entries, once their MAC checks; Error(kCommunication) when it does not (forged or
// written by a run with another secret), naming which.
std::map<std::string, std::string> take_over(comm::Store& store, const std::string& secret);

// A value with its MAC (key and key + "#mac").
void set_signed(comm::Store& store, const std::string& key, const std::string& value, const std::string& secret);
// The value when present and its MAC checks; `problem` says why a present value was refused.
std::optional<std::string> get_signed(comm::Store& store, const std::string& key, const std::string& secret,
                                      std::string* problem = nullptr);

}  // namespace dmpcheck::run
