#include "check/replica_check.h"

#include <ATen/ATen.h>

#include "comm/broadcast_bytes.h"
#include "comm/communicator.h"
#include "common/error.h"

namespace dmpcheck::check {
namespace {

// Bitwise inequality: floats are compared as integers of the same width, so -0.0 != 0.0 and a
// NaN equals only the same NaN.
at::Tensor bits_differ(const at::Tensor& a, const at::Tensor& b) {
  switch (a.scalar_type()) {
    case at::kFloat: return a.view(at::kInt).ne(b.view(at::kInt));
    case at::kDouble: return a.view(at::kLong).ne(b.view(at::kLong));
    default: return a.ne(b);
  }
}

}  // namespace

TensorCheck compare_copies(const std::string& name, const std::string& sharding, scenario::Phase phase,
                           const std::vector<at::Tensor>& copies) {
  const at::Tensor& reference = copies.front();
  TensorCheck check{name, sharding, phase, true, 0.0, 0, reference.numel(), {}};
  at::Tensor any_differs = at::zeros(reference.sizes(), at::kBool);
  for (size_t r = 1; r < copies.size(); ++r) {
    const at::Tensor differs = bits_differ(reference, copies[r]);
    if (!differs.any().item<bool>()) continue;
    check.equal = false;
    check.differing_ranks.push_back(static_cast<int>(r));
    any_differs.logical_or_(differs);
    const at::Tensor diff = (copies[r].to(at::kDouble) - reference.to(at::kDouble)).abs();
    // NaN against a number counts as an infinite difference.
    const double d = diff.nan_to_num(std::numeric_limits<double>::infinity()).max().item<double>();
    check.max_abs_diff = std::max(check.max_abs_diff, d);
  }
  check.elements_differing = any_differs.sum().item<int64_t>();
  return check;
}

std::vector<TensorCheck> check_replicas(comm::Communicator& comm, const std::vector<dmp::StateTensor>& tensors,
                                        scenario::Phase phase) {
  // First agree on what is compared: the same names, shapes and dtypes on every rank.
  std::string signature;
  for (const auto& t : tensors) {
    signature += fmt::format("{} {} {}\n", t.name, fmt::join(t.tensor.sizes(), "x"),
                             std::string(c10::toString(t.tensor.scalar_type())));
  }
  const int differs = comm::first_rank_disagreeing(comm, signature);
  DMP_CHECK(differs < 0, ErrorKind::kInternal,
            "rank {} and rank 0 hold different sets of replicated tensors at {}; rank {} holds:\n{}", differs,
            scenario::phase_name(phase), comm.rank(), signature);
  std::vector<TensorCheck> checks;
  for (const auto& t : tensors) {
    checks.push_back(compare_copies(t.name, t.sharding, phase, comm.all_gather(t.tensor.detach().contiguous())));
  }
  return checks;
}

StepDivergence step_divergence(int step, const std::vector<TensorCheck>& checks) {
  StepDivergence d{step, 0, 0.0};
  for (const auto& c : checks) {
    d.tensors_differing += c.equal ? 0 : 1;
    d.max_abs_diff = std::max(d.max_abs_diff, c.max_abs_diff);
  }
  return d;
}

}  // namespace dmpcheck::check
