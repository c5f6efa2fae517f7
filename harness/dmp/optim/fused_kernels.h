// The row loops of the element-wise fused optimizers, on raw float arrays: no libtorch here, so
// this file can be compiled for vectorization (-O3 -fno-math-errno) without the precompiled
// header the rest of the library shares.  Each updates rows[i] for i in [begin, end); `g` holds
// one gradient row per entry of `rows`; tables are row-major with `dim` columns.
#pragma once

#include <cstdint>

namespace dmpcheck::dmp::kernels {

// w - lr * g, rounded once
void sgd_rows(float* w, const float* g, const int64_t* rows, int64_t begin, int64_t end, int64_t dim, float lr);

// m + g * g (rounded once);  w - float(lr * g) / (sqrt(m) + eps) in double, rounded once
void adagrad_rows(float* w, float* m, const float* g, const int64_t* rows, int64_t begin, int64_t end, int64_t dim,
                  float lr, float eps);

// Row-wise Adagrad (FBGEMM's exact_rowwise_adagrad), one pass per row, given each row's mean
// square gradient (row_mean_square[i], of the L2-decayed gradient in L2 mode):
//   m = m + mean_square;  mult = lr / (sqrtf(m) + eps)                     (all float)
//   corr = 1 (none) | 1 - mult * wd (L2) | decoupled_correction = float(1 - lr * wd in double)
//   w_j = w_j * corr - mult * g_j
// The mean square comes from fbgemm_mean_square (the order of FBGEMM's vectorised CPU kernel,
// not a sequential sum nor ATen's).
// wd_mode: 0 none, 1 L2, 2 decoupled.
void rowwise_adagrad_rows(float* w, float* m, const float* g, const int64_t* rows, int64_t begin, int64_t end,
                          int64_t dim, const float* row_mean_square, float lr, float eps, float wd, int wd_mode,
                          float decoupled_correction);

// The mean of a row's squared gradient in FBGEMM's order: eight float lanes summed pairwise,
// then divided (not multiplied by 1/D) by the width.
float fbgemm_mean_square(const float* g, int64_t dim);

// fp16 tables (values an fp16 holds, in fp32): FBGEMM's CPU arithmetic for them.
void sgd_rows_fp16(float* w, const float* g, const int64_t* rows, int64_t begin, int64_t end, int64_t dim, float lr);
void adagrad_rows_fp16(float* w, float* m, const float* g, const int64_t* rows, int64_t begin, int64_t end, int64_t dim,
                       float lr, float eps);
float sequential_mean_square(const float* g, int64_t dim);

struct AdamScalars {
  float lr, eps, weight_decay, beta1, beta2, one_minus_beta1, one_minus_beta2, bias_correction1, bias_correction2;
};

// m1 = exp_avg * b1 + g * (1 - b1);  m2 = exp_avg_sq * b2 + g * g * (1 - b2);
// w - lr * ((m1 / c1) / (sqrt(m2 / c2) + eps) + wd * w)
void adam_rows(float* w, float* exp_avg, float* exp_avg_sq, const float* g, const int64_t* rows, int64_t begin,
               int64_t end, int64_t dim, const AdamScalars& s);

}  // namespace dmpcheck::dmp::kernels
