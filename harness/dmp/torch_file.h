// A torch.save file's zip container, checked before libtorch reads it.  libtorch's reader trusts
// the sizes and offsets the zip's directory declares: an entry whose uncompressed size is 2^32-1
// over 2 stored bytes made libtorch 1.13 copy past its buffer (SIGSEGV, found by
// `ci/fuzz.sh --mutate`).  torch writes every entry stored (uncompressed), so each entry must be
// stored, of the size it claims, and lie within the file.
#pragma once

#include <string>
#include <vector>

namespace dmpcheck::dmp {

// Error(kInvalidInput) naming `path` and the entry unless `bytes` are a zip torch could have
// written: an end-of-directory record, every directory entry stored, its compressed and
// uncompressed sizes equal, its local header and data within the file.
void check_torch_zip(const std::vector<char>& bytes, const std::string& path);

}  // namespace dmpcheck::dmp
