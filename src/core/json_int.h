// A JSON value read as an integer only when it is one: nlohmann's get<int>() of a float such as 1e300 (or of a
// 43-digit number, which it parses as a float) is a float-to-int cast, undefined behaviour; readers of outside
// JSON ask here instead.
#pragma once
#include <cstdint>
#include <optional>

namespace lily {

// The value of j if it is a JSON integer within [lo, hi]; nullopt for a float, a string, anything else, or an
// integer outside. Json: nlohmann::json or ordered_json.
template <class Json>
std::optional<int64_t> json_int(const Json& j, int64_t lo, int64_t hi) {
  if (!j.is_number_integer()) return std::nullopt;
  int64_t v;
  if (j.is_number_unsigned()) {
    const uint64_t u = j.template get<uint64_t>();
    if (hi < 0 || u > uint64_t(hi)) return std::nullopt;
    v = int64_t(u);
  } else {
    v = j.template get<int64_t>();
  }
  if (v < lo || v > hi) return std::nullopt;
  return v;
}

}  // namespace lily
