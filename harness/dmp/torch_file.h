// A torch.save file's zip container, checked before libtorch reads it.  libtorch's reader trusts
// the sizes and offsets the zip's directory declares: an entry whose uncompressed size is 2^32-1
// over 2 stored bytes made libtorch 1.13 copy past its buffer (SIGSEGV, found by
// `ci/fuzz.sh --mutate`).  torch writes every entry stored (uncompressed), so each entry must be
// stored, of the size it claims, lie within the file and match its CRC-32.
#pragma once

#include <string>
#include <vector>

namespace dmpcheck::dmp {

// Error(kInvalidInput) naming `path` and the entry unless `bytes` are a zip torch could have
// written: an end-of-directory record, every directory entry stored, its compressed and
// uncompressed sizes equal, its local header and data within the file, its data of its CRC-32.
void check_torch_zip(const std::vector<char>& bytes, const std::string& path);
// Whether check_torch_zip checks each entry's CRC-32 (on unless turned off).  The fuzz targets turn
// it off, so that mutated bytes reach libtorch's reader instead of stopping at the checksum.
void check_zip_crc32(bool on);

}  // namespace dmpcheck::dmp
