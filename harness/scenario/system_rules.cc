// What each system can run and judge, in one place: the loader refuses here, with the field,
// what a cell cannot do on its system; the reference's own limits (reference_cannot_model) are
// read by the runner too, which skips such a reference cell with the same words.
#include "scenario/parse.h"

namespace dmpcheck::scenario {

std::optional<std::string> reference_cannot_model(const RunSpec& run) {
  if (!run.managed_collision.empty()) {
    return fmt::format("the reference DMP does not model managed collision (MCH remapping of raw ids) yet; table '{}' "
                       "has it",
                       run.managed_collision.begin()->first);
  }
  for (const auto& t : run.model.tables) {
    const auto c = run.constraints.find(t.name);
    const bool data_parallel = c != run.constraints.end() && !c->second.sharding_types.empty() &&
                               c->second.sharding_types.front() == dmp::ShardingType::kDataParallel;
    if (t.data_type == dmp::DataType::kBf16 || (t.data_type == dmp::DataType::kFp16 && data_parallel)) {
      return fmt::format("the reference DMP models fp32 tables and model-parallel fp16 ones; table '{}' is {}{}",
                         t.name, dmp::data_type_name(t.data_type), data_parallel ? ", data_parallel" : "");
    }
  }
  return std::nullopt;
}

namespace detail {
namespace {

// The tables of one collection of `run` (the pooled ones, or the sequence ones) that `per_table`
// (a per-table setting: quant, managed_collision) leaves out.
template <typename Setting>
std::vector<std::string> tables_without(const RunSpec& run, const std::map<std::string, Setting>& per_table,
                                        bool sequence = false) {
  std::vector<std::string> out;
  for (const auto& t : run.model.tables)
    if (t.sequence == sequence && !per_table.count(t.name)) out.push_back(t.name);
  return out;
}

}  // namespace

void check_system_can_run(const Reader& r, const YAML::Node& root, const RunSpec& run) {
  if (!run.managed_collision.empty()) {
    // TorchRec's ManagedCollisionEmbeddingBagCollection (pooled tables) and
    // ManagedCollisionEmbeddingCollection (sequence tables): one MCH module per table of the collection.
    for (const bool sequence : {false, true}) {
      const std::vector<std::string> plain = tables_without(run, run.managed_collision, sequence);
      const size_t in_collection = static_cast<size_t>(std::count_if(
          run.model.tables.begin(), run.model.tables.end(), [&](const auto& t) { return t.sequence == sequence; }));
      if (plain.empty() || plain.size() == in_collection) continue;
      r.fail(root["tables"], "tables",
             fmt::format("run '{}' puts some {} tables behind managed collision; a {} needs it on every table of "
                         "the collection, and {} {} none",
                         run.name, sequence ? "sequence" : "pooled",
                         sequence ? "ManagedCollisionEmbeddingCollection" : "ManagedCollisionEmbeddingBagCollection",
                         fmt::join(plain, ", "), plain.size() == 1 ? "has" : "have"));
    }
    if (!run.quant.empty())
      r.fail(root["tables"], "tables", "managed collision tables are not quantized by dmpcheck yet (drop 'quant')");
    if (run.torchrec_module != "embedding_bag_collection")
      r.fail(root["torchrec"]["module"], "torchrec.module", "managed collision wraps an EmbeddingBagCollection");
  }
  if (run.on_torchrec()) {
    // What the TorchRec rank program (torchrec_sut/) cannot do is refused here, before any rank starts.
    auto refuse = [&](const char* key, const std::string& why) {
      r.fail(root[key], key, fmt::format("not available on {} ({}); run it on the reference", run.system.name(), why));
    };
    // What a release can do, but not in this combination.
    auto refuse_with = [&](const char* key, const std::string& why) {
      r.fail(root[key], key, fmt::format("not available on {}: {}", run.system.name(), why));
    };
    if (run.backend != comm::Backend::kGloo) refuse("backend", "TorchRec cells run on CPU with Gloo");
    if (run.resume &&
        (run.torchrec_loop != "plain" || run.torchrec_epochs != 1 || !run.torchrec_batches_per_rank.empty())) {
      refuse_with("resume", "a release resumes from its checkpoint in the plain loop of one epoch; drop torchrec.loop, "
                            "epochs and batches_per_rank");
    }
    if (run.resume && !run.init.from.empty())
      refuse_with("resume", "a release cell resumes from its own checkpoint, not init.from");
    if (!run.faults.empty()) refuse("faults", "faults are injected by the reference's ranks");
    if (run.fingerprint) refuse("fingerprint", "collective fingerprints are the reference's");
    if (run.steps % run.torchrec_epochs != 0) {
      const YAML::Node torchrec = root["torchrec"];
      r.fail(torchrec.IsDefined() && torchrec.IsMap() ? torchrec["epochs"] : torchrec, "torchrec.epochs",
             fmt::format("{} epochs cannot split steps: {} into equal passes", run.torchrec_epochs, run.steps));
    }
    const auto& counts = run.torchrec_batches_per_rank;
    const int64_t per_epoch = run.steps / run.torchrec_epochs;
    const int64_t most = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
    if (!counts.empty() && (static_cast<int>(counts.size()) != run.world_size || most > per_epoch)) {
      r.fail(root["torchrec"], "torchrec.batches_per_rank",
             fmt::format("has {} count(s) up to {}; expected one per rank ({}), each at most the {} batch(es) of an "
                         "epoch (steps / epochs)",
                         counts.size(), most, run.world_size, per_epoch));
    }
    const auto& eval = run.torchrec_eval_batches;
    const int64_t most_eval = eval.empty() ? 0 : *std::max_element(eval.begin(), eval.end());
    if (!eval.empty() &&
        ((eval.size() != 1 && static_cast<int>(eval.size()) != run.world_size) || most_eval > per_epoch)) {
      r.fail(root["torchrec"]["eval_batches"], "torchrec.eval_batches",
             fmt::format(
                 "has {} count(s) up to {}; expected one, or one per rank ({}), each at most the {} batch(es) of an "
                 "epoch (an eval pass reads the epoch's own batches)",
                 eval.size(), most_eval, run.world_size, per_epoch));
    }
    if (run.resume && !eval.empty()) refuse_with("resume", "a release resumes in the plain loop, without eval passes");
    // A persistent iterator differs from a fresh one only when it is re-armed for a second pass.
    if (run.torchrec_data_iterator == "persistent" && run.torchrec_epochs == 1 && eval.empty()) {
      r.fail(root["torchrec"]["data_iterator"], "torchrec.data_iterator",
             "persistent re-arms one iterator for every pass, and this run has one pass (epochs: 1, no "
             "eval_batches): it would be the fresh iterator under another name; add epochs or eval_batches");
    }
    for (const auto& [table, c] : run.resume ? run.resume->constraints : decltype(run.constraints){}) {
      if (!c.ranks.empty()) {
        refuse_with("resume", fmt::format("resume.sharding pins table '{}' to ranks, and TorchRec's "
                                          "ParameterConstraints has no field for that",
                                          table));
      }
    }
    for (const auto& [table, c] : run.constraints) {
      if (!c.ranks.empty()) {
        refuse("tables", fmt::format("table '{}' pins its shards to ranks, and TorchRec's ParameterConstraints has "
                                     "no field for that: the release's planner would place them where it likes",
                                     table));
      }
    }
    size_t weighted = 0;
    for (const auto& t : run.model.tables) weighted += t.weighted ? 1 : 0;
    if (weighted != 0 && weighted != run.model.tables.size()) {
      refuse("tables",
             "TorchRec's EmbeddingBagCollection is weighted or not as a whole; make every table weighted or none");
    }
  }
  if (run.data.variable_batch()) {
    // Variable batch per feature: the EmbeddingBagCollection's and EmbeddingCollection's outputs
    // are expanded back to the batch through the inverse indices.
    if (run.torchrec_module != "embedding_bag_collection") {
      r.fail(root["torchrec"]["module"], "torchrec.module",
             "variable batches (stride_per_rank, inverse_indices) go to an EmbeddingBagCollection; a plain "
             "nn.EmbeddingBag takes no inverse indices");
    }
    if (run.resume && run.resume->world_size != run.world_size) {
      r.fail(root["resume"]["world_size"], "resume.world_size",
             fmt::format("variable batches are laid out per rank of the run's {} ranks; a resume at another world "
                         "size would split them otherwise",
                         run.world_size));
    }
  }
  if (!run.on_torchrec() && run.torchrec_is_weighted) {
    // The reference applies a weighted table's weights: is_weighted is the release's EBC flag.
    r.fail(root["torchrec"]["is_weighted"], "torchrec.is_weighted",
           fmt::format("is TorchRec's EmbeddingBagCollection flag; run '{}' runs on the reference, which applies a "
                       "weighted table's weights (select release cells with 'when: {{system: torchrec==X.Y.Z}}')",
                       run.name));
  }
}

void check_system_can_judge(const Reader& r, const YAML::Node& node, const std::string& path, const RunSpec& run) {
  const bool counts_loop = run.expect.loop_batches || !run.expect.loop_batches_per_epoch.empty() ||
                           run.expect.next_after_exhausted || run.expect.loop_eval_batches;
  if (!run.expect.observed.empty() && (!run.on_torchrec() || run.torchrec_hooks.empty())) {
    r.fail(node["observed"], path + ".observed",
           fmt::format("judges what a release cell's hooks return; run '{}' {}", run.name,
                       run.on_torchrec() ? "has no torchrec.hooks"
                                         : "runs on the reference, which runs no hooks (select release cells with "
                                           "'when: {system: torchrec==X.Y.Z}')"));
  }
  if (counts_loop && run.on_torchrec() && run.resume) {
    r.fail(
        node["loop"], path + ".loop",
        fmt::format("counts the loop of one run; run '{}' resumes in a second one (judge it with resumed)", run.name));
  }
  if (run.expect.loop_eval_batches && run.on_torchrec() && run.torchrec_eval_batches.empty()) {
    r.fail(node["loop"], path + ".loop.eval_batches",
           fmt::format("counts eval passes; run '{}' has none (torchrec.eval_batches)", run.name));
  }
  if (!run.expect.loop_batches_per_epoch.empty() &&
      static_cast<int>(run.expect.loop_batches_per_epoch.size()) != run.torchrec_epochs) {
    r.fail(node["loop"], path + ".loop.batches",
           fmt::format("lists {} count(s); expected one per epoch ({}) of run '{}'",
                       run.expect.loop_batches_per_epoch.size(), run.torchrec_epochs, run.name));
  }
  if (run.expect.resumed && (!run.on_torchrec() || !run.resume)) {
    r.fail(node["resumed"], path + ".resumed",
           fmt::format(
               "compares a release's resumed run with its uninterrupted one; run '{}' {}", run.name,
               run.on_torchrec() ? "has no resume" : "runs on the reference (its resume is judged by global_model)"));
  }
  if (counts_loop && !run.on_torchrec()) {
    r.fail(node["loop"], path + ".loop",
           fmt::format("counts what a release's training loop asked of its data; run '{}' runs on the reference "
                       "(select release cells with 'when: {{system: torchrec==X.Y.Z}}')",
                       run.name));
  }
  if (const auto why = reference_cannot_model(run); why && run.expect.reference) {
    r.fail(node["reference"], path + ".reference",
           fmt::format("{}, so it cannot run the comparison (run '{}')", *why, run.name));
  }
  if (run.expect.reference && !run.on_torchrec()) {
    r.fail(node["reference"], path + ".reference",
           fmt::format("compares a TorchRec release with the reference; run '{}' runs on the reference itself "
                       "(select release cells with 'when: {{system: torchrec==X.Y.Z}}')",
                       run.name));
  }
  if (run.expect.quantized || run.expect.quantized_sharded) {
    const YAML::Node at = run.expect.quantized ? node["quantized"] : node["quantized_sharded"];
    const std::string field = path + (run.expect.quantized ? ".quantized" : ".quantized_sharded");
    if (!run.on_torchrec()) {
      r.fail(at, field,
             fmt::format("quantizes through a release's own path (quantize_embeddings, its quant sharders); run '{}' "
                         "runs on the reference, which does not model quantized lookups yet (select release cells "
                         "with 'when: {{system: torchrec==X.Y.Z}}')",
                         run.name));
    }
    if (run.torchrec_module != "embedding_bag_collection") {
      r.fail(at, field,
             fmt::format("quantizes an EmbeddingBagCollection; run '{}' shards a {}", run.name, run.torchrec_module));
    }
    // The whole trained model is quantized: its EmbeddingBagCollection and its EmbeddingCollection.
    std::vector<std::string> plain = tables_without(run, run.quant);
    const std::vector<std::string> sequence = tables_without(run, run.quant, /*sequence=*/true);
    plain.insert(plain.end(), sequence.begin(), sequence.end());
    if (!plain.empty()) {
      r.fail(at, field,
             fmt::format("needs every table's quantized data type; {} of run '{}' {} no 'quant' (int8, int4, "
                         "int2 or fp16)",
                         fmt::join(plain, ", "), run.name, plain.size() == 1 ? "has" : "have"));
    }
    const bool has_sequence =
        std::any_of(run.model.tables.begin(), run.model.tables.end(), [](const auto& t) { return t.sequence; });
    if (has_sequence && run.data.variable_batch()) {
      r.fail(at, field,
             fmt::format("quantizes sequence tables on a plain batch; run '{}' has a variable batch per feature "
                         "(data.stride_per_rank), which dmpcheck hands only to a quantized EmbeddingBagCollection",
                         run.name));
    }
    if (run.resume) {
      r.fail(at, field, fmt::format("quantizes one run's trained model; run '{}' resumes in a second", run.name));
    }
  }
  if (run.expect.initial_state && run.init.from.empty()) {
    r.fail(node["initial_state"], path + ".initial_state",
           fmt::format("compares the initial state with init.from; run '{}' has no init.from", run.name));
  }
  if (run.on_torchrec() && !run.init.from.empty() && run.expect.reference) {
    r.fail(node["reference"], path + ".reference",
           fmt::format("a release cell that starts from init.from is not compared with the reference (run '{}'); "
                       "check it with initial_state",
                       run.name));
  }
}

}  // namespace detail
}  // namespace dmpcheck::scenario
