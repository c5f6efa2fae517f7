// One name<->value table per enum: the loader reads a value through it, the *_name functions and
// the reports write it, so each name is spelt once.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dmpcheck {

template <typename E>
struct Named {
  E value;
  const char* name;
};

template <typename E, size_t N>
constexpr const char* name_in(const Named<E> (&table)[N], E value) {
  for (const auto& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "unknown";
}

template <typename E, size_t N>
std::optional<E> value_in(const Named<E> (&table)[N], std::string_view name) {
  for (const auto& entry : table) {
    if (name == entry.name) return entry.value;
  }
  return std::nullopt;
}

// Whether `text` ends with `end` (a tensor name's ".weight", a type's "." + name).
inline bool ends_with(std::string_view text, std::string_view end) {
  return text.size() >= end.size() && text.substr(text.size() - end.size()) == end;
}

template <typename E, size_t N>
std::vector<std::string> names_in(const Named<E> (&table)[N]) {
  std::vector<std::string> names;
  for (const auto& entry : table) names.emplace_back(entry.name);
  return names;
}

}  // namespace dmpcheck
