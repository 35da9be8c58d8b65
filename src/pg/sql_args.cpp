#include "pg/sql_args.hpp"

namespace qsw {

// Each element double-quoted, with `"` and `\` escaped: runs without either are copied
// whole.
void TextArrayLiteral::add(std::string_view item) {
    if (any_) s_ += ',';
    any_ = true;
    s_ += '"';
    size_t from = 0;
    for (size_t at; (at = item.find_first_of("\"\\", from)) != std::string_view::npos; from = at + 1) {
        s_.append(item, from, at - from);
        s_ += '\\';
        s_ += item[at];
    }
    s_.append(item, from);
    s_ += '"';
}

void TextArrayLiteral::add_null() {
    if (any_) s_ += ',';
    any_ = true;
    s_ += "NULL";
}

std::string TextArrayLiteral::finish() && {
    s_ += '}';
    return std::move(s_);
}

std::string pg_text_array(const std::vector<std::string> &items) {
    TextArrayLiteral a;
    for (const std::string &item : items) a.add(item);
    return std::move(a).finish();
}

std::string pg_int_array(const std::vector<int64_t> &items) {
    std::string s = "{";
    for (size_t i = 0; i < items.size(); ++i) {
        if (i) s += ',';
        s += std::to_string(items[i]);
    }
    s += '}';
    return s;
}

static void put_be32(std::string &s, uint32_t v) {
    s += static_cast<char>((v >> 24) & 0xff);
    s += static_cast<char>((v >> 16) & 0xff);
    s += static_cast<char>((v >> 8) & 0xff);
    s += static_cast<char>(v & 0xff);
}

std::string pg_bytea_array_binary(const std::vector<std::string_view> &items) {
    size_t total = 20;
    for (auto i : items) total += 4 + i.size();
    std::string s;
    s.reserve(total);
    put_be32(s, 1);   // ndim
    put_be32(s, 0);   // no NULLs
    put_be32(s, 17);  // element type: bytea
    put_be32(s, static_cast<uint32_t>(items.size()));
    put_be32(s, 1);   // lower bound
    for (auto i : items) {
        put_be32(s, static_cast<uint32_t>(i.size()));
        s.append(i.data(), i.size());
    }
    return s;
}

std::string shards_param(const std::vector<int16_t> &shards) {
    std::string s = "{";
    for (size_t i = 0; i < shards.size(); ++i) {
        if (i) s += ',';
        s += std::to_string(shards[i]);
    }
    return s + "}";
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bool parse_i64(std::string_view t, int64_t &out) {
    if (t.empty() || t.size() > 20) return false;
    size_t i = 0;
    const bool neg = t[0] == '-';
    if (neg) i = 1;
    if (i == t.size()) return false;
    // Accumulate negatively so INT64_MIN parses too.
    int64_t v = 0;
    for (; i < t.size(); ++i) {
        if (t[i] < '0' || t[i] > '9') return false;
        const int d = t[i] - '0';
        if (v < (INT64_MIN + d) / 10) return false;
        v = v * 10 - d;
    }
    if (!neg) {
        if (v == INT64_MIN) return false;
        v = -v;
    }
    out = v;
    return true;
}

bool is_tid_text(std::string_view t) {
    if (t.size() < 5 || t.front() != '(' || t.back() != ')') return false;
    const size_t comma = t.find(',');
    if (comma == std::string_view::npos) return false;
    const std::string_view block = t.substr(1, comma - 1), offset = t.substr(comma + 1, t.size() - comma - 2);
    int64_t b = 0, o = 0;
    for (std::string_view part : {block, offset})
        if (part.empty() || part.size() > 10 || part.find_first_not_of("0123456789") != std::string_view::npos)
            return false;
    if (!parse_i64(block, b) || !parse_i64(offset, o)) return false;
    return b <= 4294967295LL && o >= 1 && o <= 65535;
}

bool pg_bytea_from_text(std::string_view t, std::string &out) {
    out.clear();
    if (t.size() < 2 || t[0] != '\\' || t[1] != 'x' || (t.size() % 2) != 0) return false;
    out.resize((t.size() - 2) / 2);
    for (size_t i = 2, o = 0; i < t.size(); i += 2, ++o) {
        int hi = hexval(t[i]), lo = hexval(t[i + 1]);
        if (hi < 0 || lo < 0) return false;
        out[o] = static_cast<char>((hi << 4) | lo);
    }
    return true;
}

}  // namespace qsw
