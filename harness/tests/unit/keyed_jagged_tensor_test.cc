#include "dmp/keyed_jagged_tensor.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "test_util.h"

namespace dmpcheck::dmp {
namespace {

at::Tensor longs(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    return e.what();
  }
  return "no error";
}

TEST(KeyedJaggedTensor, OffsetsAndPerKeyViews) {
  KeyedJaggedTensor kjt({"f0", "f1"}, longs({5, 7, 9, 3}), longs({1, 2, 0, 1}));
  EXPECT_EQ(kjt.stride(), 2);
  EXPECT_TRUE(kjt.offsets().equal(longs({0, 1, 3, 3, 4})));
  EXPECT_TRUE(kjt.values_of(0).equal(longs({5, 7, 9})));
  EXPECT_TRUE(kjt.values_of(1).equal(longs({3})));
  EXPECT_TRUE(kjt.lengths_of(1).equal(longs({0, 1})));
}

TEST(KeyedJaggedTensor, SliceBatchTakesTheSameBagsOfEveryKey) {
  KeyedJaggedTensor kjt({"f0", "f1"}, longs({5, 7, 9, 3, 4}), longs({1, 2, 0, 2}));
  KeyedJaggedTensor second = kjt.slice_batch(1, 2);
  EXPECT_EQ(second.stride(), 1);
  EXPECT_TRUE(second.values().equal(longs({7, 9, 3, 4})));
  EXPECT_TRUE(second.lengths().equal(longs({2, 2})));
  KeyedJaggedTensor back = KeyedJaggedTensor::concat_batches({kjt.slice_batch(0, 1), second});
  EXPECT_TRUE(back.values().equal(kjt.values()));
  EXPECT_TRUE(back.lengths().equal(kjt.lengths()));
}

TEST(KeyedJaggedTensor, SelectReordersKeys) {
  KeyedJaggedTensor kjt({"f0", "f1"}, longs({5, 7, 9, 3}), longs({1, 2, 0, 1}));
  KeyedJaggedTensor swapped = kjt.select({"f1", "f0"});
  EXPECT_EQ(swapped.keys(), (std::vector<std::string>{"f1", "f0"}));
  EXPECT_TRUE(swapped.values().equal(longs({3, 5, 7, 9})));
  EXPECT_TRUE(swapped.lengths().equal(longs({0, 1, 1, 2})));
}

TEST(KeyedJaggedTensor, RejectsLengthsThatDoNotSumToValues) {
  const std::string message = error_of([] { KeyedJaggedTensor({"f0"}, longs({1, 2}), longs({1, 2})); });
  EXPECT_TRUE(testing::contains(message, "lengths sum to 3 but there are 2 values"));
}

TEST(KeyedJaggedTensor, RejectsNegativeLengthsNamingKeyAndBag) {
  const std::string message = error_of([] { KeyedJaggedTensor({"f0", "f1"}, longs({1}), longs({1, 0, 1, -1})); });
  EXPECT_TRUE(testing::contains(message, "negative length -1 for key 'f1', bag 1"));
}

TEST(KeyedJaggedTensor, RejectsLengthsNotAMultipleOfKeys) {
  const std::string message = error_of([] { KeyedJaggedTensor({"f0", "f1"}, longs({1, 2, 3}), longs({1, 1, 1})); });
  EXPECT_TRUE(testing::contains(message, "not a multiple of 2 keys"));
}

TEST(KeyedJaggedTensor, RejectsDuplicateKeysAndFloatIds) {
  EXPECT_TRUE(testing::contains(error_of([] { KeyedJaggedTensor({"a", "a"}, longs({}), longs({0, 0})); }), "unique"));
  EXPECT_TRUE(testing::contains(error_of([] { KeyedJaggedTensor({"a"}, at::ones({1}), longs({1})); }), "int64"));
}

TEST(KeyedJaggedTensor, RejectsWeightsOfTheWrongSize) {
  const std::string message = error_of([] { KeyedJaggedTensor({"f0"}, longs({1, 2}), longs({2}), at::ones({3})); });
  EXPECT_TRUE(testing::contains(message, "one weight per id (2)"));
}

TEST(KeyedJaggedTensor, UnknownKeyIsAnError) {
  KeyedJaggedTensor kjt({"f0"}, longs({1}), longs({1}));
  EXPECT_TRUE(testing::contains(error_of([&] { kjt.key_index("nope"); }), "no key 'nope'"));
}

}  // namespace
}  // namespace dmpcheck::dmp
