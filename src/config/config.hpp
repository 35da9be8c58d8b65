// The resolved configuration: JSON first, then QUEEN_* environment, then defaults.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qsw {

struct Config {
    bool sweeper = true;
    int64_t sweeper_min_sleep_ms = 5;
    int64_t sweeper_max_sleep_ms = 1000;
    int64_t sweeper_idle_max_sleep_ms = 30000;
    int64_t sweeper_idle_after_cycles = 5;
    int64_t sweeper_empty_claim_min_ms = 25;
    int64_t sweeper_empty_claim_max_ms = 200;
    int64_t sweeper_lease_ms = 30000;
    int64_t sweeper_claim_batch = 200;
    // While a backlog lasts and each claim is fired well inside the lease and the byte cap,
    // the claim doubles from sweeper_claim_batch up to this (never below the batch).
    int64_t sweeper_claim_batch_max = 2000;
    int64_t sweeper_cycle_max_rows = 5000;
    int64_t sweeper_due_cap = 2000;
    int64_t sweeper_max_fire_bytes = 8 * 1024 * 1024;
    // Payload bytes one claim may carry (counted by the server as it chooses rows; the first
    // row always goes): a claim is bounded in bytes as well as rows, so the sweeper's memory
    // is bounded whatever the payload sizes.
    int64_t sweeper_claim_max_bytes = 8 * 1024 * 1024;
    int64_t sweeper_max_attempts = 5;
    int64_t sweeper_parallelism = 1;
    bool sweeper_isolate_on_permanent = true;
    int64_t sweeper_fire_rate_per_tenant = 50;
    int64_t sweeper_backoff_min_ms = 1000;
    int64_t sweeper_backoff_max_ms = 60000;
    int64_t sweeper_transient_backoff_ms = 1000;
    int64_t kv_expire_every_ms = 1000;
    int64_t kv_expire_batch = 1000;
    int64_t kv_usage_every_ms = 300000;
    int64_t stmt_timeout_ms = 30000;
    int64_t connect_timeout_ms = 10000;
    std::string conninfo;
    std::string broker_id;  // default: hostname:pid
    int64_t pool_size = 4;
    int64_t lane_push_slots = 4;
    int64_t lane_pop_slots = 4;
    int64_t lane_ack_slots = 4;
    int64_t lane_maint_slots = 4;
    bool apply_schema = false;
    bool read_env = true;
    std::string log_level = "info";
    bool log_stderr = true;  // warnings and errors to stderr while no log callback is set
    // Found at parse time (e.g. a misspelt QUEEN_* variable); logged by the sweeper.
    std::vector<std::string> warnings;

    int log_level_number() const;
    // The resolved configuration as JSON, with any password in conninfo masked.
    nlohmann::json to_json() const;
};

// Parses and validates. On failure returns false and sets `error` to a message
// that names the key (or environment variable) and what was wrong.
bool parse_config(const char *json_text, Config &out, std::string &error);

// conninfo with every password masked as *****, in both forms libpq accepts: keyword=value
// (quoted, backslash-escaped; password and sslpassword) and postgresql:// or postgres://
// URIs (user:password@, ?password= and ?sslpassword=, percent-encoded names included).
// When libpq would refuse the string, everything after "password" is masked too. A
// linear scan: any length is safe on any thread stack.
std::string mask_conninfo(const std::string &conninfo);

// `text` (a libpq error message, a log line) with the secrets of `conninfo` removed: every
// occurrence of conninfo itself is replaced by its masked form (libpq quotes a malformed
// URI whole), every password value parsed from it (as written and as libpq decodes it, when
// 3 bytes or longer) by *****, and whatever still looks like password=... or user:pass@ in
// the text is masked. Every message from libpq goes through this before it is stored.
std::string redact_secrets(const std::string &text, const std::string &conninfo);

// The secret values libpq would read from conninfo (keyword "password" or "sslpassword",
// value unquoted, unescaped, percent-decoded), in the order written. Returns false when
// libpq's parser would refuse the string's syntax.
struct ConninfoSecret {
    std::string keyword;
    std::string value;
};
bool conninfo_secrets(const std::string &conninfo, std::vector<ConninfoSecret> &out);

}  // namespace qsw
