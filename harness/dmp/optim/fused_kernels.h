// The row loops of the element-wise fused optimizers, on raw float arrays: no libtorch here, so
// this file can be compiled for vectorization (-O3 -fno-math-errno) without the precompiled
// header the rest of the library shares.  Each updates rows[i] for i in [begin, end); `g` holds
// one gradient row per entry of `rows`; tables are row-major with `dim` columns.
#pragma once

#include <cstdint>

namespace dmpcheck::dmp::kernels {

// w - lr * g
void sgd_rows(float* w, const float* g, const int64_t* rows, int64_t begin, int64_t end, int64_t dim, float lr);

// m + g * g;  w - lr * g / (sqrt(m) + eps)
void adagrad_rows(float* w, float* m, const float* g, const int64_t* rows, int64_t begin, int64_t end, int64_t dim,
                  float lr, float eps);

struct AdamScalars {
  float lr, eps, weight_decay, beta1, beta2, one_minus_beta1, one_minus_beta2, bias_correction1, bias_correction2;
};

// m1 = exp_avg * b1 + g * (1 - b1);  m2 = exp_avg_sq * b2 + g * g * (1 - b2);
// w - lr * ((m1 / c1) / (sqrt(m2 / c2) + eps) + wd * w)
void adam_rows(float* w, float* exp_avg, float* exp_avg_sq, const float* g, const int64_t* rows, int64_t begin,
               int64_t end, int64_t dim, const AdamScalars& s);

}  // namespace dmpcheck::dmp::kernels
