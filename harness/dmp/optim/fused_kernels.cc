#include "dmp/optim/fused_kernels.h"

#include <c10/util/Half.h>

#include <cmath>

// Each kernel is built for AVX-512, AVX2 and the baseline, the widest the CPU runs chosen when the
// program loads (GCC's function multiversioning, ifunc): the same loops, wider vectors.  IEEE
// add, multiply, divide and square root are correctly rounded at every width and the file is
// compiled with -ffp-contract=off, so every clone gives the same bits (the fidelity table and
// FusedOptimizer.* check it).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define DMPCHECK_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DMPCHECK_KERNEL
#endif

namespace dmpcheck::dmp::kernels {
namespace {

float to_fp16(float x) { return static_cast<float>(c10::Half(x)); }  // round to nearest even

// The rows are random (each a cache miss): ask for a row a few ahead while this one is updated.
// A prefetch reads nothing into the arithmetic, so no result changes.
constexpr int64_t kAhead = 4;
inline void prefetch_row(const float* base, const int64_t* rows, int64_t i, int64_t end, int64_t dim) {
  if (i + kAhead >= end) return;
  const char* row = reinterpret_cast<const char*>(base + rows[i + kAhead] * dim);
  for (int64_t byte = 0; byte < dim * static_cast<int64_t>(sizeof(float)); byte += 64)
    __builtin_prefetch(row + byte, 1, 0);
}

}  // namespace

// Each kernel does FBGEMM's CPU arithmetic (fbgemm-gpu-cpu 0.6.0 and 1.9.0 alike, established by
// experiment against the real kernels: every element of weights and state bitwise equal on tables
// of widths 4 to 128).  Where FBGEMM rounds once (a fused multiply-add, or double arithmetic) the
// code says so explicitly with double arithmetic, whose product of two floats is exact; the flags
// this file is compiled with never contract or reassociate on their own.

DMPCHECK_KERNEL void sgd_rows(float* w, const float* g, const int64_t* rows, int64_t begin, int64_t end, int64_t dim,
                              float lr) {
  for (int64_t i = begin; i < end; ++i) {
    prefetch_row(w, rows, i, end, dim);
    float* wr = w + rows[i] * dim;
    const float* gr = g + i * dim;
    // One rounding: w - lr * g in double (FBGEMM: a fused multiply-add).
    for (int64_t j = 0; j < dim; ++j)
      wr[j] = static_cast<float>(static_cast<double>(wr[j]) - static_cast<double>(lr) * gr[j]);
  }
}

namespace {

// m + g*g rounded once; then lr*g as a float product, and the step in double, rounded once:
// fp32 tables subtract it in double (one rounding), fp16 tables add it rounded to fp16 and
// round the sum to fp16.
template <bool kFp16>
inline __attribute__((always_inline)) void adagrad_rows_as(float* w, float* m, const float* g, const int64_t* rows,
                                                           int64_t begin, int64_t end, int64_t dim, float lr,
                                                           float eps) {
  for (int64_t i = begin; i < end; ++i) {
    prefetch_row(w, rows, i, end, dim);
    prefetch_row(m, rows, i, end, dim);
    float* wr = w + rows[i] * dim;
    float* mr = m + rows[i] * dim;
    const float* gr = g + i * dim;
    for (int64_t j = 0; j < dim; ++j) {
      const float mj = static_cast<float>(static_cast<double>(mr[j]) + static_cast<double>(gr[j]) * gr[j]);
      mr[j] = mj;
      const double step = static_cast<double>(lr * gr[j]) / (std::sqrt(static_cast<double>(mj)) + eps);
      if constexpr (kFp16) {
        wr[j] = to_fp16(wr[j] + to_fp16(static_cast<float>(-step)));
      } else {
        wr[j] = static_cast<float>(static_cast<double>(wr[j]) - step);
      }
    }
  }
}

}  // namespace

DMPCHECK_KERNEL void adagrad_rows(float* w, float* m, const float* g, const int64_t* rows, int64_t begin, int64_t end,
                                  int64_t dim, float lr, float eps) {
  adagrad_rows_as<false>(w, m, g, rows, begin, end, dim, lr, eps);
}

DMPCHECK_KERNEL void adagrad_rows_fp16(float* w, float* m, const float* g, const int64_t* rows, int64_t begin,
                                       int64_t end, int64_t dim, float lr, float eps) {
  adagrad_rows_as<true>(w, m, g, rows, begin, end, dim, lr, eps);
}

DMPCHECK_KERNEL void rowwise_adagrad_rows(float* w, float* m, const float* g, const int64_t* rows, int64_t begin,
                                          int64_t end, int64_t dim, const float* row_mean_square, float lr, float eps,
                                          float wd, int wd_mode, float decoupled_correction) {
  for (int64_t i = begin; i < end; ++i) {
    prefetch_row(w, rows, i, end, dim);
    float* wr = w + rows[i] * dim;
    const float* gr = g + i * dim;
    const float momentum = m[rows[i]] + row_mean_square[i];
    m[rows[i]] = momentum;
    const float multiplier = lr / (std::sqrt(momentum) + eps);
    const float correction = wd_mode == 1 ? 1.0f - multiplier * wd : wd_mode == 2 ? decoupled_correction : 1.0f;
    for (int64_t j = 0; j < dim; ++j) wr[j] = wr[j] * correction - multiplier * gr[j];
  }
}

DMPCHECK_KERNEL void sgd_rows_fp16(float* w, const float* g, const int64_t* rows, int64_t begin, int64_t end,
                                   int64_t dim, float lr) {
  for (int64_t i = begin; i < end; ++i) {
    float* wr = w + rows[i] * dim;
    const float* gr = g + i * dim;
    for (int64_t j = 0; j < dim; ++j) wr[j] = to_fp16(wr[j] + to_fp16(-(lr * gr[j])));
  }
}

float sequential_mean_square(const float* g, int64_t dim) {
  float sum = 0;
  for (int64_t j = 0; j < dim; ++j) sum = sum + g[j] * g[j];
  return sum / static_cast<float>(dim);
}

float fbgemm_mean_square(const float* g, int64_t dim) {
  // Squares into eight lanes (element j into lane j % 8), a trailing group of four into lanes
  // 0-3, then the lanes summed pairwise: ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)); then / D.
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= dim; j += 8) {
    for (int k = 0; k < 8; ++k) {
      const float square = g[j + k] * g[j + k];
      lane[k] = lane[k] + square;
    }
  }
  for (int k = 0; j + k < dim; ++k) {
    const float square = g[j + k] * g[j + k];
    lane[k] = lane[k] + square;
  }
  const float total = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  return total / static_cast<float>(dim);
}

DMPCHECK_KERNEL void adam_rows(float* w, float* exp_avg, float* exp_avg_sq, const float* g, const int64_t* rows,
                               int64_t begin, int64_t end, int64_t dim, const AdamScalars& s) {
  for (int64_t i = begin; i < end; ++i) {
    prefetch_row(w, rows, i, end, dim);
    prefetch_row(exp_avg, rows, i, end, dim);
    prefetch_row(exp_avg_sq, rows, i, end, dim);
    float* wr = w + rows[i] * dim;
    float* ar = exp_avg + rows[i] * dim;
    float* sr = exp_avg_sq + rows[i] * dim;
    const float* gr = g + i * dim;
    for (int64_t j = 0; j < dim; ++j) {
      const float m1 = ar[j] * s.beta1 + gr[j] * s.one_minus_beta1;
      const float m2 = sr[j] * s.beta2 + (gr[j] * gr[j]) * s.one_minus_beta2;
      ar[j] = m1;
      sr[j] = m2;
      const float update =
          (m1 / s.bias_correction1) / (std::sqrt(m2 / s.bias_correction2) + s.eps) + s.weight_decay * wr[j];
      wr[j] = wr[j] - s.lr * update;
    }
  }
}

}  // namespace dmpcheck::dmp::kernels
