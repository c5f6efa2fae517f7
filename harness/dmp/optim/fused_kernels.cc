#include "dmp/optim/fused_kernels.h"

#include <cmath>

namespace dmpcheck::dmp::kernels {

// Every expression keeps the float operations, and their order, of the tensor code it replaced
// (see fused_optimizer.cc), so results are the same bits; the flags this file is compiled with
// vectorize without reassociating or fusing.

void sgd_rows(float* w, const float* g, const int64_t* rows, int64_t begin, int64_t end, int64_t dim, float lr) {
  for (int64_t i = begin; i < end; ++i) {
    float* wr = w + rows[i] * dim;
    const float* gr = g + i * dim;
    for (int64_t j = 0; j < dim; ++j) wr[j] = wr[j] - lr * gr[j];
  }
}

void adagrad_rows(float* w, float* m, const float* g, const int64_t* rows, int64_t begin, int64_t end, int64_t dim,
                  float lr, float eps) {
  for (int64_t i = begin; i < end; ++i) {
    float* wr = w + rows[i] * dim;
    float* mr = m + rows[i] * dim;
    const float* gr = g + i * dim;
    for (int64_t j = 0; j < dim; ++j) {
      const float mj = mr[j] + gr[j] * gr[j];
      mr[j] = mj;
      wr[j] = wr[j] - (lr * gr[j]) / (std::sqrt(mj) + eps);
    }
  }
}

void rowwise_adagrad_rows(float* w, float* m, const float* g, const int64_t* rows, int64_t begin, int64_t end,
                          int64_t dim, const float* row_mean_square, float lr, float eps, float wd, int wd_mode,
                          float decoupled_correction) {
  for (int64_t i = begin; i < end; ++i) {
    float* wr = w + rows[i] * dim;
    const float* gr = g + i * dim;
    const float momentum = m[rows[i]] + row_mean_square[i];
    m[rows[i]] = momentum;
    const float multiplier = lr / (std::sqrt(momentum) + eps);
    const float correction = wd_mode == 1 ? 1.0f - multiplier * wd : wd_mode == 2 ? decoupled_correction : 1.0f;
    for (int64_t j = 0; j < dim; ++j) wr[j] = wr[j] * correction - multiplier * gr[j];
  }
}

void adam_rows(float* w, float* exp_avg, float* exp_avg_sq, const float* g, const int64_t* rows, int64_t begin,
               int64_t end, int64_t dim, const AdamScalars& s) {
  for (int64_t i = begin; i < end; ++i) {
    float* wr = w + rows[i] * dim;
    float* ar = exp_avg + rows[i] * dim;
    float* sr = exp_avg_sq + rows[i] * dim;
    const float* gr = g + i * dim;
    for (int64_t j = 0; j < dim; ++j) {
      const float m1 = ar[j] * s.beta1 + gr[j] * s.one_minus_beta1;
      const float m2 = sr[j] * s.beta2 + (gr[j] * gr[j]) * s.one_minus_beta2;
      ar[j] = m1;
      sr[j] = m2;
      const float update = (m1 / s.bias_correction1) / (std::sqrt(m2 / s.bias_correction2) + s.eps) + s.weight_decay * wr[j];
      wr[j] = wr[j] - s.lr * update;
    }
  }
}

}  // namespace dmpcheck::dmp::kernels
