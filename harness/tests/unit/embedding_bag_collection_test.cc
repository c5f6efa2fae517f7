#include "dmp/embedding_bag_collection.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "common/error.h"

namespace dmpcheck::dmp {
namespace {

std::vector<EmbeddingBagConfig> tables() {
  return {{"t0", 100, 4, {"f0"}, PoolingType::kSum}, {"t1", 25, 2, {"f1", "f2"}, PoolingType::kMean}};
}

TEST(EmbeddingBagCollection, ResetParametersUsesTorchRecsDefaultBoundsAndTheGenerator) {
  EmbeddingBagCollection a(tables()), b(tables());
  at::Generator ga = at::make_generator<at::CPUGeneratorImpl>(7), gb = at::make_generator<at::CPUGeneratorImpl>(7);
  a.reset_parameters(ga);
  b.reset_parameters(gb);
  EXPECT_TRUE(a.weight("t0").equal(b.weight("t0")));
  EXPECT_LE(a.weight("t0").abs().max().item<double>(), 0.1);  // sqrt(1/100)
  EXPECT_LE(a.weight("t1").abs().max().item<double>(), 0.2);  // sqrt(1/25)
  at::Generator other = at::make_generator<at::CPUGeneratorImpl>(8);
  b.reset_parameters(other);
  EXPECT_FALSE(a.weight("t0").equal(b.weight("t0")));
}

TEST(EmbeddingBagCollection, ForwardIsKeyedByFeatureInTableOrder) {
  EmbeddingBagCollection ebc(tables());
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1);
  ebc.reset_parameters(g);
  // Keys given in another order than the collection's: the output follows the collection.
  KeyedJaggedTensor kjt({"f2", "f0", "f1"}, at::tensor({3, 4, 9, 9, 1}, at::kLong),
                        at::tensor({2, 0, 1, 1, 0, 1}, at::kLong));
  const KeyedTensor out = ebc.forward(kjt);
  EXPECT_EQ(out.keys, (std::vector<std::string>{"f0", "f1", "f2"}));
  EXPECT_EQ(out.values.sizes(), (at::IntArrayRef{2, 8}));
  const at::Tensor& t0 = ebc.weight("t0");
  const at::Tensor& t1 = ebc.weight("t1");
  EXPECT_TRUE(out.at_key("f0")[0].equal(t0[9]));
  EXPECT_TRUE(out.at_key("f2")[0].allclose((t1[3] + t1[4]) / 2));  // mean pooling
  EXPECT_TRUE(out.at_key("f2")[1].equal(at::zeros({2})));          // empty bag
}

// A feature two tables read is two lookups, keyed "<feature>@<table>" as TorchRec keys them;
// a table that lists a feature twice is refused.
TEST(EmbeddingBagCollection, AFeatureSeveralTablesReadIsKeyedFeatureAtTable) {
  EmbeddingBagCollection ebc({{"a", 3, 2, {"f"}, PoolingType::kSum}, {"b", 4, 1, {"f", "g"}, PoolingType::kSum}});
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1);
  ebc.reset_parameters(g);
  KeyedJaggedTensor kjt({"f", "g"}, at::tensor({2, 3}, at::kLong), at::tensor({1, 0, 0, 1}, at::kLong));
  const KeyedTensor out = ebc.forward(kjt);
  EXPECT_EQ(out.keys, (std::vector<std::string>{"f@a", "f@b", "g"}));
  EXPECT_TRUE(out.at_key("f@a")[0].equal(ebc.weight("a")[2]));
  EXPECT_TRUE(out.at_key("f@b")[0].equal(ebc.weight("b")[2]));
  EXPECT_TRUE(out.at_key("g")[1].equal(ebc.weight("b")[3]));
  EXPECT_THROW(EmbeddingBagCollection({{"a", 1, 1, {"f", "f"}, PoolingType::kSum}}), Error);
}

}  // namespace
}  // namespace dmpcheck::dmp
