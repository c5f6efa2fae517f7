#include "dmp/keyed_jagged_tensor.h"

#include <set>

#include <ATen/ATen.h>

#include "common/error.h"

namespace dmpcheck::dmp {

at::Tensor cat_or_empty(const std::vector<at::Tensor>& parts, const at::TensorOptions& options) {
  return parts.empty() ? at::empty({0}, options) : at::cat(parts);
}

KeyedJaggedTensor::KeyedJaggedTensor(std::vector<std::string> keys, at::Tensor values, at::Tensor lengths,
                                     std::optional<at::Tensor> weights)
    : keys_(std::move(keys)), values_(std::move(values)), lengths_(std::move(lengths)), weights_(std::move(weights)) {
  std::set<std::string> unique(keys_.begin(), keys_.end());
  DMP_CHECK(unique.size() == keys_.size(), ErrorKind::kInvalidInput, "KeyedJaggedTensor: keys must be unique, got {}",
            fmt::join(keys_, ", "));
  DMP_CHECK(values_.dim() == 1 && values_.scalar_type() == at::kLong, ErrorKind::kInvalidInput,
            "KeyedJaggedTensor: values must be a 1-D int64 tensor of ids, got {}-D {}", values_.dim(),
            std::string(c10::toString(values_.scalar_type())));
  DMP_CHECK(lengths_.dim() == 1 && lengths_.scalar_type() == at::kLong, ErrorKind::kInvalidInput,
            "KeyedJaggedTensor: lengths must be a 1-D int64 tensor, got {}-D {}", lengths_.dim(),
            std::string(c10::toString(lengths_.scalar_type())));
  const int64_t num_keys = static_cast<int64_t>(keys_.size());
  if (num_keys == 0) {
    DMP_CHECK(lengths_.numel() == 0 && values_.numel() == 0, ErrorKind::kInvalidInput,
              "KeyedJaggedTensor: no keys but {} lengths and {} values", lengths_.numel(), values_.numel());
  } else {
    DMP_CHECK(lengths_.numel() % num_keys == 0, ErrorKind::kInvalidInput,
              "KeyedJaggedTensor: {} lengths is not a multiple of {} keys (lengths must hold "
              "keys x stride entries)",
              lengths_.numel(), num_keys);
    stride_ = lengths_.numel() / num_keys;
  }
  if (lengths_.numel() > 0) {
    const int64_t min_length = lengths_.min().item<int64_t>();
    if (min_length < 0) {
      const int64_t at_index = (lengths_ < 0).nonzero()[0][0].item<int64_t>();
      throw_error(ErrorKind::kInvalidInput, fmt::format("KeyedJaggedTensor: negative length {} for key '{}', bag {}",
                                                        min_length, keys_[at_index / stride_], at_index % stride_));
    }
  }
  const int64_t total = lengths_.numel() > 0 ? lengths_.sum().item<int64_t>() : 0;
  DMP_CHECK(total == values_.numel(), ErrorKind::kInvalidInput,
            "KeyedJaggedTensor: lengths sum to {} but there are {} values", total, values_.numel());
  if (weights_) {
    DMP_CHECK(weights_->dim() == 1 && weights_->numel() == values_.numel() && weights_->is_floating_point(),
              ErrorKind::kInvalidInput,
              "KeyedJaggedTensor: weights must be a 1-D float tensor with one weight per id ({}), "
              "got {} elements",
              values_.numel(), weights_->numel());
  }
  offsets_ = at::zeros({lengths_.numel() + 1}, at::kLong);
  if (lengths_.numel() > 0) offsets_.narrow(0, 1, lengths_.numel()).copy_(lengths_.cumsum(0));
}

size_t KeyedJaggedTensor::key_index(const std::string& key) const {
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == key) return i;
  }
  throw_error(ErrorKind::kInvalidInput,
              fmt::format("KeyedJaggedTensor has no key '{}' (keys: {})", key, fmt::join(keys_, ", ")));
}

int64_t KeyedJaggedTensor::value_offset(size_t key, int64_t bag) const {
  return offsets_[static_cast<int64_t>(key) * stride_ + bag].item<int64_t>();
}

at::Tensor KeyedJaggedTensor::values_of(size_t key) const {
  const int64_t begin = value_offset(key, 0);
  const int64_t end = value_offset(key, stride_);
  return values_.narrow(0, begin, end - begin);
}

at::Tensor KeyedJaggedTensor::lengths_of(size_t key) const {
  return lengths_.narrow(0, static_cast<int64_t>(key) * stride_, stride_);
}

std::optional<at::Tensor> KeyedJaggedTensor::weights_of(size_t key) const {
  if (!weights_) return std::nullopt;
  const int64_t begin = value_offset(key, 0);
  return weights_->narrow(0, begin, value_offset(key, stride_) - begin);
}

KeyedJaggedTensor KeyedJaggedTensor::select(const std::vector<std::string>& keys) const {
  return bags_of(keys, 0, stride_);
}

KeyedJaggedTensor KeyedJaggedTensor::slice_batch(int64_t begin, int64_t end) const {
  DMP_CHECK(0 <= begin && begin <= end && end <= stride_, ErrorKind::kInvalidInput,
            "KeyedJaggedTensor: batch slice [{}, {}) is outside the batch of {}", begin, end, stride_);
  return bags_of(keys_, begin, end);
}

KeyedJaggedTensor KeyedJaggedTensor::bags_of(const std::vector<std::string>& keys, int64_t begin, int64_t end) const {
  std::vector<at::Tensor> values, lengths, weights;
  for (const auto& key : keys) {
    const size_t k = key_index(key);
    const int64_t v0 = value_offset(k, begin);
    const int64_t v1 = value_offset(k, end);
    values.push_back(values_.narrow(0, v0, v1 - v0));
    lengths.push_back(lengths_of(k).narrow(0, begin, end - begin));
    if (weights_) weights.push_back(weights_->narrow(0, v0, v1 - v0));
  }
  std::optional<at::Tensor> w;
  if (weights_) w = cat_or_empty(weights, weights_->options());
  return KeyedJaggedTensor(keys, cat_or_empty(values, at::kLong), cat_or_empty(lengths, at::kLong), w);
}

KeyedJaggedTensor KeyedJaggedTensor::concat_batches(const std::vector<KeyedJaggedTensor>& parts) {
  DMP_INTERNAL_ASSERT(!parts.empty(), "concat_batches of nothing");
  const auto& keys = parts.front().keys();
  const bool weighted = parts.front().weights().has_value();
  std::vector<at::Tensor> values, lengths, weights;
  for (size_t k = 0; k < keys.size(); ++k) {
    for (const auto& part : parts) {
      DMP_INTERNAL_ASSERT(part.keys() == keys, "concat_batches: keys differ");
      values.push_back(part.values_of(k));
      lengths.push_back(part.lengths_of(k));
      if (weighted) weights.push_back(*part.weights_of(k));
    }
  }
  std::optional<at::Tensor> w;
  if (weighted) w = at::cat(weights);
  return KeyedJaggedTensor(keys, cat_or_empty(values, at::kLong), cat_or_empty(lengths, at::kLong), w);
}

}  // namespace dmpcheck::dmp
