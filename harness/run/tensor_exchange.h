// The tensor exchange between dmpcheck and a TorchRec rank program (torchrec_sut/dmpcheck_torchrec/
// dump.py documents the format): one phase of one rank is <dir>/<phase>.bin (float32 bytes; int64
// for a managed-collision module's ids and counters) and <dir>/<phase>.json (the pieces, written last).  Files, not a
// store: the Debian libtorch and a release's torch never load into one process, and their TCPStores do not speak to
// each other.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dmpcheck::run {

// One piece of a tensor as one rank holds it.
struct ExchangePiece {
  std::string name;
  std::string sharding;
  bool replicated = false;
  std::vector<int64_t> full_sizes;
  int64_t row_offset = 0;
  int64_t col_offset = 0;
  at::Tensor tensor;  // float32, or int64 (exact integer state)
};

void write_exchange_phase(const std::string& dir, const std::string& phase, const std::vector<ExchangePiece>& pieces);
// Error(kRankFailed) naming the file when it is missing, truncated or malformed.
std::vector<ExchangePiece> read_exchange_phase(const std::string& dir, const std::string& phase);

// Whole tensors from every rank's pieces: a replicated tensor from rank 0, a sharded one
// assembled from every piece.  Error(kRankFailed) when the pieces do not fit their tensor.
std::map<std::string, at::Tensor> assemble_full(const std::vector<std::vector<ExchangePiece>>& per_rank);

// Whole tensors as pieces (an initial state to hand over, or the reference's state per step).
std::vector<ExchangePiece> whole_pieces(const std::map<std::string, at::Tensor>& tensors);

}  // namespace dmpcheck::run
