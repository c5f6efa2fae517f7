#include "release/release_inputs.h"

#include <algorithm>
#include <filesystem>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "check/global_model.h"
#include "check/replica_check.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/revision.h"
#include "common/settings.h"
#include "release/torchrec_systems.h"
#include "report/json.h"
#include "run/data_generator.h"
#include "run/launcher.h"
#include "run/rank_run.h"

namespace dmpcheck::run {

namespace fs = std::filesystem;

std::optional<TorchRecEnvironment> cell_environment(const scenario::RunSpec& spec, check::RunResult& result) {
  std::string why_not;
  std::optional<TorchRecEnvironment> env;
  try {
    env = resolve_environment(spec.system, why_not);
  } catch (const Error& e) {
    // An environment the installer failed to make; an interpreter that cannot import TorchRec, a
    // commit the repository lacks: this cell's error.
    result.verdict = check::Verdict::kError;
    const auto kind = dynamic_cast<const EnvironmentNotMade*>(&e)           ? check::FailureKind::kEnvironment
                      : spec.system.kind == scenario::System::Kind::kPython ? check::FailureKind::kImport
                                                                            : check::FailureKind::kInvalidInput;
    result.failure = check::RankFailure{-1, kind, "no rank started", e.what(), {}};
    return std::nullopt;
  }
  if (!env) {
    result.verdict = check::Verdict::kSkipped;
    result.skip_reason = why_not;
    return std::nullopt;
  }
  const int cores = available_cores();
  result.environment = {"torch " + env->torch,        "gloo", hostname(), git_revision(), spec.world_size, cores,
                        threads_per_rank(spec, cores)};
  result.system.torchrec = env->describe();
  result.system.torch = env->torch;
  result.system.fbgemm_gpu = env->fbgemm_gpu;
  return env;
}

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
  if (!spec.torchrec_hooks.empty()) out.hooks = std::filesystem::absolute(spec.torchrec_hooks).string();
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

void write_batches(const scenario::RunSpec& spec, const std::string& dir, int first, int last, int world,
                   int64_t batch_size) {
  fs::create_directories(dir);
  for (int step = first; step < last; ++step) {
    const dmp::KeyedJaggedTensor global = make_global_batch(spec, step);
    for (int rank = 0; rank < world; ++rank) {
      const dmp::KeyedJaggedTensor local = global.slice_batch(rank * batch_size, (rank + 1) * batch_size);
      contract::Batch batch;
      batch.keys = local.keys();
      batch.lengths = to_vector(local.lengths());
      batch.values = to_vector(local.values());
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
      report::write_text_file_atomically(dir + "/" + contract::batch_file(step + 1, rank),
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

std::vector<check::TablePlacement> placements_of(const std::vector<contract::PlanRow>& plan) {
  std::vector<check::TablePlacement> out;
  for (const auto& t : plan) {
    check::TablePlacement placement{t.table, t.sharding, {}};
    for (const auto& s : t.shards) placement.shards.push_back({s.rank, s.row_offset, s.rows, s.col_offset, s.cols, 0});
    out.push_back(placement);
  }
  return out;
}

dmp::ShardingPlan torchrec_planner_plan(const scenario::RunSpec& spec, const std::string& version, std::string* label) {
  std::string why_not;
  const auto env = resolve_environment(scenario::System::release(version), why_not);
  DMP_CHECK(env.has_value(), ErrorKind::kInvalidInput, "{}", why_not);
  PrivateDir exchange("dmpcheck-torchrec", settings().keep_exchange);
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
