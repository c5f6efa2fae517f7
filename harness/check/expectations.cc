#include "check/expectations.h"

#include <algorithm>
#include <map>
#include <set>

#include "check/hook_values.h"
#include "check/script_checks.h"
#include "dmp/embedding_config.h"

namespace dmpcheck::check {
namespace {

std::string describe_difference(const TensorCheck& c) {
  return fmt::format("{} differs at {} on rank(s) {} vs rank 0: max |diff| {:.3g}, {} of {} elements", c.name,
                     scenario::phase_name(c.phase), fmt::join(c.differing_ranks, ","), c.max_abs_diff,
                     c.elements_differing, c.numel);
}

// The words of one tolerance comparison's failures (the unsharded model's, the resumed run's).
struct ToleranceWords {
  std::string not_run;              // the comparison did not run
  std::string subject;              // after a tensor's name: whose tensor it is ("" or " of the resumed run")
  std::string other;                // what it is compared with
  std::string expected_difference;  // `match: false` met by every tensor within tolerance
  bool bounded = false;             // each element has its own bound (the check's note says which)
};

// `match: false` met by tensors only one side holds (no value differs): said in the expectation's
// description, which the verdict line shows, so that "differs" is never read as a difference of
// values (issue 46, item 10).
std::string met_by_one_side(const std::string& what, const std::vector<std::string>& apart) {
  return fmt::format("; {} met only by tensor(s) one side holds, no value differing: {}", what, fmt::join(apart, "; "));
}

// Per-tensor checks against a tolerance: with `match`, every tensor out of it is a failure;
// without, every tensor within it is one.
void judge_tolerance(ExpectationResult& out, const scenario::Tolerance& tol, bool compared,
                     const std::vector<GlobalModelCheck>& checks, const ToleranceWords& words) {
  auto& failures = out.failures;
  if (!compared) {
    failures.push_back(words.not_run);
  } else if (tol.match) {
    for (const auto& g : checks) {
      if (g.within_tolerance) continue;
      if (!g.comparable) {
        failures.push_back(fmt::format("{} cannot be compared with {}: {}", g.name, words.other, g.note));
      } else if (words.bounded) {
        failures.push_back(fmt::format("{}{} differs from {} at step {} beyond its bound: max |diff| {:.3g} ({})",
                                       g.name, words.subject, words.other, g.step, g.max_abs_diff, g.note));
      } else {
        failures.push_back(
            g.note.empty() ? fmt::format("{}{} differs from {} at step {}: max |diff| {:.3g} exceeds rtol {} / atol {}",
                                         g.name, words.subject, words.other, g.step, g.max_abs_diff, tol.rtol, tol.atol)
                           : fmt::format("{}{} differs from {} at step {}: {}", g.name, words.subject, words.other,
                                         g.step, g.note));
      }
    }
  } else if (std::none_of(checks.begin(), checks.end(),
                          [](const GlobalModelCheck& g) { return !g.one_sided && !g.within_tolerance; })) {
    std::vector<std::string> apart;
    for (const auto& g : checks) {
      if (g.one_sided) apart.push_back(fmt::format("{} ({})", g.name, g.note));
    }
    if (!apart.empty()) {
      out.description += met_by_one_side(words.expected_difference, apart);
    } else {
      failures.push_back(words.bounded
                             ? fmt::format("{}, but every tensor is within its bound", words.expected_difference)
                             : fmt::format("{}, but every tensor is within rtol {} / atol {}",
                                           words.expected_difference, tol.rtol, tol.atol));
    }
  }
}

}  // namespace

ExpectationResult evaluate_expectation(const scenario::Expectation& expect, const RunResult& result) {
  ExpectationResult out;
  out.description = expect.describe();

  std::set<std::string> expected_diverged;
  std::set<std::string> checked;
  for (const auto& c : result.replicas) checked.insert(c.name);
  const bool script = !result.script_ranks.empty();
  for (const auto& name : expect.diverged) {
    if (!script) {
      expected_diverged.insert(name.find('.') == std::string::npos ? dmp::table_weight_key(name) : name);
      continue;
    }
    // A script's tensors are named by its own modules: a name stands for every tensor it ends.
    const size_t before = expected_diverged.size();
    for (const auto& tensor : checked) {
      if (names_tensor(name, tensor)) expected_diverged.insert(tensor);
    }
    if (expected_diverged.size() == before) {
      out.failures.push_back(fmt::format("{} was expected to diverge, but no audited tensor has that name{}", name,
                                         checked.empty() ? " (the audit recorded none)" : ""));
    }
  }
  for (const auto& name : script ? std::set<std::string>() : expected_diverged) {
    if (!checked.count(name)) {
      out.failures.push_back(fmt::format(
          "{} was expected to diverge, but no replicated tensor has that name (is its table data_parallel?)", name));
    }
  }
  for (const auto& c : result.replicas) {
    const bool phase_expects_divergence = std::find(expect.at.begin(), expect.at.end(), c.phase) != expect.at.end();
    const bool may_diverge =
        expect.replicas == scenario::ReplicaExpectation::kDiverge && expected_diverged.count(c.name);
    const bool should_diverge = may_diverge && phase_expects_divergence;
    if (should_diverge && c.equal) {
      out.failures.push_back(fmt::format("{} was expected to diverge at {} but is equal on every rank", c.name,
                                         scenario::phase_name(c.phase)));
    } else if (!c.equal && !may_diverge) {
      out.failures.push_back(describe_difference(c) + " (expected equal)");
    }
  }
  if (script) judge_script(expect.script, result, out.failures);
  if (!expect.observed.empty())
    judge_observed(expect.observed, result.observed, result.environment.world_size, out.failures);
  if (expect.global_model) {
    judge_tolerance(out, *expect.global_model, result.global_model_checked, result.global_model,
                    {"the unsharded-model comparison did not run", "", "the unsharded model",
                     "expected to differ from the unsharded model"});
  }
  if (expect.resumed) {
    judge_tolerance(out, *expect.resumed, result.resumed_compared, result.resumed,
                    {"the resumed run was not compared with the uninterrupted one", " of the resumed run",
                     "the uninterrupted run", "expected the resumed run to differ from the uninterrupted one"});
  }
  if (expect.quantized) {
    judge_tolerance(
        out, *expect.quantized, result.quantized_compared, result.quantized,
        {"the quantized model was not compared with the float one", " of the quantized model", "the float model",
         "expected the quantized model to differ from the float one beyond its bound", true});
  }
  if (expect.quantized_sharded) {
    judge_tolerance(out, *expect.quantized_sharded, result.quantized_sharded_compared, result.quantized_sharded,
                    {"the quantized model sharded for inference was not compared with the unsharded one",
                     " of the quantized model sharded for inference", "the unsharded quantized model",
                     "expected the sharded quantized model to differ from the unsharded one"});
  }
  for (const auto& l : result.loops) {
    // Every epoch's (or eval pass's) count of batches against the one expected of each.
    auto each_epoch = [&](const std::vector<int64_t>& batches, const std::optional<int64_t>& expected,
                          const char* where) {
      for (size_t e = 0; expected && e < batches.size(); ++e) {
        if (batches[e] != *expected) {
          out.failures.push_back(fmt::format("rank {} executed {} batch(es) in {} {}, expected {}", l.rank, batches[e],
                                             where, e + 1, *expected));
        }
      }
    };
    each_epoch(l.batches, expect.loop_batches, "epoch");
    if (!expect.loop_batches_per_epoch.empty() && l.batches != expect.loop_batches_per_epoch) {
      out.failures.push_back(fmt::format("rank {} executed [{}] batch(es) in its epochs, expected [{}]", l.rank,
                                         fmt::join(l.batches, ", "), fmt::join(expect.loop_batches_per_epoch, ", ")));
    }
    each_epoch(l.eval_batches, expect.loop_eval_batches, "the eval pass after epoch");
    if (expect.loop_eval_batches && l.eval_batches.empty())
      out.failures.push_back(fmt::format("rank {} ran no eval pass", l.rank));
    if (expect.next_after_exhausted && l.next_after_exhausted != *expect.next_after_exhausted) {
      out.failures.push_back(
          fmt::format("rank {} asked its exhausted data iterator for a batch {} time(s), expected {}", l.rank,
                      l.next_after_exhausted, *expect.next_after_exhausted));
    }
  }
  if ((expect.loop_batches || !expect.loop_batches_per_epoch.empty() || expect.next_after_exhausted ||
       expect.loop_eval_batches) &&
      result.loops.empty()) {
    out.failures.push_back("no rank reported its training loop");
  }
  if (expect.initial_state) {
    if (!result.init_from_compared) {
      out.failures.push_back("the initial state was not compared with init.from");
    } else if (*expect.initial_state) {
      for (const auto& d : result.init_from) {
        if (d.within_tolerance) continue;
        out.failures.push_back(
            d.note.empty()
                ? fmt::format("{} is not init.from's before any step: {} of {} elements differ, max |diff| {:.3g}",
                              d.name, d.elements_differing, d.numel, d.max_abs_diff)
                : fmt::format("{}: {}", d.name, d.note));
      }
    } else if (std::all_of(result.init_from.begin(), result.init_from.end(),
                           [](const ReferenceDiff& d) { return d.within_tolerance; })) {
      out.failures.push_back(
          fmt::format("expected the initial state to differ from init.from, but all {} tensors are init.from's",
                      result.init_from.size()));
    }
  }
  if (expect.reference) {
    if (!result.reference_compared) {
      out.failures.push_back("the side-by-side comparison with the reference did not run");
    } else if (!expect.reference->match) {
      // `match: false`: the release is expected to leave the reference (a behaviour it does not share).
      if (std::none_of(result.reference.begin(), result.reference.end(),
                       [](const ReferenceDiff& d) { return !d.one_sided && !d.within_tolerance; })) {
        std::vector<std::string> apart;
        for (const auto& d : result.reference) {  // one entry per tensor, not per step
          const std::string item = fmt::format("{} ({})", d.name, d.note);
          if (d.one_sided && std::find(apart.begin(), apart.end(), item) == apart.end()) apart.push_back(item);
        }
        if (!apart.empty()) {
          out.description += met_by_one_side("expected to differ from the reference", apart);
        } else {
          out.failures.push_back(
              fmt::format("expected to differ from the reference, but every tensor is within rtol {} / atol {} "
                          "at every step",
                          expect.reference->rtol, expect.reference->atol));
        }
      }
    } else {
      // One line per tensor: where it first leaves the tolerance, and its worst step.
      std::vector<std::string> order;
      std::map<std::string, std::pair<const ReferenceDiff*, const ReferenceDiff*>> broken;  // first, worst
      for (const auto& d : result.reference) {
        if (d.within_tolerance) continue;
        auto [it, inserted] = broken.try_emplace(d.name, &d, &d);
        if (inserted) order.push_back(d.name);
        if (d.max_abs_diff > it->second.second->max_abs_diff) it->second.second = &d;
      }
      for (const auto& name : order) {
        const auto [first, worst] = broken.at(name);
        out.failures.push_back(first->note.empty()
                                   ? fmt::format("{} leaves the tolerance (rtol {} / atol {}) at step {}; worst at "
                                                 "step {}: max |diff| {:.3g} (rel {:.3g})",
                                                 name, expect.reference->rtol, expect.reference->atol, first->step,
                                                 worst->step, worst->max_abs_diff, worst->max_rel_diff)
                                   : fmt::format("{} from step {}: {}", name, first->step, first->note));
      }
    }
  }
  if (expect.max_broadcast_seconds && !result.init_broadcast.performed) {
    // A bound on a broadcast that never ran would hold whatever the code does.
    out.failures.push_back(fmt::format("max_broadcast_seconds bounds the init broadcast, but none ran (the profile "
                                       "does not broadcast, or nothing is replicated)"));
  } else if (expect.max_broadcast_seconds && result.init_broadcast.seconds > *expect.max_broadcast_seconds) {
    out.failures.push_back(fmt::format("the init broadcast took {:.4f} s, over the bound of {} s",
                                       result.init_broadcast.seconds, *expect.max_broadcast_seconds));
  }
  if (expect.error) {
    // A cell of `steps: 0` runs no training step: an error of the forward, the backward or the
    // optimizer cannot fire there (only the plan's, the wrap's, or a forward a comparison asks for).
    out.failures.push_back(fmt::format(
        "expected the run to fail with {}, but it completed{}", expect.error->describe(),
        !script && result.losses.empty()
            ? " (it trained no step: with `steps: 0` only the plan, the wrap and the forwards a comparison asks "
              "for run, so an error of a training step cannot fire; give `steps: 1` or more)"
            : ""));
  }
  out.held = out.failures.empty();
  return out;
}

}  // namespace dmpcheck::check
