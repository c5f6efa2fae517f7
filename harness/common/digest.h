// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), for authenticating what a run's ranks exchange
// through the store, and FNV-1a 64 for tensor digests.  No dependency beyond the standard library.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace dmpcheck {

std::array<uint8_t, 32> sha256(std::string_view data);
std::string to_hex(const uint8_t* bytes, size_t size);
// hex(HMAC-SHA256(key, message)).
std::string hmac_hex(std::string_view key, std::string_view message);
// Equal in time independent of where they differ.
bool constant_time_equal(std::string_view a, std::string_view b);
// FNV-1a 64 of `bytes`: tensor digests and the agreement of ranks on a text (not a MAC).
uint64_t fnv1a64(std::string_view bytes);
// 32 random bytes from the kernel, as hex: a run's secret.
std::string random_secret();

}  // namespace dmpcheck
