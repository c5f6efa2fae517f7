#include "check/global_model.h"

#include <cmath>

#include <algorithm>

#include <ATen/ATen.h>

#include "check/unsharded_model.h"

namespace dmpcheck::check {

// Compares one tensor: max |a - b|, and whether |a - b| <= atol + rtol * |b| everywhere.
static GlobalModelCheck compare_tensor(const std::string& name, const at::Tensor& actual, const at::Tensor& expected,
                                       Tolerances tolerances, int step,
                                       const std::string& expected_label = "the unsharded model") {
  GlobalModelCheck check;
  check.name = name;
  check.step = step;
  check.numel = actual.numel();
  if (actual.sizes() != expected.sizes()) {
    check.comparable = false;
    check.within_tolerance = false;
    check.note = fmt::format("shape [{}] against {}'s [{}]", fmt::join(actual.sizes(), ", "), expected_label,
                             fmt::join(expected.sizes(), ", "));
    return check;
  }
  if (actual.numel() == 0) return check;
  if (!at::isFloatingType(actual.scalar_type()) || !at::isFloatingType(expected.scalar_type())) {
    // Integer state (a managed-collision module's ids and counters) is held exactly, whatever the
    // tolerances: an id one off is another row.
    const at::Tensor a = actual.to(at::kLong);
    const at::Tensor b = expected.detach().to(at::kLong);
    const int64_t count = a.ne(b).sum().item<int64_t>();
    // The difference in int64 (ids beyond 2^53 stay apart), then as a double for the report.
    check.max_abs_diff = count == 0 ? 0.0 : static_cast<double>((a - b).abs().max().item<int64_t>());
    check.max_allowed_excess = check.max_abs_diff;  // any difference is beyond the tolerance
    check.within_tolerance = count == 0;
    if (count > 0) check.note = fmt::format("{} of {} integers differ (held exactly)", count, actual.numel());
    return check;
  }
  const at::Tensor a = actual.to(at::kDouble);
  const at::Tensor b = expected.detach().to(at::kDouble);
  const at::Tensor diff = (a - b).abs();
  check.max_abs_diff = diff.max().item<double>();
  check.max_allowed_excess = (diff - (tolerances.atol + tolerances.rtol * b.abs())).max().item<double>();
  check.within_tolerance = !(check.max_allowed_excess > 0.0) && !std::isnan(check.max_abs_diff);
  if (std::isnan(check.max_abs_diff)) {  // said, not shown as a difference of "nan"
    const auto non_finite = [](const at::Tensor& t) { return t.numel() - at::isfinite(t).sum().item<int64_t>(); };
    check.note = fmt::format("NaN or Inf in {} of {} value(s) here, in {} of {}'s", non_finite(a), a.numel(),
                             non_finite(b), expected_label);
  }
  return check;
}

GlobalModelTracker::GlobalModelTracker(const dmp::ModelConfig& model, const dmp::DmpOptions& options,
                                       const std::map<std::string, at::Tensor>& initial_state, int64_t steps_done,
                                       Tolerances tolerances, Tolerances output_tolerances)
    : reference_(std::make_unique<UnshardedModel>(
          model, options.sparse_optimizer,
          [&options] {
            // The unsharded model trains as the user's would on the same release (its arithmetic).
            dmp::DenseOptimizerConfig dense = options.dense_optimizer;
            dense.rowwise_mean_gradient = options.profile.dense_rowwise_adagrad_mean_gradient;
            return dense;
          }(),
          initial_state, steps_done)),
      tolerances_(tolerances),
      output_tolerances_(output_tolerances) {}

GlobalModelTracker::~GlobalModelTracker() = default;

void GlobalModelTracker::step_and_compare(const dmp::KeyedJaggedTensor& global_batch,
                                          const std::map<std::string, at::Tensor>& sharded_state,
                                          const std::map<std::string, at::Tensor>& sharded_outputs, int step) {
  reference_->train_step(global_batch);
  compare_with_unsharded(results_, sharded_outputs, reference_->last_outputs(), step - 1, output_tolerances_);
  compare_with_unsharded(results_, sharded_state, reference_->state(), step, tolerances_);
}

void GlobalModelTracker::forward_and_compare(const dmp::KeyedJaggedTensor& global_batch,
                                             const std::map<std::string, at::Tensor>& sharded_outputs, int step) {
  compare_with_unsharded(results_, sharded_outputs, reference_->forward(global_batch), step, output_tolerances_);
}

void compare_with_unsharded(std::vector<GlobalModelCheck>& results, const std::map<std::string, at::Tensor>& sharded,
                            const std::map<std::string, at::Tensor>& expected, int step, Tolerances tolerances,
                            const std::string& expected_label) {
  for (const auto& [name, actual] : sharded) {
    auto it = expected.find(name);
    GlobalModelCheck check = it == expected.end()
                                 ? GlobalModelCheck{}
                                 : compare_tensor(name, actual, it->second, tolerances, step, expected_label);
    if (it == expected.end()) {
      check.name = name;
      check.step = step;
      check.comparable = false;
      check.one_sided = true;
      check.within_tolerance = false;
      check.note = expected_label + " has no such tensor";
    }
    const std::string& key = name;  // structured bindings cannot be captured in C++17 (clang)
    auto existing =
        std::find_if(results.begin(), results.end(), [&](const GlobalModelCheck& c) { return c.name == key; });
    if (existing == results.end()) {
      results.push_back(check);
    } else if (!check.comparable || (existing->comparable && check.max_allowed_excess > existing->max_allowed_excess)) {
      *existing = check;
    }
  }
}

void compare_within_bound(std::vector<GlobalModelCheck>& results, const std::map<std::string, at::Tensor>& actual,
                          const std::map<std::string, at::Tensor>& expected,
                          const std::map<std::string, at::Tensor>& bound, int step, const std::string& expected_label) {
  for (const auto& [name, a] : actual) {
    GlobalModelCheck check;
    check.name = name;
    check.step = step;
    check.numel = a.numel();
    const auto e = expected.find(name);
    const auto b = bound.find(name);
    if (e == expected.end() || b == bound.end()) {
      check.comparable = check.within_tolerance = false;
      check.one_sided = true;
      check.note = e == expected.end() ? expected_label + " has no such tensor" : "no bound was given for it";
    } else if (a.sizes() != e->second.sizes() || a.sizes() != b->second.sizes()) {
      check.comparable = check.within_tolerance = false;
      check.note = fmt::format("shape [{}] against {}'s [{}] (bound [{}])", fmt::join(a.sizes(), ", "), expected_label,
                               fmt::join(e->second.sizes(), ", "), fmt::join(b->second.sizes(), ", "));
    } else if (a.numel() > 0) {
      const at::Tensor diff = (a.to(at::kDouble) - e->second.to(at::kDouble)).abs();
      const at::Tensor allowed = b->second.to(at::kDouble);
      check.max_abs_diff = diff.max().item<double>();
      check.max_allowed_excess = (diff - allowed).max().item<double>();
      check.within_tolerance = !(check.max_allowed_excess > 0.0) && !std::isnan(check.max_abs_diff);
      const at::Tensor positive = allowed.gt(0);
      const double ratio = positive.any().item<bool>()
                               ? (diff.masked_select(positive) / allowed.masked_select(positive)).max().item<double>()
                               : 0.0;
      check.note = fmt::format("worst |diff| / bound {:.3g}, bound up to {:.3g}", ratio, allowed.max().item<double>());
    }
    results.push_back(check);
  }
}

std::vector<GlobalModelCheck> GlobalModelTracker::results() const { return results_; }

ReferenceDiff diff_tensor(const std::string& name, const at::Tensor& actual, const at::Tensor& expected, int step,
                          double rtol, double atol, const std::string& actual_label,
                          const std::string& expected_label) {
  ReferenceDiff d{name, step, 0.0, 0.0, 0, actual.numel(), true, {}};
  if (actual.sizes() != expected.sizes()) {
    d.within_tolerance = false;
    d.note = fmt::format("shapes differ: {} [{}], {} [{}]", actual_label, fmt::join(actual.sizes(), ", "),
                         expected_label, fmt::join(expected.sizes(), ", "));
    return d;
  }
  const at::Tensor a = actual.to(at::kFloat), b = expected.to(at::kFloat);
  const at::Tensor diff = (a - b).abs();
  d.max_abs_diff = diff.numel() ? diff.max().item<double>() : 0.0;
  d.elements_differing = a.ne(b).sum().item<int64_t>();
  const at::Tensor nonzero = b.ne(0);
  d.max_rel_diff = nonzero.any().item<bool>()
                       ? (diff.masked_select(nonzero) / b.abs().masked_select(nonzero)).max().item<double>()
                       : 0.0;
  d.within_tolerance = diff.le(atol + rtol * b.abs()).all().item<bool>();
  return d;
}

ReferenceDiff absent_tensor(const std::string& name, int step, int64_t numel, const std::string& note) {
  return {name, step, 0.0, 0.0, 0, numel, false, note, true};
}

std::vector<ReferenceDiff> compare_with_checkpoint(const std::map<std::string, at::Tensor>& state,
                                                   const std::map<std::string, at::Tensor>& checkpoint) {
  std::vector<ReferenceDiff> out;
  for (const auto& [name, want] : checkpoint) {
    auto it = state.find(name);
    out.push_back(it != state.end() ? diff_tensor(name, it->second, want, 0, 0.0, 0.0, "the model", "init.from")
                                    : absent_tensor(name, 0, want.numel(), "the model holds no tensor of that name"));
  }
  return out;
}

}  // namespace dmpcheck::check
