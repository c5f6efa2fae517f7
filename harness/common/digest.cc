#include "common/digest.h"

#include <algorithm>
#include <cstring>

#include <sys/random.h>

#include "common/error.h"

namespace dmpcheck {
namespace {

constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void compress(uint32_t state[8], const uint8_t block[64]) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = (uint32_t(block[4 * i]) << 24) | (uint32_t(block[4 * i + 1]) << 16) | (uint32_t(block[4 * i + 2]) << 8) |
           uint32_t(block[4 * i + 3]);
  }
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t v[8];  // a..h
  std::copy(state, state + 8, v);
  for (int i = 0; i < 64; ++i) {
    const uint32_t a = v[0], e = v[4];
    const uint32_t t1 = v[7] + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & v[5]) ^ (~e & v[6])) + kRound[i] + w[i];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & v[1]) ^ (a & v[2]) ^ (v[1] & v[2]));
    std::copy_backward(v, v + 7, v + 8);  // h = g, ..., b = a
    v[4] += t1;                           // e = d + t1
    v[0] = t1 + t2;
  }
  for (int i = 0; i < 8; ++i) state[i] += v[i];
}

}  // namespace

std::array<uint8_t, 32> sha256(std::string_view data) {
  uint32_t state[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  size_t i = 0;
  for (; i + 64 <= data.size(); i += 64) compress(state, reinterpret_cast<const uint8_t*>(data.data() + i));
  uint8_t tail[128] = {0};
  const size_t rest = data.size() - i;
  std::memcpy(tail, data.data() + i, rest);
  tail[rest] = 0x80;
  const size_t blocks = rest + 1 + 8 <= 64 ? 1 : 2;
  const uint64_t bits = static_cast<uint64_t>(data.size()) * 8;
  for (int k = 0; k < 8; ++k) tail[blocks * 64 - 1 - k] = static_cast<uint8_t>(bits >> (8 * k));
  for (size_t b = 0; b < blocks; ++b) compress(state, tail + 64 * b);
  std::array<uint8_t, 32> out{};
  for (int k = 0; k < 8; ++k) {
    for (int j = 0; j < 4; ++j) out[4 * k + j] = static_cast<uint8_t>(state[k] >> (24 - 8 * j));
  }
  return out;
}

std::string hmac_hex(std::string_view key, std::string_view message) {
  std::string k(key);
  if (k.size() > 64) {
    const auto hashed = sha256(k);
    k.assign(reinterpret_cast<const char*>(hashed.data()), hashed.size());
  }
  k.resize(64, '\0');
  std::string inner(64, '\x36'), outer(64, '\x5c');
  for (size_t i = 0; i < 64; ++i) inner[i] ^= k[i], outer[i] ^= k[i];
  const auto inner_hash = sha256(inner + std::string(message));
  const auto mac = sha256(outer + std::string(reinterpret_cast<const char*>(inner_hash.data()), inner_hash.size()));
  return to_hex(mac.data(), mac.size());
}

std::string to_hex(const uint8_t* bytes, size_t size) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < size; ++i) {
    out += digits[bytes[i] >> 4];
    out += digits[bytes[i] & 15];
  }
  return out;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string random_secret() {
  uint8_t bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    DMP_CHECK(n > 0, ErrorKind::kInternal, "getrandom failed: {}", std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  return to_hex(bytes, sizeof(bytes));
}

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

}  // namespace dmpcheck
