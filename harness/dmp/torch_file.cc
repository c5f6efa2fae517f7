#include "dmp/torch_file.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "common/names.h"

namespace dmpcheck::dmp {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50, kDirectoryEntry = 0x02014b50, kEnd = 0x06054b50;
constexpr uint32_t kZip64End = 0x06064b50, kZip64Locator = 0x07064b50;

// Little-endian fields at `at`, or nothing past the end (the caller says what was missing).
class Bytes {
 public:
  Bytes(const std::vector<char>& bytes, const std::string& path) : b_(bytes), path_(path) {}
  uint64_t read(uint64_t at, int width, const char* what) const {
    DMP_CHECK(at <= b_.size() && static_cast<uint64_t>(width) <= b_.size() - at, ErrorKind::kInvalidInput,
              "{} is not a torch-serialised file: its zip's {} lies past the end of the file", path_, what);
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b_[at + i]);
    return v;
  }
  std::string text(uint64_t at, uint64_t n) const {
    read(at, 0, "entry name");
    return std::string(b_.data() + at, static_cast<size_t>(std::min<uint64_t>(n, b_.size() - at)));
  }

 private:
  const std::vector<char>& b_;
  const std::string& path_;
};

std::atomic<bool> crc32_checked{true};

// The zip's CRC-32 (ISO-HDLC, as zlib's crc32) of `n` bytes at `data`.
uint32_t crc32_of(const char* data, uint64_t n) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (uint64_t i = 0; i < n; ++i) c = table[(c ^ static_cast<unsigned char>(data[i])) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// libtorch's unpickler sizes a string by the length its opcode declares before reading it: a
// BINUNICODE claiming 4 GiB in a 287-byte data.pkl allocated and zeroed 4 GiB, seconds of work
// (found by ci/fuzz.sh --runs).  Each declared length must fit in what follows it.  The walk knows
// the binary opcodes torch.save writes and stops at any other one (libtorch judges the rest).
std::optional<std::string> pickle_overrun(const char* p, uint64_t n) {
  // The binary opcodes by what follows them: nothing, so many bytes, or a length of so many bytes
  // and then that many bytes.
  static constexpr std::array<std::pair<std::string_view, int>, 5> kFixed = {
      {{"}])(teasuRbQN012ldo\x81\x85\x86\x87\x88\x89\x8f\x90\x91\x92\x93\x94\x97\x98", 0},
       {"\x80qhK", 1},
       {"M", 2},
       {"rjJ", 4},
       {"G\x95", 8}}};
  static constexpr std::array<std::pair<std::string_view, int>, 3> kLength = {
      {{"UC\x8a\x8c", 1}, {"TBX\x8b", 4}, {"\x8d\x8e\x96", 8}}};
  const auto width_in = [](const auto& table, char op) {
    for (const auto& [ops, width] : table)
      if (ops.find(op) != std::string_view::npos) return width;
    return -1;
  };
  uint64_t i = 0;
  while (i < n) {
    const char op = p[i++];
    if (op == '.') return std::nullopt;  // STOP
    if (op == 'c') {                     // GLOBAL: a module and a name, each ending in a newline
      for (int line = 0; line < 2; ++line) {
        const void* end = std::memchr(p + i, '\n', static_cast<size_t>(n - i));
        if (end == nullptr) return std::nullopt;
        i = static_cast<uint64_t>(static_cast<const char*>(end) - p) + 1;
      }
      continue;
    }
    const int fixed = width_in(kFixed, op);
    if (fixed >= 0) {
      i += static_cast<uint64_t>(fixed);
      continue;
    }
    const int width = width_in(kLength, op);
    if (width < 0 || static_cast<uint64_t>(width) > n - i) return std::nullopt;  // not read here, or truncated
    uint64_t length = 0;
    for (int k = width - 1; k >= 0; --k) length = (length << 8) | static_cast<unsigned char>(p[i + k]);
    i += static_cast<uint64_t>(width);
    if (length > n - i)
      return fmt::format("declares {} bytes at byte {} where {} remain", length, i - width - 1, n - i);
    i += length;
  }
  return std::nullopt;
}

}  // namespace

void check_zip_crc32(bool on) { crc32_checked = on; }

void check_torch_zip(const std::vector<char>& raw, const std::string& path) {
  // libtorch reads any bytes as a zip (its reader finds the directory from the end, whatever the
  // file starts with): so are they all checked here.
  const Bytes b(raw, path);
  auto bad = [&](const std::string& what) {
    throw_error(ErrorKind::kInvalidInput, fmt::format("{} is not a torch-serialised file: {}", path, what));
  };
  // The end-of-directory record: the last one, within 64 KiB + 22 bytes of the end.
  uint64_t end = raw.size() >= 22 ? raw.size() - 22 : 0;
  auto at_end_record = [&] { return raw.size() >= 22 && b.read(end, 4, "end record") == kEnd; };
  while (!at_end_record() && end > 0 && raw.size() - end <= 65557) --end;
  if (!at_end_record()) bad("its zip has no end-of-directory record");
  uint64_t entries = b.read(end + 10, 2, "end record"), dir_size = b.read(end + 12, 4, "end record"),
           dir_offset = b.read(end + 16, 4, "end record");
  // libtorch's reader (miniz) takes the zip64 end record's values whenever a zip64 locator precedes
  // the end record, whatever the end record says (torch writes both, equal): so are they read here,
  // and a file whose two records disagree is refused (an end record claiming no entries over a
  // zip64 record of eight hid an entry claiming 4 GiB from this check: a SIGSEGV in miniz, found by
  // `ci/fuzz.sh --mutate` with seed 20261206).
  const bool saturated = entries == 0xffff || dir_size == 0xffffffff || dir_offset == 0xffffffff;
  if (end >= 20 && b.read(end - 20, 4, "zip64 locator") == kZip64Locator) {
    const uint64_t end64 = b.read(end - 20 + 8, 8, "zip64 locator");
    if (b.read(end64, 4, "zip64 end record") != kZip64End) bad("its zip64 end record is not where its locator says");
    const uint64_t entries64 = b.read(end64 + 32, 8, "zip64 end record"),
                   size64 = b.read(end64 + 40, 8, "zip64 end record"),
                   offset64 = b.read(end64 + 48, 8, "zip64 end record");
    auto agree = [](uint64_t plain, uint64_t wide, uint64_t saturated_value) {
      return plain == saturated_value || plain == wide;
    };
    if (!agree(entries, entries64, 0xffff) || !agree(dir_size, size64, 0xffffffff) ||
        !agree(dir_offset, offset64, 0xffffffff))
      bad(fmt::format("its zip's end record ({} entries, {} bytes at {}) and zip64 end record ({} entries, {} bytes "
                      "at {}) disagree",
                      entries, dir_size, dir_offset, entries64, size64, offset64));
    std::tie(entries, dir_size, dir_offset) = std::tie(entries64, size64, offset64);
  } else if (saturated) {
    bad("its zip64 locator is missing");
  }
  if (dir_offset > raw.size() || dir_size > raw.size() - dir_offset || entries > dir_size / 46 + 1)
    bad(fmt::format("its zip's directory ({} entries, {} bytes at {}) does not fit the file's {} bytes", entries,
                    dir_size, dir_offset, raw.size()));
  struct Checksum {
    std::string name;
    uint64_t data, size, crc;
  };
  std::vector<Checksum> checksums;
  uint64_t at = dir_offset;
  for (uint64_t e = 0; e < entries; ++e) {
    if (b.read(at, 4, "directory") != kDirectoryEntry) bad(fmt::format("its zip's directory entry {} is not one", e));
    const uint64_t method = b.read(at + 10, 2, "directory");
    uint64_t compressed = b.read(at + 20, 4, "directory"), size = b.read(at + 24, 4, "directory");
    const uint64_t name_length = b.read(at + 28, 2, "directory"), extra_length = b.read(at + 30, 2, "directory"),
                   comment_length = b.read(at + 32, 2, "directory");
    uint64_t local = b.read(at + 42, 4, "directory");
    const std::string name = b.text(at + 46, name_length);
    // Zip64: the fields that are 0xffffffff follow in the extra field tagged 1, in this order.
    for (uint64_t x = at + 46 + name_length; x + 4 <= at + 46 + name_length + extra_length;) {
      const uint64_t tag = b.read(x, 2, "extra field"), length = b.read(x + 2, 2, "extra field");
      if (tag == 1) {
        uint64_t f = x + 4;
        if (size == 0xffffffff) size = b.read(f, 8, "zip64 sizes"), f += 8;
        if (compressed == 0xffffffff) compressed = b.read(f, 8, "zip64 sizes"), f += 8;
        if (local == 0xffffffff) local = b.read(f, 8, "zip64 offset");
      }
      x += 4 + length;
    }
    if (method != 0)
      bad(fmt::format("zip entry '{}' is compressed (method {}); torch stores entries as they are", name, method));
    if (compressed != size) bad(fmt::format("zip entry '{}' claims {} bytes but stores {}", name, size, compressed));
    if (b.read(local, 4, "local header") != kLocalHeader) bad(fmt::format("zip entry '{}' has no local header", name));
    const uint64_t data = local + 30 + b.read(local + 26, 2, "local header") + b.read(local + 28, 2, "local header");
    if (data > raw.size() || size > raw.size() - data)
      bad(fmt::format("zip entry '{}' ({} bytes at {}) runs past the end of the file ({} bytes)", name, size, data,
                      raw.size()));
    if (ends_with(name, "data.pkl")) {
      if (auto overrun = pickle_overrun(raw.data() + data, size))
        bad(fmt::format("zip entry '{}' (the pickle) {}", name, *overrun));
    }
    checksums.push_back({name, data, size, b.read(at + 16, 4, "directory")});
    at += 46 + name_length + extra_length + comment_length;
  }
  // libtorch builds miniz without its CRC check (MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS), so a
  // flipped byte in a tensor loaded unseen (issue 46, item 8); torch writes every entry's CRC.
  // Checked once every entry is known to lie within the file.  A CRC of 0 is none recorded:
  // torch.save writes 0 under torch.serialization.set_crc32_options(False), and torch.load reads it.
  for (const auto& entry : checksums) {
    if (crc32_checked && entry.crc != 0 && crc32_of(raw.data() + entry.data, entry.size) != entry.crc)
      bad(fmt::format("zip entry '{}' fails its CRC-32 check (the file was changed or damaged after it was written)",
                      entry.name));
  }
}

}  // namespace dmpcheck::dmp
