// Deterministic batches: the global batch of step s depends only on (data.seed, s) and the
// tables, so every rank, and the unsharded reference, sees the same data.  Rank r's local batch
// is bags [r*B, (r+1)*B) of the global batch.
#pragma once

#include "dmp/keyed_jagged_tensor.h"
#include "scenario/scenario.h"

namespace dmpcheck::run {

// stride = batch_size * world_size; keys in model feature order.
dmp::KeyedJaggedTensor make_global_batch(const scenario::RunSpec& spec, int step);
dmp::KeyedJaggedTensor local_batch(const scenario::RunSpec& spec, const dmp::KeyedJaggedTensor& global, int rank);

// Variable batch per feature (TorchRec's VBE) of rank `rank`'s batch of `step`, keys in model
// feature order: each key's distinct bags and, per key, batch_size inverse indices into them (a
// key without variable batches: batch_size bags, indices 0..batch_size-1).  The batches above are
// the expansion (bag i of a key is its distinct bag inverse[i]), which the reference trains on.
struct VariableBatch {
  std::vector<int64_t> stride_per_key;
  std::vector<int64_t> inverse_indices;  // key-major, batch_size per key
};
VariableBatch variable_batch(const scenario::RunSpec& spec, int step, int rank);

// A tensor's elements as int64, in order (lengths and ids, as a batch file holds them).
std::vector<int64_t> to_vector(const at::Tensor& t);

}  // namespace dmpcheck::run
