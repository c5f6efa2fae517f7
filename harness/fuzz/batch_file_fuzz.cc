// Fuzz target: bytes as a batch file (`data: {from: DIR}`'s batch<S>.pt, torch.save's zip of a
// pickled dict).  Malformed input must raise dmpcheck::Error, never crash, hang or allocate beyond
// what the bytes hold (an expanded tensor asking for gigabytes is refused before it is copied).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "dmp/checkpoint.h"
#include "dmp/torch_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool unchecked = (dmpcheck::dmp::check_zip_crc32(false), true);  // reach libtorch's reader
  (void)unchecked;
  const std::vector<char> bytes(reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + size);
  try {
    (void)dmpcheck::dmp::parse_batch(bytes, "batch0.pt");
  } catch (const dmpcheck::Error&) {}
  return 0;
}
