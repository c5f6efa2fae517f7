#include "run/torchrec_cell.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "check/expectations.h"
#include "check/global_model.h"
#include "check/quantized_lookup.h"
#include "check/replica_check.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/revision.h"
#include "dmp/behaviour_profile.h"
#include "dmp/checkpoint.h"
#include "report/json.h"
#include "run/data_generator.h"
#include "run/launcher.h"
#include "run/rank_run.h"
#include "run/release_contract.h"
#include "run/tensor_exchange.h"
#include "run/torchrec_systems.h"

namespace dmpcheck::run {
namespace {

// The rank program's per-id outputs of a sequence table (models.py): "sequence_embeddings.<feature>".
constexpr const char* kSequenceOutputPrefix = "sequence_embeddings.";

namespace fs = std::filesystem;

// The plan a release chose, as the reference's ShardingPlan in model order.
dmp::ShardingPlan release_plan(const scenario::RunSpec& spec, const std::vector<contract::PlanRow>& rows) {
  dmp::ShardingPlan plan;
  plan.topology = {spec.world_size, spec.ranks_per_host(), 0};
  for (const auto& config : spec.model.tables) {
    const auto row =
        std::find_if(rows.begin(), rows.end(), [&](const contract::PlanRow& r) { return r.table == config.name; });
    DMP_CHECK(row != rows.end(), ErrorKind::kRankFailed, "the release's plan has no table '{}'", config.name);
    const auto parsed = dmp::parse_sharding_type(row->sharding);
    DMP_CHECK(parsed.has_value(), ErrorKind::kRankFailed,
              "the release's plan shards '{}' {}, which the reference lacks", config.name, row->sharding);
    dmp::TablePlan t{config.name, *parsed, {}};
    for (const auto& s : row->shards) {
      // A data-parallel replica (rows and cols -1): the whole table.
      t.shards.push_back({s.rank, s.row_offset, s.rows < 0 ? config.num_embeddings : s.rows, s.col_offset,
                          s.cols < 0 ? config.embedding_dim : s.cols, 0});
    }
    plan.tables.push_back(t);
  }
  return plan;
}

// The run as the rank program reads it: every field it needs, the seed rule applied per rank.
contract::RunSpec release_spec(const scenario::RunSpec& spec, contract::Start start) {
  contract::RunSpec out;
  out.world_size = spec.world_size;
  out.local_world_size = spec.ranks_per_host();
  out.memory_per_rank = spec.memory_per_rank;
  out.steps = spec.steps;
  out.batch_size = spec.batch_size;
  out.timeout_s = spec.timeout_s;
  out.sharder = spec.torchrec_sharder;
  out.module = spec.torchrec_module;
  out.outputs = spec.expect.outputs.has_value();
  out.unsharded = spec.expect.global_model.has_value();
  out.quantized_sharded = spec.expect.quantized_sharded.has_value();
  out.quantized = spec.expect.quantized.has_value() || out.quantized_sharded;
  out.loop = spec.torchrec_loop;
  out.epochs = spec.torchrec_epochs;
  out.batches_per_rank = spec.torchrec_batches_per_rank;
  // One count for every rank, spelled out per rank.
  out.eval_batches = spec.torchrec_eval_batches;
  out.data_iterator = spec.torchrec_data_iterator;
  if (spec.torchrec_is_weighted) out.is_weighted = *spec.torchrec_is_weighted ? "true" : "false";
  if (out.eval_batches.size() == 1) out.eval_batches.assign(spec.world_size, out.eval_batches.front());
  for (int r = 0; r < spec.world_size; ++r) out.seeds.push_back(spec.init.seed_of_rank(r));
  start.load = spec.init.load_before_wrap ? "before_wrap" : "after_wrap";
  out.start = std::move(start);
  for (const auto& t : spec.model.tables) {
    contract::Constraints constraints;
    if (auto it = spec.constraints.find(t.name); it != spec.constraints.end()) {
      for (auto type : it->second.sharding_types) constraints.sharding_types.push_back(dmp::sharding_type_name(type));
      constraints.column_shards = it->second.column_shards;
    }
    contract::ManagedCollision mc;
    if (const auto it = spec.managed_collision.find(t.name); it != spec.managed_collision.end())
      mc = {scenario::mc_module_name(it->second.module), it->second.input_hash_size,
            scenario::mc_eviction_name(it->second.eviction), it->second.interval};
    out.tables.push_back({t.name, t.num_embeddings, t.embedding_dim, t.feature_names, dmp::pooling_name(t), t.weighted,
                          dmp::data_type_name(t.data_type),
                          spec.quant.count(t.name) ? scenario::quant_type_name(spec.quant.at(t.name)) : "", mc,
                          constraints});
  }
  out.dense_layers = spec.model.dense_layers;
  const auto& so = spec.sparse_optimizer;
  out.sparse_optimizer = {dmp::fused_optimizer_name(so.type),
                          so.learning_rate,
                          so.eps,
                          so.beta1,
                          so.beta2,
                          so.weight_decay,
                          dmp::weight_decay_mode_name(so.weight_decay_mode)};
  const auto& dn = spec.dense_optimizer;
  out.dense_optimizer = {
      dmp::dense_optimizer_name(dn.type), dn.learning_rate, dn.eps, dn.beta1, dn.beta2, dn.momentum, dn.weight_decay};
  return out;
}

// Every rank's local batch of steps first + 1 .. last, exactly what the reference trains on: each
// step's global batch split into `world` local batches of `batch_size` bags, in rank order (the
// run's own ranks, or a resumed run's).
void write_batches(const scenario::RunSpec& spec, const std::string& dir, int first, int last, int world,
                   int64_t batch_size) {
  fs::create_directories(dir);
  for (int step = first; step < last; ++step) {
    const dmp::KeyedJaggedTensor global = make_global_batch(spec, step);
    for (int rank = 0; rank < world; ++rank) {
      const dmp::KeyedJaggedTensor local = global.slice_batch(rank * batch_size, (rank + 1) * batch_size);
      auto as_vector = [](const at::Tensor& t) {
        const at::Tensor c = t.contiguous().to(at::kLong);
        return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
      };
      contract::Batch batch;
      batch.keys = local.keys();
      batch.lengths = as_vector(local.lengths());
      batch.values = as_vector(local.values());
      if (local.weights()) {
        const at::Tensor w = local.weights()->contiguous().to(at::kFloat);
        batch.weighted = true;
        batch.weights.assign(w.data_ptr<float>(), w.data_ptr<float>() + w.numel());
      }
      if (spec.data.variable_batch()) {  // the loader keeps such runs at their own world size
        VariableBatch vbe = variable_batch(spec, step, rank);
        batch.stride_per_key = std::move(vbe.stride_per_key);
        batch.inverse_indices = std::move(vbe.inverse_indices);
      }
      report::write_text_file_atomically(fmt::format("{}/step{}_rank{}.json", dir, step + 1, rank),
                                         nlohmann::json(batch).dump());
    }
  }
}

std::vector<std::vector<ExchangePiece>> read_ranks(const std::string& out, int world_size, const std::string& phase) {
  std::vector<std::vector<ExchangePiece>> per_rank;
  for (int r = 0; r < world_size; ++r) per_rank.push_back(read_exchange_phase(fmt::format("{}/rank{}", out, r), phase));
  return per_rank;
}

std::vector<check::TensorCheck> replica_checks(const std::vector<std::vector<ExchangePiece>>& per_rank,
                                               scenario::Phase phase) {
  std::vector<check::TensorCheck> out;
  for (const auto& piece : per_rank.at(0)) {
    if (!piece.replicated) continue;
    std::vector<at::Tensor> copies;
    for (size_t r = 0; r < per_rank.size(); ++r) {
      auto it = std::find_if(per_rank[r].begin(), per_rank[r].end(),
                             [&](const ExchangePiece& p) { return p.name == piece.name; });
      DMP_CHECK(it != per_rank[r].end() && it->tensor.sizes() == piece.tensor.sizes(), ErrorKind::kRankFailed,
                "rank {} holds no replica of '{}' shaped as rank 0's [{}]", r, piece.name,
                fmt::join(piece.tensor.sizes(), ", "));
      copies.push_back(it->tensor);
    }
    out.push_back(check::compare_copies(piece.name, piece.sharding, phase, copies));
  }
  return out;
}

std::vector<check::ReferenceDiff> compare_with_reference(const std::map<std::string, at::Tensor>& torchrec,
                                                         const std::map<std::string, at::Tensor>& reference, int step,
                                                         const scenario::Tolerance& tol) {
  std::vector<check::ReferenceDiff> out;
  for (const auto& [name, a] : torchrec) {
    auto it = reference.find(name);
    out.push_back(it != reference.end()
                      ? check::diff_tensor(name, a, it->second, step, tol.rtol, tol.atol, "TorchRec", "reference")
                      : check::absent_tensor(name, step, a.numel(),
                                             "only in TorchRec (the reference holds no tensor of that name)"));
  }
  for (const auto& [name, b] : reference) {
    if (torchrec.count(name)) continue;
    out.push_back(
        check::absent_tensor(name, step, b.numel(), "only in the reference (TorchRec holds no tensor of that name)"));
  }
  return out;
}

// A release's plan, as a report records a plan.
std::vector<check::TablePlacement> placements_of(const std::vector<contract::PlanRow>& plan) {
  std::vector<check::TablePlacement> out;
  for (const auto& t : plan) {
    check::TablePlacement placement{t.table, t.sharding, {}};
    for (const auto& s : t.shards) placement.shards.push_back({s.rank, s.row_offset, s.rows, s.col_offset, s.cols, 0});
    out.push_back(placement);
  }
  return out;
}

}  // namespace

check::RunResult run_torchrec_cell(const scenario::Scenario& scenario, size_t index,
                                   const ScenarioRunOptions& options) {
  const scenario::RunSpec& spec = scenario.runs.at(index);
  check::RunResult result = result_header(scenario, spec);
  auto write_report = [&](check::RunResult& r) { write_cell_report(scenario, options, r); };
  std::string why_not;
  std::optional<TorchRecEnvironment> env;
  try {
    env = resolve_environment(spec.system, why_not);
  } catch (const Error& e) {
    // An interpreter that cannot import TorchRec, a commit the repository lacks: this cell's error.
    result.verdict = check::Verdict::kError;
    const auto kind = spec.system.kind == scenario::System::Kind::kPython ? check::FailureKind::kImport
                                                                          : check::FailureKind::kInvalidInput;
    result.failure = check::RankFailure{-1, kind, "no rank started", e.what(), {}};
    write_report(result);
    return result;
  }
  if (!env) {
    result.verdict = check::Verdict::kSkipped;
    result.skip_reason = why_not;
    write_report(result);
    return result;
  }
  if (auto note = spec.data.variable_batch_note()) result.system.notes.push_back(std::move(*note));
  const int cores = available_cores();
  result.environment = {"torch " + env->torch,        "gloo", hostname(), git_revision(), spec.world_size, cores,
                        threads_per_rank(spec, cores)};
  result.system.torchrec = env->describe();
  result.system.torch = env->torch;
  result.system.fbgemm_gpu = env->fbgemm_gpu;
  const std::string sut = torchrec_sut_dir();
  DMP_CHECK(fs::exists(sut + "/dmpcheck_torchrec/rank.py"), ErrorKind::kInvalidInput,
            "the TorchRec rank program is not at {} (set DMPCHECK_TORCHREC_SUT to the torchrec_sut/ folder of "
            "dmpcheck's source)",
            sut);

  PrivateDir exchange("dmpcheck-torchrec", "DMPCHECK_KEEP_EXCHANGE");
  const std::string out = exchange.path() + "/out";
  // A run of zero steps that compares outputs (or quantizes) runs the forward alone, on the first batch.
  const bool forwards = spec.expect.outputs || spec.expect.quantized || spec.expect.quantized_sharded;
  write_batches(spec, exchange.path() + "/batches", 0, forwards ? std::max(spec.steps, 1) : spec.steps, spec.world_size,
                spec.batch_size);

  // The reference half of a side-by-side comparison.  `start: reference` (the default): it runs
  // first and TorchRec starts from its initial weights.  `start: seed`: TorchRec runs first and
  // draws its own; the reference then runs on TorchRec's plan, so both draw the same shards on
  // the same ranks and step 0 compares the draws.
  contract::Start start;  // the release draws its own weights unless one of the two below
  const std::string reference_dir = exchange.path() + "/reference";
  auto run_reference_half = [&](const std::string& plan) -> std::optional<check::RunResult> {
    ScenarioRunOptions ref_options = options;
    ref_options.write_reports = false;
    ReferenceHalf half{reference_dir, spec.expect.reference_profile, !spec.expect.reference_draws_own_init, plan};
    if (half.profile == dmp::kReleaseProfile) {
      // A commit is modelled as the release it runs over; an interpreter as the torchrec it imports.
      const std::string modelled = !env->base_release.empty() ? env->base_release : env->torchrec;
      half.profile = dmp::profile_for_release(modelled);
      DMP_CHECK(!half.profile.empty(), ErrorKind::kInvalidScenario, "{}: no behaviour profile models torchrec {}",
                scenario.name, modelled);
    }
    ref_options.reference_half = half;
    const check::RunResult ref = run_cell(scenario, index, ref_options);
    result.system.notes.push_back(fmt::format(
        "compared with the reference DMP under profile '{}'{}", half.profile.empty() ? spec.profile.name : half.profile,
        plan.empty() ? "" : ", on the release's own plan, each side drawing its initial weights from the seed"));
    if (!ref.failure) return std::nullopt;
    check::RunResult failed = result;
    failed.verdict = check::Verdict::kError;
    failed.failure = ref.failure;
    failed.failure->message = "the reference half of the comparison failed: " + failed.failure->message;
    write_report(failed);
    return failed;
  };
  if (spec.expect.reference && !spec.expect.reference_draws_own_init) {
    if (auto failed = run_reference_half("")) return *failed;
    start = {"reference", reference_dir + "/init.json", ""};
  }
  // init.from: the user's weights (a release loads weights, not a checkpoint's optimizer state),
  // handed over as whole tensors; the rank loads them before or after the wrap as init.load says.
  std::map<std::string, at::Tensor> user_weights;
  if (!spec.init.from.empty()) {
    for (const auto& [name, t] : dmp::load_checkpoint(spec.init.from).tensors) {
      const bool weight = name.size() > 7 && (name.compare(name.size() - 7, 7, ".weight") == 0 ||
                                              name.compare(name.size() - 5, 5, ".bias") == 0);
      if (weight) user_weights[name] = t;
    }
    write_exchange_phase(exchange.path(), "user_weights", whole_pieces(user_weights));
    start = {"user_weights", exchange.path() + "/user_weights.json", ""};
  }
  contract::RunSpec document = release_spec(spec, start);
  const std::string checkpoint_dir = exchange.path() + "/checkpoint";
  if (spec.resume) document.checkpoint = {spec.resume->after_step, checkpoint_dir};
  report::write_text_file_atomically(exchange.path() + "/spec.json", nlohmann::json(document).dump(2));

  bool warm_ranks = false;  // the first run's ranks forked from a warm interpreter (torchrec already imported)
  // One launch of the rank program over `exchange_dir` (spec.json, batches/) on `run`'s ranks.
  auto launch_ranks = [&](const scenario::RunSpec& run, const std::string& exchange_dir, const std::string& label,
                          double& seconds) -> std::optional<check::RunResult> {
    LaunchRequest request =
        torchrec_launch(*env, {"-m", "dmpcheck_torchrec.rank", exchange_dir}, exchange_dir + "/out");
    // The rendezvous is a file in the launch's own private directory (no port to connect to, as
    // dmpcheck's own ranks), and Gloo's pairs listen on loopback: a release cell runs on one host.
    request.launch_environment["DMPCHECK_RENDEZVOUS_FILE"] = exchange_dir + "/rendezvous";
    // An exec-ed rank's temporary files (torch's among them) go with the exchange directory.
    request.launch_environment["TMPDIR"] = exchange_dir + "/tmp";
    fs::create_directory(exchange_dir + "/tmp");
    request.world_size = run.world_size;
    request.local_world_size = run.local_world_size;
    request.threads_per_rank = threads_per_rank(run, available_cores());
    request.exec_ranks = options.exec_ranks;
    set_cell_budget_and_echo(run, options, spec.system.name() + label + " ", request);
    const LaunchOutcome launched = launch(request);
    seconds += launched.seconds;
    if (label.empty()) {
      warm_ranks = launched.warm_interpreter;
      result.system.notes.push_back(
          launched.warm_interpreter
              ? fmt::format("ranks forked from a warm interpreter of this environment (torch and torchrec imported "
                            "once for the command, in {:.2f} s)",
                            launched.warm_import_s)
              : "ranks started as fresh interpreters" +
                    (launched.cold_reason.empty() ? std::string() : " (" + launched.cold_reason + ")"));
    }
    if (launched.ok) return std::nullopt;
    check::RunResult failed = failed_result(scenario, spec, launched);
    if (failed.failure && !label.empty()) failed.failure->message = label.substr(1) + ": " + failed.failure->message;
    failed.system = result.system;
    failed.environment = result.environment;
    failed.timings.total_s = seconds;
    write_report(failed);
    return failed;
  };
  double launched_seconds = 0;
  if (auto failed = launch_ranks(spec, exchange.path(), "", launched_seconds)) return *failed;

  // `resume`: the run above saved its checkpoint after resume.after_step and trained on,
  // uninterrupted.  A fresh set of resume.world_size ranks now builds the model under resume's
  // plan, loads that checkpoint through torch.distributed.checkpoint and trains the remaining
  // steps on the same global batches (each split among its ranks).
  const int resumed_after = spec.resume ? spec.resume->after_step : spec.steps + 1;
  const std::string resumed_dir = exchange.path() + "/resumed";
  scenario::RunSpec resumed_run = spec.resume ? scenario::resumed_run(spec) : spec;
  if (spec.resume) {
    resumed_run.expect.global_model.reset();  // the oracle trained uninterrupted, in the first run
    write_batches(spec, resumed_dir + "/batches", resumed_after,
                  spec.expect.outputs ? std::max(spec.steps, 1) : spec.steps, resumed_run.world_size,
                  resumed_run.batch_size);
    contract::RunSpec second = release_spec(resumed_run, {"checkpoint", checkpoint_dir, ""});
    second.first_step = resumed_after;
    report::write_text_file_atomically(resumed_dir + "/spec.json", nlohmann::json(second).dump(2));
    const std::string label = fmt::format(" the resumed run ({} ranks, from the checkpoint after step {})",
                                          resumed_run.world_size, resumed_after);
    if (auto failed = launch_ranks(resumed_run, resumed_dir, label, launched_seconds)) return *failed;
  }
  // Where each phase's tensors are: the resumed run's from the step it resumed after on.
  auto ranks_of = [&](int step, const std::string& phase) {
    return step >= resumed_after && phase != "init" ? read_ranks(resumed_dir + "/out", resumed_run.world_size, phase)
                                                    : read_ranks(out, spec.world_size, phase);
  };

  try {
    const auto meta = contract::read_document_file<contract::RunMeta>(out + "/meta.json");
    if (spec.expect.reference && spec.expect.reference_draws_own_init) {
      if (auto failed = run_reference_half(release_plan(spec, meta.plan).serialize())) return *failed;
    }
    // A commit's cell must have imported the commit's source, not the release's own package.
    if (!env->source_dir.empty()) {
      std::error_code ec;
      const auto wanted = fs::weakly_canonical(env->source_dir + "/torchrec", ec);
      const auto got = fs::weakly_canonical(meta.versions.torchrec_source, ec);
      DMP_CHECK(wanted == got, ErrorKind::kRankFailed,
                "{}: the ranks imported torchrec from {}, not from the commit's source {}", spec.system.name(),
                meta.versions.torchrec_source, wanted.string());
    }
    result.system.torchrec = env->source_dir.empty() ? meta.versions.torchrec : env->describe();
    result.system.torch = meta.versions.torch;
    result.system.fbgemm_gpu = meta.versions.fbgemm_gpu;
    result.system.notes.insert(result.system.notes.end(), meta.notes.begin(), meta.notes.end());
    result.plan = placements_of(meta.plan);
    result.losses = meta.losses;
    if (spec.resume) {
      const auto second = contract::read_document_file<contract::RunMeta>(resumed_dir + "/out/meta.json");
      result.losses.resize(std::min<size_t>(result.losses.size(), resumed_after));
      result.losses.insert(result.losses.end(), second.losses.begin(), second.losses.end());
      result.resumed_plan = placements_of(second.plan);
      std::vector<std::string> placed;
      for (const auto& t : second.plan) placed.push_back(t.table + " " + t.sharding);
      result.system.notes.push_back(fmt::format(
          "saved through torch.distributed.checkpoint after step {} on {} ranks; resumed on {} ranks under the "
          "release's plan {}",
          resumed_after, spec.world_size, resumed_run.world_size, fmt::join(placed, ", ")));
      for (const auto& n : second.notes) result.system.notes.push_back("resumed run: " + n);
    }
    result.loop = spec.torchrec_loop;
    for (const auto& l : meta.loops)
      result.loops.push_back({l.rank, l.batches, l.next_after_exhausted, l.eval_batches});
    if (spec.torchrec_loop != "plain" || spec.torchrec_epochs > 1 || !spec.torchrec_eval_batches.empty()) {
      std::vector<std::string> ranks;
      for (const auto& l : meta.loops) {
        ranks.push_back(fmt::format(
            "rank {}: [{}]{}{}", l.rank, fmt::join(l.batches, ", "),
            l.eval_batches.empty() ? "" : fmt::format(", eval [{}]", fmt::join(l.eval_batches, ", ")),
            l.next_after_exhausted ? fmt::format(", next() on its exhausted iterator {}x", l.next_after_exhausted)
                                   : ""));
      }
      result.system.notes.push_back(fmt::format("loop {}, {} epoch(s); batches executed per epoch: {}",
                                                spec.torchrec_loop, spec.torchrec_epochs, fmt::join(ranks, "; ")));
    }
    // A loop that stopped early (its pipeline saw no more data) trained fewer steps than the
    // scenario has.  Only where the expectation names exactly that shortfall (loop.batches per
    // epoch, a run of full epochs then nothing) is the cell judged on the steps it trained, with a
    // note; any other shortfall is this cell's error, never a pass on fewer steps.
    int steps = spec.steps;
    const auto& expected = spec.expect.loop_batches_per_epoch;
    int64_t expected_steps = 0;
    bool prefix = !expected.empty();
    for (size_t e = 0; e < expected.size(); ++e) {
      expected_steps += expected[e];
      const int64_t full = spec.steps / spec.torchrec_epochs;
      if (e > 0 && expected[e] != 0 && expected[e - 1] != full) prefix = false;
    }
    int64_t least = spec.steps;
    std::vector<std::string> trained_by;
    for (const auto& l : meta.loops) {
      int64_t trained = 0;
      for (const auto b : l.batches) trained += b;
      least = std::min(least, trained);
      trained_by.push_back(fmt::format("rank {}: [{}]", l.rank, fmt::join(l.batches, ", ")));
    }
    if (least < spec.steps && !spec.resume) {
      bool as_expected = prefix && expected_steps > 0 && expected_steps < spec.steps;
      for (const auto& l : meta.loops) as_expected = as_expected && l.batches == expected;
      DMP_CHECK(as_expected, ErrorKind::kRankFailed,
                "the loop trained {} of the scenario's {} steps (batches per epoch: {}); a loop expected to stop "
                "early names its batches per epoch in loop.batches",
                least, spec.steps, fmt::join(trained_by, "; "));
      steps = static_cast<int>(expected_steps);
      result.system.notes.push_back(fmt::format(
          "the loop trained {} of the scenario's {} steps, as loop.batches expects: the cell is judged on those {}",
          steps, spec.steps, steps));
    }
    result.timings.init_s = meta.timings.import_s + meta.timings.init_s;
    result.timings.train_s = meta.timings.train_s;
    result.system.notes.push_back(
        fmt::format("import torch + torchrec took {:.2f} s on rank 0{}, TorchRec's planner {:.2f} s",
                    meta.timings.import_s, warm_ranks ? " (already imported)" : "", meta.timings.plan_s));

    const auto check_start = std::chrono::steady_clock::now();
    // TorchRec's tensors of `phase` against the reference's; the earliest step that breaks `tol` is kept.
    bool sequence_note_given = false;
    auto compare = [&](const std::vector<std::vector<ExchangePiece>>& per_rank, const std::string& phase, int step,
                       const scenario::Tolerance& tol) {
      auto theirs = assemble_full(per_rank);
      const auto ours = assemble_full({read_exchange_phase(reference_dir, phase)});
      // Each id's row of a sequence table: the reference models the table by its bag sums
      // (pooled_embeddings.<feature>, compared), so these are held against the unsharded model only.
      for (auto it = theirs.begin(); it != theirs.end();) {
        if (it->first.rfind(kSequenceOutputPrefix, 0) != 0) {
          ++it;
          continue;
        }
        if (!sequence_note_given) {
          result.system.notes.push_back(
              spec.expect.global_model
                  ? "each id's row of a sequence table (sequence_embeddings.*) is compared with the release's own "
                    "unsharded model (global_model) only: the reference models a sequence table by its bag sums"
                  : "each id's row of a sequence table (sequence_embeddings.*) is not compared: the reference models "
                    "a sequence table by its bag sums (global_model compares them with the release's own unsharded "
                    "model)");
          sequence_note_given = true;
        }
        it = theirs.erase(it);
      }
      for (auto& d : compare_with_reference(theirs, ours, step, tol)) {
        if (!d.within_tolerance && (result.reference_first_break_step < 0 || step < result.reference_first_break_step))
          result.reference_first_break_step = step;
        result.reference.push_back(std::move(d));
      }
    };
    // TorchRec's sharded tensors against its own unsharded model's (the oracle on the release, rank 0's
    // out/unsharded), each tensor kept at its worst step.
    auto unsharded = [&](const std::vector<std::vector<ExchangePiece>>& per_rank, const std::string& phase, int step,
                         const scenario::Tolerance& tol) {
      check::compare_with_unsharded(result.global_model, assemble_full(per_rank),
                                    assemble_full({read_exchange_phase(out + "/unsharded", phase)}), step,
                                    {tol.rtol, tol.atol});
    };
    std::vector<std::vector<ExchangePiece>> last;
    for (int step = 0; step <= steps; ++step) {
      const std::string phase = step == 0 ? "init" : fmt::format("step{}", step);
      auto per_rank = ranks_of(step, phase);
      if (spec.resume && step >= resumed_after) {  // against the run that was never interrupted
        const auto resumed = assemble_full(per_rank);
        const auto uninterrupted = assemble_full(read_ranks(out, spec.world_size, phase));
        const auto tol = spec.expect.resumed ? *spec.expect.resumed : scenario::Tolerance{};
        check::compare_with_unsharded(result.resumed, resumed, uninterrupted, step, {tol.rtol, tol.atol},
                                      "the uninterrupted run");
        for (const auto& [name, t] : uninterrupted) {
          const std::string& key = name;
          if (resumed.count(name) || std::any_of(result.resumed.begin(), result.resumed.end(),
                                                 [&](const check::GlobalModelCheck& c) { return c.name == key; }))
            continue;
          check::GlobalModelCheck lost;
          lost.name = name;
          lost.step = step;
          lost.within_tolerance = lost.comparable = false;
          lost.numel = t.numel();
          lost.note = "only in the uninterrupted run: the resumed run holds no such tensor";
          result.resumed.push_back(lost);
        }
      }
      const bool final_phase = step == steps;
      const auto checks = replica_checks(per_rank, step == 0     ? scenario::Phase::kInit
                                                   : final_phase ? scenario::Phase::kFinal
                                                                 : scenario::Phase::kStep);
      result.divergence.push_back(check::step_divergence(step, checks));
      if (step == 0) result.replicas = checks;
      if (final_phase && step > 0) result.replicas.insert(result.replicas.end(), checks.begin(), checks.end());
      if (spec.expect.reference) compare(per_rank, phase, step, *spec.expect.reference);
      if (spec.expect.global_model && step > 0) unsharded(per_rank, phase, step, *spec.expect.global_model);
      if (final_phase) last = std::move(per_rank);
    }
    // The forward's outputs, from step 0 (the forward of step s + 1, on the weights after s steps).
    for (int step = 0; spec.expect.outputs && step < std::max(steps, 1); ++step) {
      const std::string phase = fmt::format("outputs{}", step);
      const auto per_rank = ranks_of(step, phase);
      if (spec.expect.reference) compare(per_rank, phase, step, *spec.expect.outputs);
      if (spec.expect.global_model) unsharded(per_rank, phase, step, *spec.expect.outputs);
    }
    const auto final_state = assemble_full(last);  // every full tensor after the last step
    // The trained model quantized (rank 0's out/quantized): on the first batch, against the float
    // model within each element's bound, and sharded for inference against unsharded.
    if (spec.expect.quantized || spec.expect.quantized_sharded) {
      const auto phase = [&](const std::string& who) {
        return assemble_full({read_exchange_phase(out + "/quantized/" + who, "outputs0")});
      };
      const auto quantized = phase("unsharded");
      if (spec.expect.quantized) {
        check::compare_within_bound(result.quantized, quantized, phase("float"), phase("bound"), steps,
                                    "the float model");
        result.quantized_compared = true;
      }
      // The reference's quantized lookup on the release's trained weights and the same batch (a
      // variable batch goes to the release as rank 0's local batch: not compared).
      if (!spec.data.variable_batch()) {
        const auto ours = check::quantized_pooled(spec, final_state, make_global_batch(spec, 0));
        for (const auto& [name, theirs] : quantized) {
          const auto it = ours.find(name);
          result.quantized_reference.push_back(
              it == ours.end()
                  ? check::absent_tensor(name, steps, theirs.numel(), "the reference has no such output")
                  : check::diff_tensor(name, theirs, it->second, steps, 0.0, 0.0, "the release's", "the reference's"));
        }
        result.quantized_reference_compared = true;
      }
      if (spec.expect.quantized_sharded) {
        const auto& tol = *spec.expect.quantized_sharded;
        check::compare_with_unsharded(result.quantized_sharded, phase("sharded"), quantized, steps,
                                      {tol.rtol, tol.atol}, "the unsharded quantized model");
        result.quantized_sharded_compared = true;
      }
    }
    if (steps == 0) {  // nothing trained: the final state is the initial one
      const auto again = replica_checks(last, scenario::Phase::kFinal);
      result.replicas.insert(result.replicas.end(), again.begin(), again.end());
    }
    result.reference_compared = spec.expect.reference.has_value();
    result.global_model_checked = spec.expect.global_model.has_value();
    result.resumed_compared = spec.resume.has_value();
    result.resumed_world_size = spec.resume ? resumed_run.world_size : 0;
    if (spec.expect.initial_state) {
      result.init_from =
          check::compare_with_checkpoint(assemble_full(read_ranks(out, spec.world_size, "init")), user_weights);
      result.init_from_compared = true;
    }
    for (const auto& [name, tensor] : final_state) result.digests[name] = tensor_digest(tensor);
    result.timings.check_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - check_start).count();
  } catch (const Error& e) {
    result.failure = check::RankFailure{
        0, check::FailureKind::kTorchRec, "the ranks exited 0 but their output is incomplete", e.what(), {}};
    result.verdict = check::Verdict::kError;
    write_report(result);
    return result;
  }
  result.timings.total_s = launched_seconds;
  result.expectation = check::evaluate_expectation(spec.expect, result);
  result.verdict = result.expectation.held ? check::Verdict::kPass : check::Verdict::kFail;
  write_report(result);
  return result;
}

dmp::ShardingPlan torchrec_planner_plan(const scenario::RunSpec& spec, const std::string& version, std::string* label) {
  std::string why_not;
  const auto env = resolve_environment(scenario::System::release(version), why_not);
  DMP_CHECK(env.has_value(), ErrorKind::kInvalidInput, "{}", why_not);
  PrivateDir exchange("dmpcheck-torchrec", "DMPCHECK_KEEP_EXCHANGE");
  report::write_text_file_atomically(exchange.path() + "/spec.json", nlohmann::json(release_spec(spec, {})).dump(2));
  LaunchRequest request = torchrec_launch(
      *env, {"-m", "dmpcheck_torchrec.plan", exchange.path() + "/spec.json", exchange.path() + "/plan.json"},
      exchange.path() + "/out");
  request.launch_environment["TMPDIR"] = exchange.path() + "/tmp";
  fs::create_directory(exchange.path() + "/tmp");
  request.world_size = 1;
  request.budget = std::chrono::seconds(120);
  const LaunchOutcome launched = launch(request);
  DMP_CHECK(launched.ok, ErrorKind::kInvalidInput, "torchrec {}'s planner failed on run [{}]: {}", version, spec.name,
            launched.failure ? launched.failure->message : std::string("no output"));
  const auto answer = contract::read_document_file<contract::PlanAnswer>(exchange.path() + "/plan.json");
  if (label) *label = fmt::format("torchrec {} (torch {})", answer.versions.torchrec, answer.versions.torch);
  return release_plan(spec, answer.plan);
}

}  // namespace dmpcheck::run
