// Checkpoints in PyTorch's own serialisation (torch::pickle_save writes what Python's
// torch.load reads).
//
// Sharded: one file per rank, `rank<r>.pt`, a dict
//   {"format": "dmpcheck-sharded-v1", "rank", "world_size", "steps", "plan",
//    "pieces": [{"name", "sharding", "row_offset", "rows", "col_offset", "cols",
//                "full_sizes", "tensor"}...]}
// holding every piece the rank has (its shards, the data_parallel tables, the dense tensors,
// and their optimizer state).  Unsharded: one file, a dict
//   {"format": "dmpcheck-unsharded-v1", "steps", "state_dict": {name: tensor}}
// whose keys are the unsharded model's (`ebc.embedding_bags.<table>.weight`, ...).
//
// Loading always goes through full tensors, so a checkpoint loads at any world size and under
// any plan: each rank takes its own pieces out of the full tensors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dmp/model_parallel.h"

namespace dmpcheck::dmp {

struct FullState {
  int64_t steps = 0;  // training steps taken before the checkpoint
  std::string plan;   // a sharded checkpoint's plan (ShardingPlan::serialize); empty for an unsharded one
  std::map<std::string, at::Tensor> tensors;
};

// Writes `directory`/rank<r>.pt for this rank (atomically: temporary file, then rename).
void save_sharded_checkpoint(const std::string& directory, const DistributedModelParallel& model, int rank,
                             int world_size, int64_t steps);
// Assembles full tensors from every rank<r>.pt in `directory`.  Error(kInvalidInput) when files
// are missing, of another format, or do not cover a tensor.
FullState load_sharded_checkpoint(const std::string& directory);
void save_unsharded_checkpoint(const std::string& path, const FullState& state);
// A directory is read as sharded, a file as unsharded: dmpcheck's own format, or a plain
// state_dict of tensors under dmpcheck's names (torch.save(model.state_dict())), as 0 steps.
FullState load_checkpoint(const std::string& path);
// One file's checkpoint from its bytes (`path` names it in errors).
FullState parse_checkpoint(const std::vector<char>& bytes, const std::string& path);
// Error(kInvalidInput) naming `source` and the tensor unless `state` (full tensors, as a checkpoint
// holds them) fits `model`: every name one this rank would hold (a table's tensors checked on the
// ranks that hold the table, the dense ones on every rank) or an optimizer state of it, every
// weight present with the model's full shape, every tensor floating point and finite.
// Optimizer state may be absent (a plain state_dict) or in an older layout loading takes apart.
void check_state_fits(const DistributedModelParallel& model, const std::map<std::string, at::Tensor>& state,
                      const std::string& source);

// Torch-loadable dump of one batch: {"keys", "values", "lengths", "weights" (optional), "stride"}.
void save_batch(const std::string& path, const KeyedJaggedTensor& batch);
// Reads what save_batch writes (or torch.save of such a dict): Error(kInvalidInput) naming the
// file and the field when it is not one.  The batch is validated as a KeyedJaggedTensor.
KeyedJaggedTensor load_batch(const std::string& path);
// The same from the file's bytes (`path` names it in errors).
KeyedJaggedTensor parse_batch(const std::vector<char>& bytes, const std::string& path);

}  // namespace dmpcheck::dmp
