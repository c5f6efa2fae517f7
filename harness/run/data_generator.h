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

}  // namespace dmpcheck::run
