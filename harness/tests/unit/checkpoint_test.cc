#include "dmp/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include "common/error.h"

namespace dmpcheck::dmp {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()))).string();
}

TEST(Checkpoint, UnshardedRoundTripIsBitwise) {
  FullState state;
  state.steps = 7;
  state.tensors["ebc.embedding_bags.t.weight"] = at::randn({5, 3});
  state.tensors["ebc.embedding_bags.t.momentum1"] = at::rand({5});
  state.tensors["dense.0.bias"] = at::randn({2});
  const std::string path = temp_path("unsharded.pt");
  save_unsharded_checkpoint(path, state);
  const FullState back = load_checkpoint(path);
  EXPECT_EQ(back.steps, 7);
  ASSERT_EQ(back.tensors.size(), 3u);
  for (const auto& [name, t] : state.tensors) EXPECT_TRUE(t.equal(back.tensors.at(name))) << name;
  std::filesystem::remove(path);
}

TEST(Checkpoint, BatchesAreTorchLoadableDicts) {
  KeyedJaggedTensor batch({"f0", "f1"}, at::tensor({1, 2, 3}, at::kLong), at::tensor({2, 0, 1, 0}, at::kLong));
  const std::string path = temp_path("batch.pt");
  save_batch(path, batch);
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto dict = torch::jit::pickle_load(bytes).toGenericDict();
  EXPECT_TRUE(dict.at("values").toTensor().equal(batch.values()));
  EXPECT_TRUE(dict.at("lengths").toTensor().equal(batch.lengths()));
  EXPECT_EQ(dict.at("stride").toInt(), 2);
  EXPECT_EQ(dict.at("keys").toList().size(), 2u);
  std::filesystem::remove(path);
}

TEST(Checkpoint, AFileOfAnotherKindIsACleanError) {
  const std::string path = temp_path("not-a-checkpoint.pt");
  std::ofstream(path) << "hello";
  try {
    load_checkpoint(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("is not a torch-serialised file"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
  EXPECT_THROW(load_checkpoint("/nonexistent/dir"), Error);
}

}  // namespace
}  // namespace dmpcheck::dmp
