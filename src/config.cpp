#include "config.hpp"
#include "env_check.hpp"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <functional>
#include <regex>
#include <vector>

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
        I("sweeper_min_sleep_ms", &Config::sweeper_min_sleep_ms, 0, 3600000),
        I("sweeper_max_sleep_ms", &Config::sweeper_max_sleep_ms, 1, 3600000),
        I("sweeper_idle_max_sleep_ms", &Config::sweeper_idle_max_sleep_ms, 1, kDay),
        I("sweeper_idle_after_cycles", &Config::sweeper_idle_after_cycles, 0, 1000000),
        I("sweeper_empty_claim_min_ms", &Config::sweeper_empty_claim_min_ms, 0, 3600000),
        I("sweeper_empty_claim_max_ms", &Config::sweeper_empty_claim_max_ms, 0, 3600000),
        I("sweeper_lease_ms", &Config::sweeper_lease_ms, 100, kDay),
        I("sweeper_claim_batch", &Config::sweeper_claim_batch, 1, 100000),
        I("sweeper_cycle_max_rows", &Config::sweeper_cycle_max_rows, 1, 10000000),
        I("sweeper_due_cap", &Config::sweeper_due_cap, 1, 10000000),
        I("sweeper_max_fire_bytes", &Config::sweeper_max_fire_bytes, 1024, int64_t(1) << 30),
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

bool parse_int_text(const std::string &v, int64_t &out) {
    if (v.empty()) return false;
    size_t i = (v[0] == '-' || v[0] == '+') ? 1 : 0;
    if (i == v.size()) return false;
    for (size_t j = i; j < v.size(); ++j)
        if (!std::isdigit(static_cast<unsigned char>(v[j]))) return false;
    errno = 0;
    char *end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (errno == ERANGE || *end != '\0') return false;
    out = x;
    return true;
}

// Applies one value (from JSON or from the environment) to the config.
// `where` names the source in messages: the JSON key or the variable name.
bool apply_value(const Knob &k, const nlohmann::json &v, const std::string &where, Config &c,
                 std::string &err, bool from_env) {
    switch (k.kind) {
    case Kind::boolean: {
        bool b = false;
        if (v.is_boolean()) b = v.get<bool>();
        else if (v.is_string() && parse_bool_text(v.get<std::string>(), b)) {}
        else {
            err = where + ": expected a boolean (true/false, 1/0, yes/no, on/off), got " +
                  (from_env ? "'" + v.get<std::string>() + "'" : v.dump());
            return false;
        }
        c.*(k.b) = b;
        return true;
    }
    case Kind::integer: {
        int64_t x = 0;
        if (v.is_number_integer()) x = v.get<int64_t>();
        else if (v.is_number_float()) {
            double d = v.get<double>();
            if (d != static_cast<double>(static_cast<int64_t>(d))) {
                err = where + ": expected an integer, got " + v.dump();
                return false;
            }
            x = static_cast<int64_t>(d);
        } else if (from_env && v.is_string() && parse_int_text(v.get<std::string>(), x)) {}
        else {
            err = where + ": expected an integer, got " + (from_env ? "'" + v.get<std::string>() + "'" : v.dump());
            return false;
        }
        if (x < k.min || x > k.max) {
            err = where + ": " + std::to_string(x) + " is out of range [" + std::to_string(k.min) + ", " +
                  std::to_string(k.max) + "]";
            return false;
        }
        c.*(k.i) = x;
        return true;
    }
    case Kind::string:
        if (!v.is_string()) {
            err = where + ": expected a string, got " + v.dump();
            return false;
        }
        c.*(k.s) = v.get<std::string>();
        return true;
    }
    return false;
}

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

std::string mask_conninfo(const std::string &ci) {
    static const std::regex kw(R"((password\s*=\s*)('([^'\\]|\\.)*'|\S+))", std::regex::icase);
    static const std::regex uri(R"((://[^:/@\s]*:)[^@\s]*@)");
    std::string r = std::regex_replace(ci, kw, "$1*****");
    r = std::regex_replace(r, uri, "$1*****@");
    return r;
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
    nlohmann::json j;
    std::string text = json_text ? json_text : "";
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) text = "{}";
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error &e) {
        err = std::string("config: invalid JSON: ") + e.what();
        return false;
    }
    if (!j.is_object()) {
        err = "config: expected a JSON object, got " + std::string(j.type_name());
        return false;
    }
    for (auto it = j.begin(); it != j.end(); ++it) {
        if (!find_knob(it.key())) {
            err = "config key '" + it.key() + "': unknown key";
            return false;
        }
    }
    // read_env is read from the JSON first: it decides whether the environment counts.
    if (j.contains("read_env")) {
        if (!apply_value(*find_knob("read_env"), j["read_env"], "config key 'read_env'", c, err, false))
            return false;
    }
    if (c.read_env) {
        for (const auto &k : knobs()) {
            if (j.contains(k.key) || std::string(k.key) == "read_env") continue;
            std::string name = env_name(k.key);
            const char *v = std::getenv(name.c_str());
            if (!v) continue;
            if (!apply_value(k, nlohmann::json(std::string(v)), "environment " + name, c, err, true)) return false;
        }
        std::vector<std::string> keys;
        for (const auto &k : knobs()) keys.push_back(k.key);
        c.warnings = unknown_env_warnings(environment_names(), keys);
    }
    for (auto it = j.begin(); it != j.end(); ++it) {
        const Knob *k = find_knob(it.key());
        if (!apply_value(*k, it.value(), "config key '" + it.key() + "'", c, err, false)) return false;
    }
    if (c.log_level != "error" && c.log_level != "warn" && c.log_level != "info" && c.log_level != "debug") {
        err = "config key 'log_level': expected one of error, warn, info, debug, got '" + c.log_level + "'";
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
