#include "config/config.hpp"
#include "config/env_check.hpp"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "base/last_error.hpp"

namespace qsw {
namespace {

enum class Kind { boolean, integer, string };

struct Knob {
    const char *key;
    Kind kind;
    int64_t min = 0;
    int64_t max = 0;
    bool Config::*b = nullptr;
    int64_t Config::*i = nullptr;
    std::string Config::*s = nullptr;
};

constexpr int64_t kDay = 86400000;

Knob B(const char *k, bool Config::*m) { return Knob{k, Kind::boolean, 0, 0, m, nullptr, nullptr}; }
Knob I(const char *k, int64_t Config::*m, int64_t lo, int64_t hi) {
    return Knob{k, Kind::integer, lo, hi, nullptr, m, nullptr};
}
Knob S(const char *k, std::string Config::*m) { return Knob{k, Kind::string, 0, 0, nullptr, nullptr, m}; }

// Every knob of the design document and the reference, with its range. There is
// deliberately no shard-count knob: 64 shards are fixed forever.
const std::vector<Knob> &knobs() {
    static const std::vector<Knob> k = {
        B("sweeper", &Config::sweeper),
        // Never 0: the design document calls a zero floor a busy wait holding a maintenance
        // slot and a pooled connection, so it is refused like any other value out of range.
        I("sweeper_min_sleep_ms", &Config::sweeper_min_sleep_ms, 1, 3600000),
        I("sweeper_max_sleep_ms", &Config::sweeper_max_sleep_ms, 1, 3600000),
        I("sweeper_idle_max_sleep_ms", &Config::sweeper_idle_max_sleep_ms, 1, kDay),
        I("sweeper_idle_after_cycles", &Config::sweeper_idle_after_cycles, 0, 1000000),
        I("sweeper_empty_claim_min_ms", &Config::sweeper_empty_claim_min_ms, 0, 3600000),
        I("sweeper_empty_claim_max_ms", &Config::sweeper_empty_claim_max_ms, 0, 3600000),
        I("sweeper_lease_ms", &Config::sweeper_lease_ms, 100, kDay),
        I("sweeper_claim_batch", &Config::sweeper_claim_batch, 1, 100000),
        I("sweeper_claim_batch_max", &Config::sweeper_claim_batch_max, 1, 100000),
        I("sweeper_cycle_max_rows", &Config::sweeper_cycle_max_rows, 1, 10000000),
        I("sweeper_due_cap", &Config::sweeper_due_cap, 1, 10000000),
        I("sweeper_max_fire_bytes", &Config::sweeper_max_fire_bytes, 1024, int64_t(1) << 30),
        I("sweeper_claim_max_bytes", &Config::sweeper_claim_max_bytes, 65536, int64_t(1) << 30),
        I("sweeper_max_attempts", &Config::sweeper_max_attempts, 1, 1000),
        I("sweeper_parallelism", &Config::sweeper_parallelism, 1, 8),
        B("sweeper_isolate_on_permanent", &Config::sweeper_isolate_on_permanent),
        I("sweeper_fire_rate_per_tenant", &Config::sweeper_fire_rate_per_tenant, 1, 10000000),
        I("sweeper_backoff_min_ms", &Config::sweeper_backoff_min_ms, 1, kDay),
        I("sweeper_backoff_max_ms", &Config::sweeper_backoff_max_ms, 1, kDay),
        I("sweeper_transient_backoff_ms", &Config::sweeper_transient_backoff_ms, 1, kDay),
        I("kv_expire_every_ms", &Config::kv_expire_every_ms, 1, kDay),
        I("kv_expire_batch", &Config::kv_expire_batch, 1, 1000000),
        I("kv_usage_every_ms", &Config::kv_usage_every_ms, 1, 7 * kDay),
        I("stmt_timeout_ms", &Config::stmt_timeout_ms, 10, kDay),
        I("connect_timeout_ms", &Config::connect_timeout_ms, 100, 3600000),
        S("conninfo", &Config::conninfo),
        S("broker_id", &Config::broker_id),
        I("pool_size", &Config::pool_size, 1, 64),
        I("lane_push_slots", &Config::lane_push_slots, 0, 1024),
        I("lane_pop_slots", &Config::lane_pop_slots, 0, 1024),
        I("lane_ack_slots", &Config::lane_ack_slots, 0, 1024),
        I("lane_maint_slots", &Config::lane_maint_slots, 1, 1024),
        B("apply_schema", &Config::apply_schema),
        B("read_env", &Config::read_env),
        S("log_level", &Config::log_level),
        B("log_stderr", &Config::log_stderr),
    };
    return k;
}

std::string env_name(const char *key) {
    std::string n = "QUEEN_";
    for (const char *p = key; *p; ++p) n += static_cast<char>(std::toupper(static_cast<unsigned char>(*p)));
    return n;
}

bool parse_bool_text(std::string v, bool &out) {
    for (auto &c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (v == "true" || v == "1" || v == "yes" || v == "on") { out = true; return true; }
    if (v == "false" || v == "0" || v == "no" || v == "off") { out = false; return true; }
    return false;
}

enum class IntText { ok, not_integer, out_of_range };

IntText parse_int_text(const std::string &v, int64_t &out) {
    if (v.empty()) return IntText::not_integer;
    size_t i = (v[0] == '-' || v[0] == '+') ? 1 : 0;
    if (i == v.size()) return IntText::not_integer;
    for (size_t j = i; j < v.size(); ++j)
        if (!std::isdigit(static_cast<unsigned char>(v[j]))) return IntText::not_integer;
    errno = 0;
    char *end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (errno == ERANGE) return IntText::out_of_range;
    if (*end != '\0') return IntText::not_integer;
    out = x;
    return IntText::ok;
}

// Deeper than this, a config value is refused before anything else looks at it: nothing
// that reads the configuration may recurse over input, and no knob takes a structure.
constexpr int kMaxJsonDepth = 64;
// conninfo is a libpq connection string; anything longer is a mistake, not a server list.
constexpr size_t kMaxConninfoBytes = 64 * 1024;
// broker_id is shown in stats and used as a metrics label value.
constexpr size_t kMaxShortStringBytes = 1024;

// One value from the JSON object or the environment, kept as written so that a message can
// quote it exactly (a number's text, not its conversion).
struct Value {
    enum class Type { null, boolean, integer, too_big, floating, string, array, object } type = Type::null;
    bool b = false;
    int64_t i = 0;
    double d = 0;
    std::string text;  // a string's value; a number as written
    bool from_env = false;

    static Value from_environment(const char *v) {
        Value x;
        x.type = Type::string;
        x.text = v;
        x.from_env = true;
        return x;
    }
};

bool secret_knob(const Knob &k) { return k.s == &Config::conninfo; }

// How a message shows a value: never whole when it is big, never raw bytes, and never any
// part of conninfo (it holds the password, whatever form it was written in).
std::string describe(const Value &v, const Knob &k) {
    using T = Value::Type;
    if (secret_knob(k)) {
        switch (v.type) {
        case T::null: return "null";
        case T::boolean: return "a boolean";
        case T::string: return "a string of " + std::to_string(v.text.size()) + " bytes";
        case T::array: return "an array";
        case T::object: return "an object";
        default: return "a number";
        }
    }
    switch (v.type) {
    case T::null: return "null";
    case T::boolean: return v.b ? "true" : "false";
    case T::integer:
    case T::too_big:
    case T::floating: return printable(v.text);
    case T::string: return "'" + printable(v.text) + "'";
    case T::array: return "an array";
    case T::object: return "an object";
    }
    return "a value";
}

std::string key_where(const std::string &key) { return "config key '" + printable(key) + "'"; }

std::string range_text(const Knob &k) {
    return "[" + std::to_string(k.min) + ", " + std::to_string(k.max) + "]";
}

// Strings reach libpq, stats, metrics labels and logs: each is checked here, at create, so
// that nothing fails later on its bytes.
bool check_string(const Knob &k, const Value &v, const std::string &where, std::string &err) {
    const std::string &s = v.text;
    const size_t bad = utf8_invalid_at(s);
    if (bad != std::string_view::npos) {
        err = where + ": invalid UTF-8 at byte " + std::to_string(bad) + " of " + describe(v, k);
        return false;
    }
    const size_t limit = secret_knob(k) ? kMaxConninfoBytes : kMaxShortStringBytes;
    if (s.size() > limit) {
        err = where + ": " + std::to_string(s.size()) + " bytes is longer than the limit of " + std::to_string(limit) +
              " bytes";
        return false;
    }
    for (size_t i = 0; i < s.size(); ++i) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        // libpq reads conninfo as a C string, where a NUL would silently cut it; white
        // space separates its keywords. Other strings are names: no control characters.
        const bool refused = secret_knob(k) ? c == 0 : (c < 0x20 || c == 0x7F);
        if (refused) {
            char code[8];
            std::snprintf(code, sizeof code, "\\u%04X", c);
            err = where + ": control character " + code + " at byte " + std::to_string(i) + " of " + describe(v, k);
            return false;
        }
    }
    return true;
}

// Applies one value (from JSON or from the environment) to the config.
// `where` names the source in messages: the JSON key or the variable name.
bool apply_value(const Knob &k, const Value &v, const std::string &where, Config &c, std::string &err) {
    using T = Value::Type;
    switch (k.kind) {
    case Kind::boolean: {
        bool b = false;
        if (v.type == T::boolean) b = v.b;
        // 1 and 0 are accepted as JSON numbers too: they are accepted as text, and the
        // message below lists them.
        else if (v.type == T::integer && (v.i == 0 || v.i == 1)) b = v.i == 1;
        else if (v.type == T::string && utf8_invalid_at(v.text) == std::string_view::npos &&
                 parse_bool_text(v.text, b)) {}
        else {
            err = where + ": expected a boolean (true/false, 1/0, yes/no, on/off), got " + describe(v, k);
            return false;
        }
        c.*(k.b) = b;
        return true;
    }
    case Kind::integer: {
        int64_t x = 0;
        std::string written = printable(v.text);  // as written, ready for a message
        const auto out_of_range = [&] {
            err = where + ": " + written + " is out of range " + range_text(k);
            return false;
        };
        if (v.type == T::integer) x = v.i;
        else if (v.type == T::too_big) return out_of_range();
        else if (v.type == T::floating) {
            // Range first: converting a double outside int64 is undefined behaviour.
            const double d = v.d;
            if (!std::isfinite(d) || d < -9223372036854775808.0 || d >= 9223372036854775808.0) return out_of_range();
            if (d != std::trunc(d)) {
                err = where + ": expected an integer, got " + written;
                return false;
            }
            x = static_cast<int64_t>(d);  // -0.0 is 0
        } else if (v.from_env && v.type == T::string) {
            written = "'" + printable(v.text) + "'";
            switch (parse_int_text(v.text, x)) {
            case IntText::ok: break;
            case IntText::out_of_range: return out_of_range();
            case IntText::not_integer:
                err = where + ": expected an integer, got " + written;
                return false;
            }
        } else {
            err = where + ": expected an integer, got " + describe(v, k);
            return false;
        }
        if (x < k.min || x > k.max) return out_of_range();
        c.*(k.i) = x;
        return true;
    }
    case Kind::string:
        if (v.type != T::string) {
            err = where + ": expected a string, got " + describe(v, k);
            return false;
        }
        if (!check_string(k, v, where, err)) return false;
        c.*(k.s) = v.text;
        return true;
    }
    return false;
}

// Reads the configuration object with nlohmann's SAX interface, which is iterative: no
// document tree is built, so neither parsing nor destroying it recurses, and nesting is
// refused past kMaxJsonDepth at the first bracket too many. It also sees what a document
// tree hides: a key given twice, and a number as it was written.
class ConfigReader {
public:
    using json = nlohmann::json;

    bool null() { return scalar(Value{}); }
    bool boolean(bool b) {
        Value v;
        v.type = Value::Type::boolean;
        v.b = b;
        return scalar(std::move(v));
    }
    bool number_integer(json::number_integer_t i) {
        Value v;
        v.type = Value::Type::integer;
        v.i = i;
        v.text = std::to_string(i);
        return scalar(std::move(v));
    }
    bool number_unsigned(json::number_unsigned_t u) {
        Value v;
        v.text = std::to_string(u);
        if (u <= static_cast<json::number_unsigned_t>(INT64_MAX)) {
            v.type = Value::Type::integer;
            v.i = static_cast<int64_t>(u);
        } else
            v.type = Value::Type::too_big;
        return scalar(std::move(v));
    }
    bool number_float(json::number_float_t d, const json::string_t &written) {
        Value v;
        v.type = Value::Type::floating;
        v.d = d;
        v.text = written;
        return scalar(std::move(v));
    }
    bool string(json::string_t &s) {
        Value v;
        v.type = Value::Type::string;
        v.text = std::move(s);
        return scalar(std::move(v));
    }
    bool binary(json::binary_t &) { return scalar(Value{}); }  // not produced by JSON text
    bool start_object(std::size_t) { return open(Value::Type::object); }
    bool start_array(std::size_t) { return open(Value::Type::array); }
    bool end_object() { return close(); }
    bool end_array() { return close(); }
    bool key(json::string_t &k) {
        if (depth_ != 1) return true;
        if (!seen_.insert(k).second) {
            error_ = key_where(k) + ": given more than once";
            return false;
        }
        key_ = std::move(k);
        value_open_ = true;
        return true;
    }
    bool parse_error(std::size_t position, const std::string &token, const nlohmann::detail::exception &ex) {
        if (ex.id == 406 && value_open_ && depth_ == 1) {
            // A number past the range of a double (1e400): the knob's own rule words it.
            Value v;
            v.type = Value::Type::too_big;
            v.text = token;
            entries_.emplace_back(key_, std::move(v));
            truncated_ = true;
            return false;
        }
        // The library's text is kept only up to "last read", which quotes the input (a
        // password, invalid bytes); where it happened is said by key and byte offset.
        const std::string what = ex.what();
        std::string reason = ex.id == 406 ? "number out of range" : "syntax error";
        const size_t b = what.find("syntax error");
        if (b != std::string::npos) reason = what.substr(b, what.find("; last read", b) - b);
        const std::string where = (value_open_ || depth_ >= 2) ? key_where(key_) : "config";
        error_ = where + ": invalid JSON at byte " + std::to_string(position) + ": " + reason;
        return false;
    }

    const std::string &error() const { return error_; }
    bool truncated() const { return truncated_; }
    const std::vector<std::pair<std::string, Value>> &entries() const { return entries_; }
    const Value *find(const std::string &key) const {
        for (const auto &e : entries_)
            if (e.first == key) return &e.second;
        return nullptr;
    }

private:
    static const char *type_words(Value::Type t) {
        switch (t) {
        case Value::Type::null: return "null";
        case Value::Type::boolean: return "a boolean";
        case Value::Type::string: return "a string";
        case Value::Type::array: return "an array";
        case Value::Type::object: return "an object";
        default: return "a number";
        }
    }
    bool scalar(Value v) {
        if (depth_ == 0) {
            error_ = std::string("config: expected a JSON object, got ") + type_words(v.type);
            return false;
        }
        if (depth_ == 1) {
            entries_.emplace_back(key_, std::move(v));
            value_open_ = false;
        }
        return true;
    }
    bool open(Value::Type t) {
        if (depth_ == 0 && t != Value::Type::object) {
            error_ = std::string("config: expected a JSON object, got ") + type_words(t);
            return false;
        }
        if (depth_ == 1) {
            Value v;
            v.type = t;
            entries_.emplace_back(key_, std::move(v));
            value_open_ = false;
        }
        if (++depth_ > kMaxJsonDepth) {
            error_ = key_where(key_) + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
            return false;
        }
        return true;
    }
    bool close() {
        --depth_;
        return true;
    }

    int depth_ = 0;
    std::string key_;
    bool value_open_ = false;
    bool truncated_ = false;
    std::unordered_set<std::string> seen_;
    std::vector<std::pair<std::string, Value>> entries_;
    std::string error_;
};

const Knob *find_knob(const std::string &key) {
    for (const auto &k : knobs())
        if (key == k.key) return &k;
    return nullptr;
}

}  // namespace

int Config::log_level_number() const {
    if (log_level == "error") return 0;
    if (log_level == "warn") return 1;
    if (log_level == "debug") return 3;
    return 2;
}

nlohmann::json Config::to_json() const {
    nlohmann::json j = nlohmann::json::object();
    for (const auto &k : knobs()) {
        switch (k.kind) {
        case Kind::boolean: j[k.key] = this->*(k.b); break;
        case Kind::integer: j[k.key] = this->*(k.i); break;
        case Kind::string: j[k.key] = this->*(k.s); break;
        }
    }
    j["conninfo"] = mask_conninfo(conninfo);
    return j;
}

bool parse_config(const char *json_text, Config &c, std::string &err) {
    c = Config{};
    std::string_view text = json_text ? json_text : "";
    if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) text = "{}";
    ConfigReader reader;
    const bool parsed = nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &reader);
    if (!parsed && !reader.truncated()) {
        err = reader.error().empty() ? "config: invalid JSON" : reader.error();
        return false;
    }
    for (const auto &e : reader.entries()) {
        if (!find_knob(e.first)) {
            err = key_where(e.first) + ": unknown key";
            return false;
        }
    }
    if (reader.truncated()) {
        // The parse stopped at a number no double holds; the last entry is that number.
        const auto &[key, value] = reader.entries().back();
        Config scratch;
        if (apply_value(*find_knob(key), value, key_where(key), scratch, err)) err = key_where(key) + ": number out of range";
        return false;
    }
    // read_env is read from the JSON first: it decides whether the environment counts.
    if (const Value *v = reader.find("read_env")) {
        if (!apply_value(*find_knob("read_env"), *v, "config key 'read_env'", c, err)) return false;
    }
    if (c.read_env) {
        for (const auto &k : knobs()) {
            if (reader.find(k.key) || std::string(k.key) == "read_env") continue;
            std::string name = env_name(k.key);
            const char *v = std::getenv(name.c_str());
            if (!v) continue;
            if (!apply_value(k, Value::from_environment(v), "environment " + name, c, err)) return false;
        }
        std::vector<std::string> keys;
        for (const auto &k : knobs()) keys.push_back(k.key);
        c.warnings = unknown_env_warnings(environment_names(), keys);
    }
    for (const auto &[key, value] : reader.entries()) {
        if (!apply_value(*find_knob(key), value, key_where(key), c, err)) return false;
    }
    if (c.log_level != "error" && c.log_level != "warn" && c.log_level != "info" && c.log_level != "debug") {
        err = "config key 'log_level': expected one of error, warn, info, debug, got '" + printable(c.log_level) + "'";
        return false;
    }
    if (c.sweeper_backoff_min_ms > c.sweeper_backoff_max_ms) {
        err = "config key 'sweeper_backoff_min_ms': " + std::to_string(c.sweeper_backoff_min_ms) +
              " is greater than sweeper_backoff_max_ms " + std::to_string(c.sweeper_backoff_max_ms);
        return false;
    }
    if (c.broker_id.empty()) {
        char host[256] = {0};
        if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
        c.broker_id = std::string(host) + ":" + std::to_string(getpid());
    }
    return true;
}

}  // namespace qsw
