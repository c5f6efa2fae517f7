#include "report/console.h"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "check/broadcast_probe.h"
#include "check/hook_values.h"

namespace dmpcheck::report {

std::string system_label(const check::RunResult& r) {
  if (!r.system.simulated) {
    return fmt::format("real torchrec {} (torch {}, fbgemm-gpu-cpu {})", r.system.torchrec, r.system.torch,
                       r.system.fbgemm_gpu);
  }
  return fmt::format("reference, profile {} (simulated)", r.profile);
}

namespace {

// One comparison's line: how many tensors are within tolerance (of `other`, where named), and the
// worst: the one furthest out of it, or where all are within it and `other` is named, the largest
// difference (the unsharded model's line, naming none, always gives the one furthest out).
std::string comparison_line(const std::string& what, const std::vector<check::GlobalModelCheck>& checks,
                            const std::string& other) {
  int ok = 0;
  for (const auto& g : checks) ok += g.within_tolerance ? 1 : 0;
  const bool by_abs = !other.empty() && ok == static_cast<int>(checks.size());
  const check::GlobalModelCheck* worst = &checks.front();
  for (const auto& g : checks) {
    const bool worse = by_abs ? g.max_abs_diff > worst->max_abs_diff : g.max_allowed_excess > worst->max_allowed_excess;
    if (worse) worst = &g;
  }
  return fmt::format("   {}: {}/{} tensors within tolerance{}; worst {} at step {}, max |diff| {:.3g}{}\n", what, ok,
                     checks.size(), other.empty() ? "" : " of " + other, worst->name, worst->step, worst->max_abs_diff,
                     worst->note.empty() ? "" : " (" + worst->note + ")");
}

}  // namespace

std::string render_run_table(const check::RunResult& r) {
  std::string out = fmt::format("== {} [{}]  on {}  init={} world={} backend={} threads/rank={}\n", r.scenario, r.run,
                                system_label(r), r.init_mode, r.environment.world_size, r.environment.backend,
                                r.environment.threads_per_rank);
  if (r.verdict == check::Verdict::kSkipped) return out + fmt::format("   skipped: {}\n", r.skip_reason);
  if (r.failure) {
    out += r.failure->rank < 0
               ? fmt::format("   {}: {}\n", r.failure->cause, r.failure->message)
               : fmt::format("   rank {} failed ({}): {}\n", r.failure->rank, r.failure->cause, r.failure->message);
    for (const auto& line : r.failure->last_lines) out += fmt::format("   | {}\n", line);
    return out;
  }
  size_t width = 6;
  for (const auto& c : r.replicas) width = std::max(width, c.name.size());
  out += fmt::format("   {:<{}}  {:<13}  {:<5}  {:<5}  {:>10}  {:>9}  {}\n", "tensor", width, "sharding", "phase",
                     "equal", "max|diff|", "differing", "ranks");
  for (const auto& c : r.replicas) {
    // An audited tensor is known by its digest on each rank: equal or not, no difference measured.
    const bool digest = c.sharding == "audited";
    out += fmt::format(
        "   {:<{}}  {:<13}  {:<5}  {:<5}  {:>10}  {:>9}  {}\n", c.name, width, c.sharding,
        scenario::phase_name(c.phase), c.equal ? "yes" : "NO", digest ? "-" : fmt::format("{:.3g}", c.max_abs_diff),
        digest ? std::string("-") : std::to_string(c.elements_differing),
        c.differing_ranks.empty() ? std::string("-") : fmt::format("{}", fmt::join(c.differing_ranks, ",")));
  }
  for (const auto& phase : r.audit_phases) out += fmt::format("   audit: {}\n", phase);
  for (const auto& gap : r.audit_gaps) out += fmt::format("   audit: {}\n", gap);
  // Each value a hook returned: its last value on every rank, whether the ranks agree, and the oracle's.
  std::vector<std::string> names;
  for (const auto& o : r.observed) {
    if (std::find(names.begin(), names.end(), o.name) == names.end()) names.push_back(o.name);
  }
  for (const auto& name : names) out += check::describe_hook_value(name, r.observed);
  if (!r.stray_processes.empty()) {
    out += fmt::format("   {} process(es) the ranks started outside their process group outlived them, killed at the "
                       "end: {}\n",
                       r.stray_processes.size(), fmt::join(r.stray_processes, ", "));
  }
  for (const auto& rank : r.script_ranks) {
    out += fmt::format("   rank {} {}{}\n", rank.rank, rank.ended,
                       rank.exception.empty() ? "" : "; its last traceback: " + rank.exception);
  }
  if (r.global_model_checked && !r.global_model.empty()) out += comparison_line("unsharded model", r.global_model, "");
  if (r.resumed_compared && !r.resumed.empty()) {
    out +=
        comparison_line(fmt::format("resumed on {} rank(s)", r.resumed_world_size), r.resumed, "the uninterrupted run");
  }
  if (r.quantized_compared && !r.quantized.empty()) {
    out += comparison_line("quantized", r.quantized, "the float model (each row's quantization bound)");
  }
  if (r.quantized_reference_compared && !r.quantized_reference.empty()) {
    int bitwise = 0;
    const check::ReferenceDiff* worst = &r.quantized_reference.front();
    for (const auto& d : r.quantized_reference) {
      bitwise += d.within_tolerance ? 1 : 0;
      if (d.max_abs_diff > worst->max_abs_diff) worst = &d;
    }
    out += fmt::format(
        "   quantized, against the reference's quantized lookup: {}/{} outputs bitwise; worst {}, max |diff| "
        "{:.3g}, {} element(s) not bitwise{}\n",
        bitwise, r.quantized_reference.size(), worst->name, worst->max_abs_diff, worst->elements_differing,
        worst->note.empty() ? "" : " (" + worst->note + ")");
  }
  if (r.quantized_sharded_compared && !r.quantized_sharded.empty()) {
    out += comparison_line("quantized, sharded for inference", r.quantized_sharded, "the unsharded quantized model");
  }
  if (r.init_from_compared) {
    int equal = 0;
    for (const auto& d : r.init_from) equal += d.within_tolerance ? 1 : 0;
    out += fmt::format("   init.from: {}/{} tensors as the checkpoint holds them before any step", equal,
                       r.init_from.size());
    const auto bad =
        std::find_if(r.init_from.begin(), r.init_from.end(), [](const auto& d) { return !d.within_tolerance; });
    if (bad != r.init_from.end()) {
      out += fmt::format("; {} {}", bad->name,
                         bad->note.empty() ? fmt::format("differs (max |diff| {:.3g})", bad->max_abs_diff) : bad->note);
    }
    out += "\n";
  }
  if (r.reference_compared) {
    int steps = 0;
    for (const auto& d : r.reference) steps = std::max(steps, d.step);
    out += "   against the reference DMP (same initial weights, same batches), per step:\n";
    out += fmt::format("   {:>4}  {:>7}  {:>9}  {:>11}  {:>11}  {}\n", "step", "tensors", "bitwise", "max|diff|",
                       "max rel", "worst tensor");
    for (int step = 0; step <= steps; ++step) {
      int tensors = 0, bitwise = 0;
      const check::ReferenceDiff* worst = nullptr;
      std::vector<std::string> unmatched;
      for (const auto& d : r.reference) {
        if (d.step != step) continue;
        if (!d.note.empty()) {
          unmatched.push_back(d.name);
          continue;
        }
        ++tensors;
        bitwise += d.elements_differing == 0 ? 1 : 0;
        if (worst == nullptr || d.max_abs_diff > worst->max_abs_diff) worst = &d;
      }
      out +=
          fmt::format("   {:>4}  {:>7}  {:>9}  {:>11.3g}  {:>11.3g}  {}{}\n", step, tensors, bitwise,
                      worst ? worst->max_abs_diff : 0.0, worst ? worst->max_rel_diff : 0.0, worst ? worst->name : "-",
                      unmatched.empty() ? "" : fmt::format("  (not comparable: {})", fmt::join(unmatched, ", ")));
    }
    // At the first step out of tolerance, say whether anything compared broke, or only a tensor one
    // side holds and the other does not (then every tensor both hold may still be bitwise).
    std::vector<std::string> one_sided;
    bool compared_broke = false;
    for (const auto& d : r.reference) {
      if (d.step != r.reference_first_break_step || d.within_tolerance) continue;
      if (d.note.empty()) compared_broke = true;
      else one_sided.push_back(d.name);
    }
    out += r.reference_first_break_step < 0 ? std::string("   within tolerance at every step\n")
           : compared_broke
               ? fmt::format("   first step out of tolerance: {}\n", r.reference_first_break_step)
               : fmt::format("   first step out of tolerance: {}, only by tensors one side holds and the other does "
                             "not ({}); every tensor both hold is within tolerance there\n",
                             r.reference_first_break_step, fmt::join(one_sided, ", "));
  }
  for (const auto& note : r.system.notes) out += fmt::format("   note: {}\n", note);
  if (!r.script_ranks.empty()) {
    // A script's broadcast is the script's own.
  } else if (!r.system.simulated) {
    out += "   init broadcast: not measured on a TorchRec release\n";
  } else if (r.init_broadcast.performed) {
    out += fmt::format("   init broadcast: {} tensors, {} bytes in {} collective(s), {:.6f} s, {:.3f} GB/s\n",
                       r.init_broadcast.tensors, r.init_broadcast.bytes, r.init_broadcast.collectives,
                       r.init_broadcast.seconds, r.init_broadcast.gbps);
  } else {
    out += "   init broadcast: none (this profile does not broadcast data-parallel tables)\n";
  }
  if (r.broadcast_probe.performed) {
    std::istringstream probe(check::render_probe(r.broadcast_probe));
    for (std::string line; std::getline(probe, line);) out += "   " + line + "\n";
  }
  return out;
}

std::string render_verdict_line(const check::RunResult& r) {
  const std::string head = fmt::format("VERDICT {} [{}]:", r.scenario, r.run);
  if (r.verdict == check::Verdict::kSkipped) return fmt::format("{} SKIPPED - {}", head, r.skip_reason);
  if (r.failure) {
    // rank -1: the cell failed before any rank started (an interpreter that cannot import TorchRec).
    const std::string what = r.failure->rank < 0
                                 ? fmt::format("{}: {}", r.failure->cause, r.failure->message)
                                 : fmt::format("rank {} {}: {}", r.failure->rank, r.failure->cause, r.failure->message);
    if (r.verdict == check::Verdict::kPass)
      return fmt::format("{} PASS (failed as expected) - {}; expected: {}", head, what, r.expectation.description);
    if (r.verdict == check::Verdict::kFail)
      return fmt::format("{} FAIL - {}; expected: {}", head, what, r.expectation.description);
    return fmt::format("{} ERROR - {}", head, what);
  }
  // tensor -> phases where it differs, in first-seen order
  std::vector<std::pair<std::string, std::vector<std::string>>> diverged;
  for (const auto& c : r.replicas) {
    if (c.equal) continue;
    auto it = std::find_if(diverged.begin(), diverged.end(), [&](const auto& d) { return d.first == c.name; });
    if (it == diverged.end()) it = diverged.insert(diverged.end(), {c.name, {}});
    it->second.push_back(scenario::phase_name(c.phase));
  }
  std::vector<std::string> parts;
  for (const auto& [name, phases] : diverged) parts.push_back(fmt::format("{} ({})", name, fmt::join(phases, ", ")));
  // A script cell that audited nothing says what the audit saw: no phase at all (no wrap, no step, or
  // no audit), or phases whose models hold no replicated tensor (only sharded tables).
  const std::string nothing_audited =
      r.audit_phases.empty()
          ? "no replicated tensor audited (the audit recorded no phase: no DistributedModelParallel wrap or optimizer "
            "step was seen, or script.audit is false)"
          : fmt::format("no replicated tensor audited (the audit recorded {} phase(s), none holding a replicated "
                        "tensor: only sharded tables)",
                        r.audit_phases.size());
  const std::string observed =
      diverged.empty() ? (r.replicas.empty() && !r.script_ranks.empty() ? nothing_audited
                                                                        : std::string("all replicated tensors equal"))
                       : fmt::format("replicas DIVERGE on {} tensor(s): {}", diverged.size(), fmt::join(parts, "; "));
  const std::string on = "; on " + system_label(r);
  if (r.verdict == check::Verdict::kPass) {
    const std::string label = diverged.empty() ? "PASS" : "PASS (bug reproduced as expected)";
    return fmt::format("{} {} - {}; expected: {}{}", head, label, observed, r.expectation.description, on);
  }
  return fmt::format("{} FAIL - {}; expected: {}; {}{}", head, observed, r.expectation.description,
                     fmt::join(r.expectation.failures, "; "), on);
}

}  // namespace dmpcheck::report
