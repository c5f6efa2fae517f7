// Fuzz target: bytes as one rank's phase of the release exchange (run/tensor_exchange.h): the
// manifest's JSON, a NUL, then the tensor bytes.  Read and assembled as dmpcheck reads a release's
// output; anything malformed must raise dmpcheck::Error, never crash, wrap or allocate unbounded.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/error.h"
#include "common/file_io.h"
#include "run/release_contract.h"
#include "run/tensor_exchange.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One directory for the whole run, removed when the fuzzer exits (it was left behind, one per run).
  struct Scratch {
    std::string path = std::filesystem::temp_directory_path().string() + "/dmpcheck-exchange-fuzz-XXXXXX";
    Scratch() {
      if (::mkdtemp(path.data()) == nullptr) std::abort();
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    ~Scratch() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Scratch scratch;
  const std::string& dir = scratch.path;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const size_t split = bytes.find('\0');
  static const std::string phase = dmpcheck::run::contract::phase_after(1);
  try {
    dmpcheck::write_file_atomically(dir + "/" + phase + ".json", bytes.substr(0, split));
    dmpcheck::write_file_atomically(dir + "/" + phase + ".bin",
                                    split == std::string::npos ? "" : bytes.substr(split + 1));
    dmpcheck::run::assemble_full({dmpcheck::run::read_exchange_phase(dir, phase)});
  } catch (const dmpcheck::Error&) {}
  return 0;
}
