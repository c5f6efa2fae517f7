#include "check/quantized_lookup.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Half.h>

#include "common/error.h"
#include "dmp/embedding_config.h"

namespace dmpcheck::check {
namespace {

float to_half(float x) { return static_cast<float>(c10::Half(x)); }

// One table as the inference kernels read it: per row a scale and a bias and the row's levels
// (integer types), or the row's fp16 values (scale 1, bias 0 unused).
struct QuantizedTable {
  scenario::QuantType type;
  int64_t dim = 0;
  std::vector<float> scale, bias;  // per row
  std::vector<float> values;       // rows x dim: a level, or an fp16 value widened
};

QuantizedTable quantize(const at::Tensor& weight, scenario::QuantType type) {
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  const int64_t rows = w.size(0), dim = w.size(1);
  const float* x = w.data_ptr<float>();
  QuantizedTable q{type, dim, std::vector<float>(rows, 1.0f), std::vector<float>(rows, 0.0f),
                   std::vector<float>(rows * dim)};
  if (type == scenario::QuantType::kFp16) {
    for (int64_t i = 0; i < rows * dim; ++i) q.values[i] = to_half(x[i]);
    return q;
  }
  const int bits = type == scenario::QuantType::kInt8 ? 8 : type == scenario::QuantType::kInt4 ? 4 : 2;
  const int top = (1 << bits) - 1;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * dim;
    const float minimum = to_half(*std::min_element(row, row + dim));  // the bias is stored as fp16
    const float range = *std::max_element(row, row + dim) - minimum;
    float scale = to_half(range == 0 ? 1.0f : range / static_cast<float>(top));
    if (scale == 0) scale = 1.0f;
    float inverse = 1.0f / scale;
    if (std::isinf(inverse)) scale = inverse = 1.0f;
    q.scale[r] = scale;
    q.bias[r] = minimum;
    for (int64_t c = 0; c < dim; ++c) {
      const long level = std::lrintf((row[c] - minimum) * inverse);
      q.values[r * dim + c] = static_cast<float>(std::clamp<long>(level, 0, top));
    }
  }
  return q;
}

// The trained table `name` quantized as the run says.
QuantizedTable quantized_table(const scenario::RunSpec& run, const std::map<std::string, at::Tensor>& weights,
                               const std::string& name) {
  const auto type = run.quant.find(name);
  const auto weight = weights.find(dmp::table_weight_key(name));
  DMP_CHECK(type != run.quant.end() && weight != weights.end(), ErrorKind::kInvalidInput,
            "table '{}': no quantized data type or no weight to quantize", name);
  return quantize(weight->second, type->second);
}

}  // namespace

std::map<std::string, at::Tensor> quantized_pooled(const scenario::RunSpec& run,
                                                   const std::map<std::string, at::Tensor>& weights,
                                                   const dmp::KeyedJaggedTensor& batch) {
  std::vector<dmp::EmbeddingBagConfig> pooled, sequences;
  std::map<std::string, int> readers;  // per feature, the sequence tables that read it
  for (const auto& t : run.model.tables) {
    (t.sequence ? sequences : pooled).push_back(t);
    if (t.sequence)
      for (const auto& f : t.feature_names) ++readers[f];
  }
  const std::vector<std::string> names = dmp::embedding_names(pooled);
  std::map<std::string, at::Tensor> out;
  for (const auto& t : sequences) {
    const QuantizedTable q = quantized_table(run, weights, t.name);
    for (const auto& feature : t.feature_names) {
      const at::Tensor ids = batch.values_of(batch.key_index(feature)).to(at::kLong).contiguous();
      at::Tensor rows = at::zeros({ids.numel(), q.dim}, at::kFloat);
      float* o = rows.data_ptr<float>();
      const int64_t* id = ids.data_ptr<int64_t>();
      for (int64_t i = 0; i < ids.numel(); ++i) {
        const float* v = q.values.data() + id[i] * q.dim;
        for (int64_t c = 0; c < q.dim; ++c)
          o[i * q.dim + c] =
              q.type == scenario::QuantType::kFp16 ? v[c] : std::fma(q.scale[id[i]], v[c], q.bias[id[i]]);
      }
      out["sequence_embeddings." + (readers[feature] == 1 ? feature : feature + "@" + t.name)] = rows;
    }
  }
  size_t lookup = 0;
  for (const auto& t : pooled) {
    const QuantizedTable q = quantized_table(run, weights, t.name);
    for (const auto& feature : t.feature_names) {
      const size_t key = batch.key_index(feature);
      const at::Tensor ids = batch.values_of(key).to(at::kLong).contiguous();
      const at::Tensor lengths = batch.lengths_of(key).to(at::kLong).contiguous();
      const std::optional<at::Tensor> given = batch.weights_of(key);
      const at::Tensor per_id = given ? given->to(at::kFloat).contiguous() : at::ones({ids.numel()}, at::kFloat);
      const int64_t bags = lengths.numel(), dim = q.dim;
      at::Tensor result = at::zeros({bags, dim}, at::kFloat);
      float* o = result.data_ptr<float>();
      const int64_t* id = ids.data_ptr<int64_t>();
      const int64_t* len = lengths.data_ptr<int64_t>();
      const float* w = per_id.data_ptr<float>();
      int64_t at = 0;
      for (int64_t b = 0; b < bags; ++b) {
        float* acc = o + b * dim;
        for (int64_t i = 0; i < len[b]; ++i, ++at) {
          const int64_t r = id[at];
          const float* v = q.values.data() + r * dim;
          if (q.type == scenario::QuantType::kFp16) {
            for (int64_t c = 0; c < dim; ++c) acc[c] = std::fma(w[at], v[c], acc[c]);
          } else {
            const float scale = q.scale[r] * w[at], bias = q.bias[r] * w[at];
            for (int64_t c = 0; c < dim; ++c) acc[c] = std::fma(scale, v[c], acc[c] + bias);
          }
        }
        if (t.pooling == dmp::PoolingType::kMean && len[b] > 0) {
          const float inverse = 1.0f / static_cast<float>(len[b]);
          for (int64_t c = 0; c < dim; ++c) acc[c] *= inverse;
        }
      }
      out[dmp::pooled_output_key(names[lookup++])] = result;
    }
  }
  return out;
}

}  // namespace dmpcheck::check
