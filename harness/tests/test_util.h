// Checks shared by the unit and the multi-process tests.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "common/error.h"

namespace dmpcheck::testing {

// For EXPECT_TRUE: `text` holds `needle` (the failure shows `text`).
inline ::testing::AssertionResult contains(const std::string& text, const std::string& needle) {
  if (text.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "no '" << needle << "' in: " << text;
}

// For EXPECT_TRUE: `f` throws an Error (of `kind`, where given) whose message holds `needle`.
inline ::testing::AssertionResult throws_with(std::optional<ErrorKind> kind, const std::string& needle,
                                              const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    if (kind && e.kind() != *kind) return ::testing::AssertionFailure() << "an error of another kind: " << e.what();
    return contains(e.what(), needle);
  }
  return ::testing::AssertionFailure() << "no error";
}
inline ::testing::AssertionResult throws_with(const std::string& needle, const std::function<void()>& f) {
  return throws_with(std::nullopt, needle, f);
}

}  // namespace dmpcheck::testing
