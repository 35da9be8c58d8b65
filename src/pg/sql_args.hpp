// Encoding of array parameters for libpq and decoding of bytea results. Text
// arrays are quoted element by element; bytea arrays go in PostgreSQL's binary
// array format so an 8 MiB segment is not doubled into hex on the way.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pg/pg_conn.hpp"

namespace qsw {

constexpr Oid kByteaArrayOid = 1001;

std::string pg_text_array(const std::vector<std::string> &items);
// The same literal built element by element, for a caller whose elements are not already
// in one vector (the fire's keys, tokens and addresses, one per claimed row).
class TextArrayLiteral {
public:
    TextArrayLiteral() : s_("{") {}
    void add(std::string_view item);
    void add_null();  // an element that is NULL
    std::string finish() &&;  // the literal; the builder is spent

private:
    std::string s_;
    bool any_ = false;
};
std::string pg_int_array(const std::vector<int64_t> &items);
std::string pg_bytea_array_binary(const std::vector<std::string_view> &items);
// A bytea column in text form ("\x0a1b...") back to its bytes.
bool pg_bytea_from_text(std::string_view text, std::string &out);
// A decimal int64 as PostgreSQL prints it; false on anything else (never throws).
bool parse_i64(std::string_view text, int64_t &out);
// A tid as PostgreSQL prints it: "(block,offset)", block 0..4294967295, offset 1..65535,
// decimal digits only. Anything else is false (never throws).
bool is_tid_text(std::string_view text);
// The shard visiting order as an int2[] literal.
std::string shards_param(const std::vector<int16_t> &shards);

inline QueryParam text_param(std::string v) { return QueryParam{std::move(v), false, false, 0}; }
inline QueryParam null_param() { return QueryParam{std::string(), true, false, 0}; }
inline QueryParam binary_param(std::string v, Oid type) { return QueryParam{std::move(v), false, true, type}; }

}  // namespace qsw
