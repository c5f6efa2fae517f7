// KeyedJaggedTensor, as TorchRec lays it out: for keys k0..kK-1 and a batch of `stride` bags per
// key, lengths[k * stride + b] ids belong to bag b of key k, and values holds all ids key-major.
//
//   keys    = ["f0", "f1"], stride = 2
//   lengths = [1, 2,   0, 1]          // f0: bags of 1 and 2 ids; f1: an empty bag and 1 id
//   values  = [5, 7, 9,   3]
//   offsets = [0, 1, 3, 3, 4]         // exclusive prefix sum of lengths, size K*stride + 1
//
// The constructor checks every invariant and raises Error(kInvalidInput) naming what is wrong.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dmpcheck::dmp {

// at::cat of `parts`, or an empty 1-D tensor of `options` where there are none.
at::Tensor cat_or_empty(const std::vector<at::Tensor>& parts, const at::TensorOptions& options);

class KeyedJaggedTensor {
 public:
  // values: int64 ids, lengths: int64, weights (optional): float, one per id.
  KeyedJaggedTensor(std::vector<std::string> keys, at::Tensor values, at::Tensor lengths,
                    std::optional<at::Tensor> weights = std::nullopt);

  const std::vector<std::string>& keys() const { return keys_; }
  const at::Tensor& values() const { return values_; }
  const at::Tensor& lengths() const { return lengths_; }
  const at::Tensor& offsets() const { return offsets_; }
  const std::optional<at::Tensor>& weights() const { return weights_; }
  int64_t stride() const { return stride_; }

  // Index of `key`; Error(kInvalidInput) when absent.
  size_t key_index(const std::string& key) const;
  // The ids, lengths and weights of one key (views, no copy).
  at::Tensor values_of(size_t key) const;
  at::Tensor lengths_of(size_t key) const;
  std::optional<at::Tensor> weights_of(size_t key) const;

  // A KJT with only `keys`, in that order.
  KeyedJaggedTensor select(const std::vector<std::string>& keys) const;
  // Bags [begin, end) of every key: the local batch of one rank from a global batch.
  KeyedJaggedTensor slice_batch(int64_t begin, int64_t end) const;
  // Concatenates batches of the same keys along the batch dimension (rank order).
  static KeyedJaggedTensor concat_batches(const std::vector<KeyedJaggedTensor>& parts);

 private:
  int64_t value_offset(size_t key, int64_t bag) const;
  // Bags [begin, end) of `keys`, in that order.
  KeyedJaggedTensor bags_of(const std::vector<std::string>& keys, int64_t begin, int64_t end) const;

  std::vector<std::string> keys_;
  at::Tensor values_;
  at::Tensor lengths_;
  at::Tensor offsets_;
  std::optional<at::Tensor> weights_;
  int64_t stride_ = 0;
};

}  // namespace dmpcheck::dmp
