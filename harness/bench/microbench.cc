// dmpcheck_microbench: Google Benchmark micro benchmarks of the pieces a training step is made
// of, each reporting the bytes it moves, and at the end the ratios docs/performance.md quotes,
// measured side by side in this one run:
//  * a data-parallel DMP training step at world 1 (Gloo) against the same model trained
//    unsharded in this process with the same optimizers (what the DMP machinery costs);
//  * fused Adagrad on 1M x 128 fp32 with 64K unique rows per step, in GB/s, against memcpy.
// Intra-op threads are 1 (override with DMPCHECK_BENCH_THREADS) so memcpy and the kernels
// compare on one core.
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "comm/gloo/gloo_communicator.h"
#include "comm/store.h"
#include "dmp/dense.h"
#include "dmp/embedding_bag_collection.h"
#include "dmp/keyed_jagged_tensor.h"
#include "dmp/model_parallel.h"
#include "dmp/optim/dense_optimizer.h"
#include "dmp/optim/fused_optimizer.h"
#include "dmp/planner.h"
#include "dmp/pooling.h"
#include "run/data_generator.h"
#include "scenario/scenario.h"

namespace dmpcheck::bench {
namespace {

// Each byte read plus each byte written, per iteration: what the GB/s ratios divide.
void report_bytes(benchmark::State& state, int64_t bytes) {
  state.counters["bytes"] = static_cast<double>(bytes);
  state.SetBytesProcessed(state.iterations() * bytes);
}

constexpr int64_t kFloat = 4;

// ---------------------------------------------------------------------------------------------
// memcpy: the machine's copy bandwidth, bytes read + bytes written.
void memcpy_bandwidth(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  std::vector<char> source(bytes, 1);
  std::vector<char> target(bytes, 0);
  for (auto _ : state) {
    std::memcpy(target.data(), source.data(), bytes);
    benchmark::DoNotOptimize(target.data());
    benchmark::ClobberMemory();
  }
  report_bytes(state, static_cast<int64_t>(2 * bytes));
}

// ---------------------------------------------------------------------------------------------
// Fused optimizers: one step over `unique` distinct rows of a rows x dim table.
// Bytes per step: the gradient read, each touched row of the weight and of every state tensor
// read and written (row-wise state: one float per row).
void fused_optimizer(benchmark::State& state, dmp::FusedOptimizerType type) {
  const int64_t rows = state.range(0);
  const int64_t dim = state.range(1);
  const int64_t unique = state.range(2);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor weight = at::rand({rows, dim}, generator);
  dmp::FusedOptimizerConfig config;
  config.type = type;
  config.learning_rate = 0.01;
  dmp::FusedOptimizer optimizer(config, rows, dim);
  dmp::RowGradients grads;
  grads.rows = std::get<0>(at::randperm(rows, generator).narrow(0, 0, unique).sort());
  grads.grads = at::randn({unique, dim}, generator);
  int64_t state_floats_per_row = 0;
  for (const auto& spec : dmp::FusedOptimizer::state_specs(config, rows, dim)) {
    state_floats_per_row += spec.sizes.size() == 2 ? dim : 1;
  }
  const int64_t bytes = unique * kFloat * (dim + 2 * dim + 2 * state_floats_per_row);
  for (auto _ : state) optimizer.apply(weight, grads);
  report_bytes(state, bytes);
  state.SetItemsProcessed(state.iterations() * unique);  // rows/s
}

// ---------------------------------------------------------------------------------------------
// KJT and pooling on a batch of `batch` bags of about `ids` ids each over a rows x dim table.
dmp::Bags random_bags(int64_t batch, int64_t ids_per_bag, int64_t rows, uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor lengths = at::randint(0, 2 * ids_per_bag + 1, {batch}, generator, at::kLong);
  const int64_t n = lengths.sum().item<int64_t>();
  return dmp::Bags{at::randint(0, rows, {n}, generator, at::kLong), lengths, std::nullopt};
}

int64_t bags_bytes(const dmp::Bags& bags) { return (bags.ids.numel() + bags.lengths.numel()) * 8; }

void kjt_bucketize(benchmark::State& state) {
  const int64_t rows = 1 << 20;
  const dmp::Bags bags = random_bags(state.range(0), 20, rows, 1);
  int64_t bytes = 0;
  for (auto _ : state) {
    // One row-wise shard of half the table: what each owner's bucket costs.
    dmp::Bags part = dmp::bucketize_rows(bags, rows / 2, rows / 2);
    bytes = bags_bytes(bags) + bags_bytes(part);
    benchmark::DoNotOptimize(part.ids.data_ptr());
  }
  report_bytes(state, bytes);
  state.SetItemsProcessed(state.iterations() * bags.ids.numel());
}

void kjt_permute(benchmark::State& state) {
  const int64_t keys = 8;
  const int64_t batch = state.range(0);
  std::vector<std::string> names;
  std::vector<at::Tensor> values, lengths;
  for (int64_t k = 0; k < keys; ++k) {
    const dmp::Bags bags = random_bags(batch, 20, 1 << 20, 10 + static_cast<uint64_t>(k));
    names.push_back(fmt::format("f{}", k));
    values.push_back(bags.ids);
    lengths.push_back(bags.lengths);
  }
  const dmp::KeyedJaggedTensor kjt(names, at::cat(values), at::cat(lengths));
  const std::vector<std::string> reversed(names.rbegin(), names.rend());
  const int64_t bytes = 2 * (kjt.values().numel() + kjt.lengths().numel()) * 8;  // read and written
  for (auto _ : state) {
    dmp::KeyedJaggedTensor permuted = kjt.select(reversed);
    benchmark::DoNotOptimize(permuted.values().data_ptr());
  }
  report_bytes(state, bytes);
}

void pooled_forward(benchmark::State& state) {
  const int64_t rows = 1 << 20;
  const int64_t dim = state.range(1);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor weight = at::rand({rows, dim}, generator);
  const dmp::Bags bags = random_bags(state.range(0), 20, rows, 2);
  const int64_t bytes = (bags.ids.numel() * dim + bags.lengths.numel() * dim) * kFloat + bags_bytes(bags);
  for (auto _ : state) {
    at::Tensor pooled = dmp::pooled_forward(weight, bags, dmp::PoolingType::kSum);
    benchmark::DoNotOptimize(pooled.data_ptr());
  }
  report_bytes(state, bytes);
}

void pooled_backward(benchmark::State& state) {
  const int64_t rows = 1 << 20;
  const int64_t dim = state.range(1);
  const dmp::Bags bags = random_bags(state.range(0), 20, rows, 2);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor grad = at::randn({bags.lengths.numel(), dim}, generator);
  int64_t bytes = 0;
  for (auto _ : state) {
    dmp::RowGradients g = dmp::pooled_backward(grad, bags, dmp::PoolingType::kSum);
    bytes = (grad.numel() + bags.ids.numel() * dim + g.grads.numel()) * kFloat + bags_bytes(bags);
    benchmark::DoNotOptimize(g.grads.data_ptr());
  }
  report_bytes(state, bytes);
}

// Flatten into one bucket and copy back, what a coalesced collective adds around the wire.
void flatten_unflatten(benchmark::State& state) {
  const int64_t tensors = state.range(0);
  const int64_t elements = state.range(1);
  std::vector<at::Tensor> parts;
  for (int64_t i = 0; i < tensors; ++i) parts.push_back(at::rand({elements}));
  const int64_t bytes = 2 * 2 * tensors * elements * kFloat;  // each copy reads and writes
  for (auto _ : state) {
    at::Tensor flat = at::cat(parts);
    int64_t offset = 0;
    for (auto& p : parts) {
      p.copy_(flat.narrow(0, offset, p.numel()));
      offset += p.numel();
    }
    benchmark::DoNotOptimize(flat.data_ptr());
  }
  report_bytes(state, bytes);
}

// ---------------------------------------------------------------------------------------------
// A training step: the DMP at world 1 against the same model unsharded.
const char* kStepScenario = R"(version: 1
name: bench-train-step
world_size: 1
batch_size: 512
init: {mode: seeded, seed: 1}
data: {seed: 5, ids_per_bag: [1, 20]}
tables:
  - {name: t0, rows: 100000, dim: 64, features: [f0], sharding: {types: [data_parallel]}}
  - {name: t1, rows: 100000, dim: 64, features: [f1], sharding: {types: [data_parallel]}}
  - {name: t2, rows: 50000, dim: 32, features: [f2, f3], sharding: {types: [data_parallel]}}
  - {name: t3, rows: 10000, dim: 32, features: [f4], pooling: mean, sharding: {types: [data_parallel]}}
dense: {layers: [64, 1]}
optimizers:
  sparse: {type: adagrad, lr: 0.01}
  dense: {type: adam, lr: 0.001}
)";

constexpr int kBatches = 8;

struct StepFixture {
  scenario::Scenario scenario = scenario::load_scenario_text(kStepScenario, "bench-train-step.yaml");
  const scenario::RunSpec& spec = scenario.runs.at(0);
  std::vector<dmp::KeyedJaggedTensor> batches;
  StepFixture() {
    for (int s = 0; s < kBatches; ++s) batches.push_back(run::make_global_batch(spec, s));
  }
};

void train_step_dmp(benchmark::State& state) {
  StepFixture f;
  comm::Store store = comm::Store::host("127.0.0.1", "microbench", std::chrono::seconds(30));
  comm::GlooOptions gloo;
  auto communicator = comm::make_gloo_communicator(store, 0, 1, gloo);
  const dmp::ShardingPlan plan = dmp::plan_sharding(scenario::planner_input(f.spec, 1), f.spec.profile);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(f.spec.init.seed);
  dmp::DistributedModelParallel model(*communicator, f.spec.model, plan, generator,
                                      {f.spec.profile, f.spec.sparse_optimizer, f.spec.dense_optimizer});
  int step = 0;
  for (auto _ : state) benchmark::DoNotOptimize(model.train_step(f.batches[static_cast<size_t>(step++ % kBatches)]));
  state.SetItemsProcessed(state.iterations() * f.spec.batch_size);
}

void train_step_unsharded(benchmark::State& state) {
  StepFixture f;
  const dmp::ModelConfig& model = f.spec.model;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(f.spec.init.seed);
  dmp::EmbeddingBagCollection ebc(model.tables);
  ebc.reset_parameters(generator);
  dmp::DenseMlp mlp(model.pooled_width(), model.dense_layers, generator);
  dmp::DenseOptimizer dense_optimizer(f.spec.dense_optimizer, mlp.parameters());
  std::vector<std::unique_ptr<dmp::FusedOptimizer>> optimizers;
  for (const auto& t : model.tables) {
    optimizers.push_back(
        std::make_unique<dmp::FusedOptimizer>(f.spec.sparse_optimizer, t.num_embeddings, t.embedding_dim));
  }
  int step = 0;
  for (auto _ : state) {
    const dmp::KeyedJaggedTensor& batch = f.batches[static_cast<size_t>(step++ % kBatches)];
    std::vector<at::Tensor> pooled;
    std::vector<dmp::Bags> bags;
    {
      at::NoGradGuard no_grad;
      for (const auto& t : model.tables) {
        for (const auto& feature : t.feature_names) {
          const size_t k = batch.key_index(feature);
          bags.push_back({batch.values_of(k), batch.lengths_of(k), batch.weights_of(k)});
          pooled.push_back(dmp::pooled_forward(ebc.weight(t.name), bags.back(), t.pooling));
        }
      }
    }
    at::Tensor keyed = at::cat(pooled, 1);
    keyed.set_requires_grad(true);
    at::Tensor loss = mlp.forward(keyed).mean();
    loss.backward();
    {
      at::NoGradGuard no_grad;
      const at::Tensor grad = keyed.grad();
      int64_t column = 0;
      size_t b = 0;
      for (size_t i = 0; i < model.tables.size(); ++i) {
        const auto& t = model.tables[i];
        std::vector<dmp::RowGradients> parts;
        for (size_t j = 0; j < t.feature_names.size(); ++j, ++b) {
          parts.push_back(dmp::pooled_backward(grad.narrow(1, column, t.embedding_dim), bags[b], t.pooling));
          column += t.embedding_dim;
        }
        at::Tensor weight = ebc.weight(t.name);
        optimizers[i]->apply(weight, dmp::merge_row_gradients(parts));
      }
    }
    dense_optimizer.step();
    dense_optimizer.zero_grad();
    benchmark::DoNotOptimize(loss.item<double>());
  }
  state.SetItemsProcessed(state.iterations() * f.spec.batch_size);
}

// ---------------------------------------------------------------------------------------------
// Keeps every run so the ratios can be printed after the table.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& reports) override {
    ConsoleReporter::ReportRuns(reports);
    for (const auto& r : reports) {
      if (!r.error_occurred && r.run_type == Run::RT_Iteration) runs_[r.benchmark_name()] = r;
    }
  }
  // The run whose name starts with `prefix` (Google Benchmark appends the arguments).
  const Run* find(const std::string& prefix) const {
    for (const auto& [name, run] : runs_) {
      if (name.rfind(prefix, 0) == 0) return &run;
    }
    return nullptr;
  }
  static double seconds(const Run& r) { return r.real_accumulated_time / static_cast<double>(r.iterations); }
  static double gbps(const Run& r) {
    auto it = r.counters.find("bytes");
    return it == r.counters.end() ? 0.0 : it->second.value / seconds(r) / 1e9;
  }

 private:
  std::map<std::string, Run> runs_;
};

const std::pair<const char*, dmp::FusedOptimizerType> kFused[] = {
    {"sgd", dmp::FusedOptimizerType::kSgd},
    {"adagrad", dmp::FusedOptimizerType::kAdagrad},
    {"rowwise_adagrad", dmp::FusedOptimizerType::kRowWiseAdagrad},
    {"adam", dmp::FusedOptimizerType::kAdam}};

template <typename Fn>
void add(const std::string& name, benchmark::TimeUnit unit, const std::vector<int64_t>& args, Fn&& fn) {
  auto* b = benchmark::RegisterBenchmark(name.c_str(), std::forward<Fn>(fn));
  if (!args.empty()) b->Args(args);
  b->UseRealTime()->Unit(unit);
}

void register_all() {
  using benchmark::kMicrosecond, benchmark::kMillisecond;
  const int64_t mib = 1 << 20;
  add("memcpy/160MiB", kMillisecond, {160 * mib}, memcpy_bandwidth);
  for (const auto& [name, type] : kFused) {
    add(fmt::format("fused_{}/rows:1M/dim:128/unique:64K", name), kMillisecond, {1 << 20, 128, 1 << 16},
        [type = type](benchmark::State& s) { fused_optimizer(s, type); });
  }
  add("kjt_bucketize/batch:4096", kMicrosecond, {4096}, kjt_bucketize);
  add("kjt_permute/keys:8/batch:4096", kMicrosecond, {4096}, kjt_permute);
  add("pooled_forward/batch:4096/dim:128", kMicrosecond, {4096, 128}, pooled_forward);
  add("pooled_backward/batch:4096/dim:128", kMicrosecond, {4096, 128}, pooled_backward);
  add("flatten_unflatten/tensors:256/elements:4096", kMicrosecond, {256, 4096}, flatten_unflatten);
  add("flatten_unflatten/tensors:4/elements:16M", kMillisecond, {4, 16 * mib}, flatten_unflatten);
  add("train_step/unsharded", kMillisecond, {}, train_step_unsharded);
  add("train_step/dmp_data_parallel_world1_gloo", kMillisecond, {}, train_step_dmp);
}

}  // namespace
}  // namespace dmpcheck::bench

int main(int argc, char** argv) {
  using dmpcheck::bench::RatioReporter;
  const char* threads = std::getenv("DMPCHECK_BENCH_THREADS");
  at::set_num_threads(threads != nullptr ? std::max(1, std::atoi(threads)) : 1);
  dmpcheck::bench::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("\nratios measured in this run (intra-op threads: %d):\n", at::get_num_threads());
  const auto* dmp = reporter.find("train_step/dmp_data_parallel_world1_gloo");
  const auto* unsharded = reporter.find("train_step/unsharded");
  if (dmp && unsharded) {
    std::printf("  train step, DMP data-parallel at world 1 / unsharded: %.3fx  (%.3f ms / %.3f ms; bar <= 1.3x)\n",
                RatioReporter::seconds(*dmp) / RatioReporter::seconds(*unsharded), RatioReporter::seconds(*dmp) * 1e3,
                RatioReporter::seconds(*unsharded) * 1e3);
  }
  const auto* copy = reporter.find("memcpy/160MiB");
  for (const auto& [name, type] : dmpcheck::bench::kFused) {
    const auto* fused = reporter.find(fmt::format("fused_{}/rows:1M/dim:128/unique:64K", name));
    if (fused && copy) {
      std::printf("  fused %s, 1M x 128, 64K unique rows: %.2f GB/s = %.2fx memcpy's %.2f GB/s (%.2f M rows/s)\n", name,
                  RatioReporter::gbps(*fused), RatioReporter::gbps(*fused) / RatioReporter::gbps(*copy),
                  RatioReporter::gbps(*copy), 65536.0 / RatioReporter::seconds(*fused) / 1e6);
    }
  }
  std::printf("  (bytes: each byte read plus each byte written; GB = 1e9)\n");
  benchmark::Shutdown();
  return 0;
}
