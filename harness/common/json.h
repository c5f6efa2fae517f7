// std::optional as null or the value, for every JSON mapping of the tree (a run's failure, a
// method's device time, a task's reference half).
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

template <typename T>
struct nlohmann::adl_serializer<std::optional<T>> {
  static void to_json(json& j, const std::optional<T>& v) { j = v ? json(*v) : json(nullptr); }
  static void from_json(const json& j, std::optional<T>& v) {
    v = j.is_null() ? std::nullopt : std::optional<T>(j.get<T>());
  }
};
