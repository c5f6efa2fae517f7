// Fuzz target: bytes as a KeyedJaggedTensor (keys, lengths, ids) and a lookup on a small
// table.  Malformed input must raise dmpcheck::Error, never crash.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>

#include "common/error.h"
#include "dmp/keyed_jagged_tensor.h"
#include "dmp/pooling.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int keys = data[0] % 4;
  const int lengths_count = data[1] % 16;
  size_t at = 2;
  std::vector<int64_t> lengths, ids;
  for (int i = 0; i < lengths_count && at < size; ++i) lengths.push_back(static_cast<int8_t>(data[at++]) % 8);
  while (at < size) ids.push_back(static_cast<int8_t>(data[at++]));
  std::vector<std::string> names;
  for (int k = 0; k < keys; ++k) names.push_back("f" + std::to_string(k));
  try {
    dmpcheck::dmp::KeyedJaggedTensor kjt(names, at::tensor(ids, at::kLong).reshape({-1}),
                                         at::tensor(lengths, at::kLong).reshape({-1}));
    const at::Tensor table = at::ones({10, 2});
    for (size_t k = 0; k < kjt.keys().size(); ++k) {
      dmpcheck::dmp::Bags bags{kjt.values_of(k), kjt.lengths_of(k), std::nullopt};
      dmpcheck::dmp::check_ids_in_range(bags, 10, "t", kjt.keys()[k]);
      dmpcheck::dmp::pooled_forward(table, bags, dmpcheck::dmp::PoolingType::kMean);
      dmpcheck::dmp::pooled_backward(at::ones({kjt.stride(), 2}), bags, dmpcheck::dmp::PoolingType::kSum);
    }
  } catch (const dmpcheck::Error&) {}
  return 0;
}
