// The reference's quantized lookup: a trained table quantized for inference as TorchRec does it
// (FBGEMM's FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf, row by row: the bias is the row's
// minimum rounded to fp16, the scale (max - bias) / (2^bits - 1) rounded to fp16, each element
// lrintf((x - bias) / scale) clamped to the bits; fp16 tables: each element rounded to fp16),
// then pooled as FBGEMM's CPU inference kernels pool it (EmbeddingSpMDM: per id, scale and bias
// times the id's weight, out = fma(scale, q, out + bias); fp16: out = fma(weight, x, out); mean:
// out * (1 / length) at the end).  Written from FBGEMM's reference kernels' arithmetic, sharing
// nothing with the release it is compared with.
#pragma once

#include <map>
#include <string>

#include <ATen/core/Tensor.h>

#include "dmp/keyed_jagged_tensor.h"
#include "scenario/scenario.h"

namespace dmpcheck::check {

// Each table of `run` quantized as run.quant says, from `weights` (full float tables, named
// dmp::table_weight_key), and looked up on `batch` (a plain one, not a variable batch per
// feature): every pooled lookup's embedding, named dmp::pooled_output_key(embedding name), and
// every sequence lookup's row per id ("sequence_embeddings.<key>", [ids, dim], the key the
// feature, or "<feature>@<table>" where several sequence tables read it, as TorchRec names it),
// each row as the kernel dequantizes a bag of one id: fma(scale, level, bias).
std::map<std::string, at::Tensor> quantized_pooled(const scenario::RunSpec& run,
                                                   const std::map<std::string, at::Tensor>& weights,
                                                   const dmp::KeyedJaggedTensor& batch);

}  // namespace dmpcheck::check
