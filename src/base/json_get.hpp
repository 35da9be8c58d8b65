// The one way the library reads a value out of a JSON answer: never throws. A key that is
// missing, null, of another type, or a number that does not fit the type asked for reads
// as the default given. Integers are read only from JSON integers (a float is another
// type); an unsigned integer above INT64_MAX does not fit an int64_t.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include <nlohmann/json.hpp>

namespace qsw {

// The integer `j[key]`, or none (j not an object, key absent, not a JSON integer, or out of
// int64_t's range).
inline std::optional<int64_t> json_find_int(const nlohmann::json &j, std::string_view key) {
    if (!j.is_object()) return std::nullopt;
    const auto it = j.find(key);
    if (it == j.end()) return std::nullopt;
    if (it->is_number_unsigned()) {
        const uint64_t u = it->get<uint64_t>();
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
        return static_cast<int64_t>(u);
    }
    if (it->is_number_integer()) return it->get<int64_t>();
    return std::nullopt;
}

// The value `j[key]` as a T, or `def` (j not an object, key absent, null, other type).
template <class T>
T json_get(const nlohmann::json &j, std::string_view key, T def) {
    if (!j.is_object()) return def;
    const auto it = j.find(key);
    if (it == j.end()) return def;
    const nlohmann::json &v = *it;
    if constexpr (std::is_same_v<T, bool>) {
        return v.is_boolean() ? v.get<bool>() : def;
    } else if constexpr (std::is_same_v<T, int64_t>) {
        return json_find_int(j, key).value_or(def);
    } else if constexpr (std::is_same_v<T, double>) {
        return v.is_number() ? v.get<double>() : def;
    } else if constexpr (std::is_same_v<T, std::string>) {
        return v.is_string() ? v.get<std::string>() : def;
    } else {
        static_assert(!sizeof(T), "json_get: bool, int64_t, double or std::string");
    }
}

// String literals as the default read as std::string.
inline std::string json_get(const nlohmann::json &j, std::string_view key, const char *def) {
    return json_get<std::string>(j, key, std::string(def));
}

}  // namespace qsw
