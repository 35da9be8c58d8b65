#include "stats/stats.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>

#include "queen_sweeper.h"

namespace qsw {

int64_t LagRing::percentile(double p) const {
    size_t n = size();
    if (n == 0) return 0;
    std::vector<int64_t> v(ring_.begin(), ring_.begin() + static_cast<long>(n));
    size_t k = static_cast<size_t>(p * static_cast<double>(n - 1) + 0.5);
    std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
    return v[k];
}

const char *error_phase_name(ErrorPhase p) {
    switch (p) {
    case ErrorPhase::schema: return "schema";
    case ErrorPhase::fire: return "fire";
    case ErrorPhase::prune: return "prune";
    case ErrorPhase::rollup: return "rollup";
    case ErrorPhase::backstop: return "backstop";
    case ErrorPhase::count: break;
    }
    return "fire";
}

const char *error_kind_name(ErrorKind k) {
    switch (k) {
    case ErrorKind::transient: return "transient";
    case ErrorKind::config: return "config";
    case ErrorKind::permanent: return "permanent";
    case ErrorKind::provider: return "provider";
    case ErrorKind::internal: return "internal";
    case ErrorKind::count: break;
    }
    return "permanent";
}

ErrorPhase error_phase_of(const std::string &step) {
    if (step.rfind("schema", 0) == 0) return ErrorPhase::schema;
    if (step.find("prune") != std::string::npos) return ErrorPhase::prune;
    if (step.find("rollup") != std::string::npos) return ErrorPhase::rollup;
    if (step.find("backstop") != std::string::npos) return ErrorPhase::backstop;
    return ErrorPhase::fire;  // probe, claim, fire, fail, dlq, release: the fire's own calls
}

bool Stats::healthy(const Figures &f) {
    return f.state == "running" && f.ready && f.consecutive_failed_cycles == 0;
}

nlohmann::json Stats::to_json() {
    std::lock_guard<std::mutex> g(mu);
    const Figures &x = f;
    nlohmann::json j;
    j["state"] = x.state;
    j["broker_id"] = x.broker_id;
    j["start_shard"] = x.start_shard;
    j["cycles_total"] = x.cycles_total;
    j["probes_total"] = x.probes_total;
    j["claims_total"] = x.claims_total;
    j["claimed_total"] = x.claimed_total;
    j["claimed_bytes_total"] = x.claimed_bytes_total;
    j["cycle_crashes_total"] = x.cycle_crashes_total;
    j["late_handed_back_total"] = x.late_handed_back_total;
    j["busy_kept_segments"] = x.busy_kept_segments;
    j["busy_retries_total"] = x.busy_retries_total;
    j["empty_claims_total"] = x.empty_claims_total;
    j["claims_around_held_empty_total"] = x.claims_around_held_empty_total;
    j["claims_held_back_total"] = x.claims_held_back_total;
    j["claim_batch"] = x.claim_batch;
    j["claims_ahead_total"] = x.claims_ahead_total;
    j["claims_packed_ahead_total"] = x.claims_packed_ahead_total;
    j["claims_carried_total"] = x.claims_carried_total;
    j["contended_claims_total"] = x.contended_claims_total;
    j["fires_waiting_first_total"] = x.fires_waiting_first_total;
    j["fired_total"] = x.fired_total;
    j["fired_segments_total"] = x.fired_segments_total;
    j["stale_total"] = x.stale_total;
    j["duplicate_total"] = x.duplicate_total;
    j["released_total"] = x.released_total;
    j["released_on_stop_total"] = x.released_on_stop_total;
    j["fire_txns_total"] = x.fire_txns_total;
    j["fire_bytes_total"] = x.fire_bytes_total;
    j["fire_busy_total"] = x.fire_busy_total;
    j["fire_provision_busy_total"] = x.fire_provision_busy_total;
    j["claim_turn_timeouts_fleet_total"] = x.claim_turn_timeouts_fleet_total;
    j["fire_failures"] = {{"transient", x.fire_failures_transient},
                          {"config", x.fire_failures_config},
                          {"permanent", x.fire_failures_permanent}};
    j["poisoned_total"] = x.poisoned_total;
    j["dlq_total"] = x.dlq_total;
    j["rejected_total"] = x.rejected_total;
    j["wakes_total"] = wakes_total.load();
    j["wake_signals_total"] = wake_signals_total.load();
    j["wake_cut_sleeps_total"] = x.wake_cut_sleeps_total;
    j["timers_due"] = x.timers_due;
    j["timers_due_capped"] = x.timers_due_capped;
    j["timers_oldest_late_ms"] = x.timers_oldest_late_ms;
    j["next_in_ms"] = x.next_in_ms < 0 ? nlohmann::json(nullptr) : nlohmann::json(x.next_in_ms);
    j["fire_lag_ms"] = {{"p50", x.fire_lag.percentile(0.50)},
                        {"p99", x.fire_lag.percentile(0.99)},
                        {"max", x.fire_lag_max_ms},
                        {"samples", x.fire_lag.size()}};
    j["calls"] = {{"probe", x.probe_calls.to_json()}, {"claim", x.claim_calls.to_json()}};
    j["switches"] = {{"fire_enabled", x.fire_enabled}, {"maintenance", x.maintenance}};
    j["fire_paused_cycles_total"] = x.fire_paused_cycles_total;
    j["kv_deleted_total"] = x.kv_deleted_total;
    j["kv_prune_calls_total"] = x.kv_prune_calls_total;
    j["kv_expired_not_pruned"] = x.kv_expired_not_pruned;
    j["kv_expired_not_pruned_capped"] = x.kv_expired_not_pruned_capped;
    j["kv_expiry_lag_ms"] = x.kv_expiry_lag_ms;
    j["rollup"] = {{"runs_total", x.rollup_runs_total},
                   {"skipped_total", x.rollup_skipped_total},
                   {"max_quota_ratio", x.rollup_max_quota_ratio},
                   {"sampled", x.rollup_sampled},
                   {"tenants", x.rollup_tenants ? *x.rollup_tenants : nlohmann::json::array()}};
    j["phases"] = {{"fire", x.phase_fire},
                   {"rollup", x.phase_rollup},
                   {"prune", x.phase_prune},
                   {"backstop", x.phase_backstop}};
    j["pressure"] = x.pressure;
    j["slow_pressure"] = x.slow_pressure;
    j["capped_cycles_total"] = x.capped_cycles_total;
    j["sleep_ms"] = x.sleep_ms;
    j["idle_cycles"] = x.idle_cycles;
    j["cycle_errors_total"] = x.cycle_errors_total;
    j["loop_failures_total"] = x.loop_failures_total;
    j["log_lines_suppressed_total"] = x.log_lines_suppressed_total;
    j["inflate_deferred_total"] = x.inflate_deferred_total;
    j["last_error"] = x.last_error;
    nlohmann::json errors = nlohmann::json::object();
    for (size_t p = 0; p < x.phase_errors.size(); ++p) {
        nlohmann::json by_class = nlohmann::json::object();
        for (size_t k = 0; k < x.phase_errors[p].size(); ++k)
            by_class[error_kind_name(static_cast<ErrorKind>(k))] = x.phase_errors[p][k];
        errors[error_phase_name(static_cast<ErrorPhase>(p))] = by_class;
    }
    j["phase_errors"] = errors;
    j["failed_cycles_total"] = x.failed_cycles_total;
    j["consecutive_failed_cycles"] = x.consecutive_failed_cycles;
    j["healthy"] = healthy(x);
    j["ready"] = x.ready;
    j["ready_reason"] = x.ready ? nlohmann::json(nullptr) : nlohmann::json(x.ready_reason);
    j["schema"] = {{"state", x.schema_state},
                   {"version_expected", x.schema_version_expected},
                   {"version_database", x.schema_version_database < 0 ? nlohmann::json(nullptr)
                                                                      : nlohmann::json(x.schema_version_database)}};
    j["config_warnings"] = x.config_warnings;
    j["backstop"] = {{"runs_total", x.backstop_runs_total},
                     {"failures_total", x.backstop_failures_total},
                     {"redelivered_total", x.backstop_redelivered_total},
                     {"exhausted_total", x.backstop_exhausted_total},
                     {"ttl_dropped_total", x.backstop_ttl_dropped_total},
                     {"queues_collected_total", x.backstop_queues_collected_total},
                     {"hint_wakes_total", backstop_wakes_total.load()},
                     {"next_expiry_unix_ms", x.backstop_next_expiry_unix_ms}};
    const PoolFigures &p = x.pool;
    nlohmann::json lanes = nlohmann::json::object();
    for (int l = 0; l < kLaneCount; ++l) {
        lanes[lane_name(static_cast<Lane>(l))] = {{"slots", p.slots[l]},
                                                  {"in_use", p.slots_in_use[l]},
                                                  {"waiting", p.waiting_for_slot[l]},
                                                  {"calls_total", p.lane_calls_total[l]}};
    }
    j["db_state"] = p.db_state.empty() ? "connecting" : p.db_state;
    j["failover"] = x.failover.to_json();
    j["floor"] = x.floor.to_json();
    j["claims"] = x.claims.to_json();
    j["db_last_error"] = p.last_error;
    j["pool"] = {{"connections", p.connections},
                 {"idle", p.idle},
                 {"busy", p.busy},
                 {"connecting", p.connecting},
                 {"down", p.down},
                 {"connects_total", p.connects_total},
                 {"disconnects_total", p.disconnects_total},
                 {"deadline_cancels_total", p.deadline_cancels_total},
                 {"calls_total", p.calls_total},
                 {"calls_failed_total", p.calls_failed_total},
                 {"waiting_for_connection", p.waiting_for_connection},
                 {"max_slot_wait_ms", p.max_slot_wait_ms},
                 {"setup_failures_total", p.setup_failures_total},
                 {"session_faults_in_row", p.session_faults_in_row},
                 {"reconnect_delay_ms", p.reconnect_delay_ms},
                 {"lanes", lanes}};
    j["loop_close_rc"] = x.loop_close_rc;
    j["teardown_clean"] = x.teardown_clean;
    j["config"] = x.config;
    return j;
}

namespace {
constexpr const char *kPrefix = "queen_sweeper_";
}

std::string PromFamilies::escape_label(const std::string &v) {
    std::string o;
    o.reserve(v.size());
    for (char c : v) {
        if (c == '\\') o += "\\\\";
        else if (c == '"') o += "\\\"";
        else if (c == '\n') o += "\\n";
        else o += c;
    }
    return o;
}

std::string PromFamilies::format_value(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    // Integers (every counter) print exactly; fractions in the shortest form that reads back.
    if (v == std::trunc(v) && std::fabs(v) < 9007199254740992.0) return std::to_string(static_cast<int64_t>(v));
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
}

PromFamilies::Family PromFamilies::family(const std::string &name, const char *type, const std::string &help) {
    if (std::find(opened_.begin(), opened_.end(), name) != opened_.end())
        throw std::logic_error("metric family " + name + " opened twice");
    opened_.push_back(name);
    const std::string full = kPrefix + name;
    out_ += "# HELP " + full + " " + help + "\n# TYPE " + full + " " + type + "\n";
    return Family(this, name);
}

PromFamilies::Family &PromFamilies::Family::sample(double v, const Labels &labels, const char *suffix) {
    if (owner_->opened_.back() != name_)
        throw std::logic_error("metric family " + name_ + " sampled after " + owner_->opened_.back() + " opened");
    std::string &o = owner_->out_;
    o += kPrefix;
    o += name_;
    o += suffix;
    if (!labels.empty()) {
        o += '{';
        for (size_t i = 0; i < labels.size(); ++i) {
            if (i) o += ',';
            o += labels[i].first + "=\"" + escape_label(labels[i].second) + "\"";
        }
        o += '}';
    }
    o += ' ';
    o += format_value(v);
    o += '\n';
    return *this;
}

std::string Stats::to_prometheus() {
    Figures x;
    {
        std::lock_guard<std::mutex> g(mu);
        x = f;
    }
    const int64_t wakes = wakes_total.load(), wake_signals = wake_signals_total.load();
    const int64_t hint_wakes = backstop_wakes_total.load();
    auto secs = [](int64_t ms) { return static_cast<double>(ms) / 1000.0; };
    auto flag = [](bool b) { return b ? int64_t(1) : int64_t(0); };
    PromFamilies m;
    using L = PromFamilies::Labels;

    // Identity and health first: what an alert rule reads.
    m.family("build_info", "gauge", "Always 1; the library's release version and ABI as labels.")
        .sample(int64_t(1), L{{"version", QUEEN_SWEEPER_VERSION_STRING},
                              {"abi", std::to_string(QUEEN_SWEEPER_ABI_MAJOR) + "." +
                                          std::to_string(QUEEN_SWEEPER_ABI_MINOR)}});
    m.family("broker_info", "gauge", "Always 1; this sweeper's broker id and the first shard it visits.")
        .sample(int64_t(1), L{{"broker_id", x.broker_id}, {"start_shard", std::to_string(x.start_shard)}});
    {
        auto fam = m.family("state", "gauge", "1 for the sweeper's current lifecycle state.");
        for (const char *st : {"created", "running", "stopping", "stopped", "disabled", "failed"})
            fam.sample(flag(x.state == st), L{{"state", st}});
    }
    m.family("healthy", "gauge",
             "1 while running, ready, and the last cycle finished with no phase failing; 0 otherwise.")
        .sample(flag(healthy(x)));
    m.family("ready", "gauge", "1 once the schema step succeeded and a probe completed.").sample(flag(x.ready));
    m.family("consecutive_failed_cycles", "gauge", "Cycles in a row in which some phase failed.")
        .sample(x.consecutive_failed_cycles);
    m.family("failed_cycles_total", "counter", "Cycles in which some phase failed.").sample(x.failed_cycles_total);
    {
        auto fam = m.family("errors_total", "counter",
                            "Failed calls by phase (schema, fire, prune, rollup, backstop) and error class "
                            "(transient, config, permanent, provider, internal).");
        for (size_t p = 0; p < x.phase_errors.size(); ++p)
            for (size_t k = 0; k < x.phase_errors[p].size(); ++k) {
                // A backstop failure is a provider status; a database phase never has one.
                const bool backstop = static_cast<ErrorPhase>(p) == ErrorPhase::backstop;
                const bool provider = static_cast<ErrorKind>(k) == ErrorKind::provider;
                if (backstop != provider) continue;
                fam.sample(x.phase_errors[p][k], L{{"phase", error_phase_name(static_cast<ErrorPhase>(p))},
                                                   {"class", error_kind_name(static_cast<ErrorKind>(k))}});
            }
    }
    m.family("cycle_errors_total", "counter", "Failed calls in any phase (the sum of errors_total).")
        .sample(x.cycle_errors_total);
    m.family("loop_failures_total", "counter", "Times the loop ended on an internal error (state failed).")
        .sample(x.loop_failures_total);
    m.family("log_lines_suppressed_total", "counter",
             "Log lines of a repeating failure left out; each cause says its count once per 10 s.")
        .sample(x.log_lines_suppressed_total);
    m.family("inflate_deferred_total", "counter",
             "payload_zstd timers handed back because inflating them would pass the per-call budget.")
        .sample(x.inflate_deferred_total);
    {
        auto fam = m.family("phase_state", "gauge", "1 for the current state of each phase.");
        const std::pair<const char *, const std::string *> phases[] = {
            {"fire", &x.phase_fire}, {"rollup", &x.phase_rollup}, {"prune", &x.phase_prune},
            {"backstop", &x.phase_backstop}};
        for (const auto &[ph, cur] : phases)
            for (const char *st : {"on", "off_config", "shed", "off"})
                fam.sample(flag(*cur == st), L{{"phase", ph}, {"state", st}});
    }
    m.family("schema_version_expected", "gauge", "Schema version this library embeds (0: unversioned).")
        .sample(x.schema_version_expected);
    m.family("schema_version_database", "gauge", "Schema version the database records (-1: unknown or none).")
        .sample(x.schema_version_database);
    m.family("config_warnings", "gauge", "Warnings about the configuration found at create (see the stats).")
        .sample(static_cast<int64_t>(x.config_warnings.size()));

    // The cycle.
    m.family("cycles_total", "counter", "Sweeper cycles run.").sample(x.cycles_total);
    m.family("probes_total", "counter", "Probe calls.").sample(x.probes_total);
    m.family("capped_cycles_total", "counter", "Cycles whose drain hit its row budget or deadline.")
        .sample(x.capped_cycles_total);
    m.family("pressure", "gauge", "Consecutive cycles under database pressure (a drain out of time or failed transiently).").sample(x.pressure);
    m.family("slow_pressure", "gauge", "Consecutive cycles whose drain ran out of time.").sample(x.slow_pressure);
    m.family("sleep_seconds", "gauge", "The last computed sleep.").sample(secs(x.sleep_ms));
    m.family("idle_cycles", "gauge", "Consecutive idle cycles.").sample(x.idle_cycles);
    m.family("wakes_total", "counter", "Calls of queen_sweeper_wake.").sample(wakes);
    m.family("wake_signals_total", "counter", "Times the loop was actually rung.").sample(wake_signals);
    m.family("wake_cut_sleeps_total", "counter", "Sleeps a wake actually shortened.").sample(x.wake_cut_sleeps_total);

    // The fire.
    m.family("timers_due", "gauge", "Due timers at the last probe (capped, see timers_due_capped).")
        .sample(x.timers_due);
    m.family("timers_due_capped", "gauge", "1 when timers_due hit its cap.").sample(flag(x.timers_due_capped));
    m.family("timers_oldest_late_seconds", "gauge", "Lateness of the oldest due timer at the last probe.")
        .sample(secs(x.timers_oldest_late_ms));
    m.family("next_due_in_seconds", "gauge", "Time to the nearest scheduled timer at the last probe (-1: none).")
        .sample(x.next_in_ms < 0 ? -1.0 : secs(x.next_in_ms));
    m.family("fire_enabled", "gauge", "The timers_fire_enabled switch as last read (0: paused by the operator).")
        .sample(flag(x.fire_enabled));
    m.family("maintenance", "gauge", "The maintenance switch as last read (1: fire paused).")
        .sample(flag(x.maintenance));
    m.family("fire_paused_cycles_total", "counter", "Cycles in which a switch paused the fire.")
        .sample(x.fire_paused_cycles_total);
    m.family("claims_total", "counter", "Claim calls.").sample(x.claims_total);
    m.family("claim_batch", "gauge", "Rows the next claim asks for; grows from sweeper_claim_batch toward "
             "sweeper_claim_batch_max while a backlog lasts.")
        .sample(x.claim_batch);
    m.family("claims_ahead_total", "counter", "Claims sent while the previous claim was being fired (a broker "
             "alone in a backlog).")
        .sample(x.claims_ahead_total);
    m.family("claims_packed_ahead_total", "counter", "Claims taken ahead that were packed (framed, hashed, "
             "compressed) while the previous claim was being fired, so that their fire started at once.")
        .sample(x.claims_packed_ahead_total);
    m.family("claims_carried_total", "counter", "Claims taken ahead beside the last fire of a cycle that spent "
             "its row budget, held and fired first by the next cycle.")
        .sample(x.claims_carried_total);
    m.family("contended_claims_total", "counter", "Claims whose fires met another broker (busy or stale "
             "segments); for a second after one, claims wait for their fires.")
        .sample(x.contended_claims_total);
    m.family("fires_waiting_first_total", "counter", "Fires sent waiting for their partitions at once, every "
             "partition having come back busy within the last second (another broker firing into them).")
        .sample(x.fires_waiting_first_total);
    m.family("claimed_total", "counter", "Timer rows claimed.").sample(x.claimed_total);
    m.family("claimed_bytes_total", "counter", "Payload bytes the claims carried.").sample(x.claimed_bytes_total);
    m.family("cycle_crashes_total", "counter", "Cycles ended by an internal error; the loop went on after a backoff.")
        .sample(x.cycle_crashes_total);
    m.family("late_handed_back_total", "counter",
             "Claimed rows handed back because their claim's deadline inside the lease came first.")
        .sample(x.late_handed_back_total);
    m.family("busy_kept_segments", "gauge",
             "Segments kept claimed to be tried again: their partition, or a lock on one of their rows, "
             "was someone else's.")
        .sample(x.busy_kept_segments);
    m.family("busy_retries_total", "counter", "Tries of kept (busy) segments.")
        .sample(x.busy_retries_total);
    m.family("empty_claims_total", "counter", "Drain passes whose first claim took nothing while work was due.")
        .sample(x.empty_claims_total);
    m.family("claims_around_held_empty_total", "counter",
             "Claims sent around kept segments (their partitions held elsewhere) that took nothing: every due "
             "row this broker could reach was in the held partitions.")
        .sample(x.claims_around_held_empty_total);
    m.family("claims_held_back_total", "counter",
             "Claims around kept segments not sent again after one came back empty, until a partition it "
             "left out was freed, a wake rang or sweeper_empty_claim_max_ms passed.")
        .sample(x.claims_held_back_total);
    m.family("fired_total", "counter", "Timers delivered into the log.").sample(x.fired_total);
    m.family("fired_segments_total", "counter", "Segments appended to the log.").sample(x.fired_segments_total);
    m.family("stale_total", "counter", "Segments found stale at fire time.").sample(x.stale_total);
    m.family("duplicate_total", "counter", "Timers whose txn was already in the log.").sample(x.duplicate_total);
    m.family("released_total", "counter", "Claimed rows handed back without delivery.").sample(x.released_total);
    m.family("released_on_stop_total", "counter", "Claims handed back by a graceful stop.")
        .sample(x.released_on_stop_total);
    m.family("fire_txns_total", "counter", "Fire transactions committed.").sample(x.fire_txns_total);
    m.family("fire_busy_total", "counter", "Segments deferred because someone else held their partition or a lock on one of their rows.")
        .sample(x.fire_busy_total);
    m.family("fire_provision_busy_total", "counter",
             "Segments deferred because their queue or partition could not be created: another transaction "
             "held the name (a queue being created, removed or renamed).")
        .sample(x.fire_provision_busy_total);
    m.family("claim_turn_timeouts_fleet_total", "counter",
             "Claims of the whole fleet that walked without the claim turn because its 50 ms wait ran out "
             "(the same on every broker: read it with max()).")
        .sample(x.claim_turn_timeouts_fleet_total);
    m.family("fire_bytes_total", "counter", "Bytes of segments and hashes fired.").sample(x.fire_bytes_total);
    {
        auto fam = m.family("fire_failures_total", "counter", "Failed fire calls by error class.");
        fam.sample(x.fire_failures_transient, L{{"class", "transient"}});
        fam.sample(x.fire_failures_config, L{{"class", "config"}});
        fam.sample(x.fire_failures_permanent, L{{"class", "permanent"}});
    }
    m.family("poisoned_total", "counter", "Timers isolated as the cause of a permanent failure.")
        .sample(x.poisoned_total);
    m.family("dlq_total", "counter", "Timers moved to the dead-letter queue.").sample(x.dlq_total);
    m.family("rejected_total", "counter", "Claimed rows the packer refused (e.g. a corrupt payload).")
        .sample(x.rejected_total);
    {
        const LagHistogram &h = x.fire_lag.histogram();
        auto fam = m.family("fire_lag_seconds", "histogram", "Lateness of fired timers (fire time minus due time).");
        int64_t cum = 0;
        for (size_t i = 0; i < h.buckets.size(); ++i) {
            cum += h.buckets[i];
            fam.sample(cum, L{{"le", PromFamilies::format_value(secs(LagHistogram::kBoundsMs[i]))}}, "_bucket");
        }
        fam.sample(h.count, L{{"le", "+Inf"}}, "_bucket");
        fam.sample(secs(h.sum_ms), {}, "_sum");
        fam.sample(h.count, {}, "_count");
    }
    m.family("fire_lag_max_seconds", "gauge", "Largest fire lateness seen since start.")
        .sample(secs(x.fire_lag_max_ms));
    {
        // The calls that find due rows: milliseconds each, whatever the table holds.
        const std::pair<const char *, const CallFigures *> calls[] = {{"probe", &x.probe_calls},
                                                                      {"claim", &x.claim_calls}};
        auto fam = m.family("call_seconds", "histogram",
                            "Time of the probe's and the claim's calls, from send to answer (server time plus one "
                            "round trip).");
        for (const auto &[name, c] : calls) {
            int64_t cum = 0;
            for (size_t i = 0; i < c->hist.buckets.size(); ++i) {
                cum += c->hist.buckets[i];
                fam.sample(cum,
                           L{{"statement", name}, {"le", PromFamilies::format_value(secs(LagHistogram::kBoundsMs[i]))}},
                           "_bucket");
            }
            fam.sample(c->hist.count, L{{"statement", name}, {"le", "+Inf"}}, "_bucket");
            fam.sample(secs(c->hist.sum_ms), L{{"statement", name}}, "_sum");
            fam.sample(c->hist.count, L{{"statement", name}}, "_count");
        }
        auto last = m.family("call_last_seconds", "gauge", "Time of the last probe and claim call (-1: none yet).");
        for (const auto &[name, c] : calls) last.sample(c->last_ms < 0 ? -1.0 : secs(c->last_ms), L{{"statement", name}});
        auto most = m.family("call_max_seconds", "gauge", "Longest probe and claim call since start.");
        for (const auto &[name, c] : calls) most.sample(secs(c->max_ms), L{{"statement", name}});
        auto slow = m.family("slow_calls_total", "counter",
                             "Probe and claim calls that took a second or more (each expects milliseconds).");
        for (const auto &[name, c] : calls) slow.sample(c->slow_total, L{{"statement", name}});
    }

    // KV prune and usage rollup.
    m.family("kv_deleted_total", "counter", "Expired KV rows pruned.").sample(x.kv_deleted_total);
    m.family("kv_prune_calls_total", "counter", "KV prune calls.").sample(x.kv_prune_calls_total);
    m.family("kv_expired_not_pruned", "gauge", "Expired KV rows still present (capped).")
        .sample(x.kv_expired_not_pruned);
    m.family("kv_expired_not_pruned_capped", "gauge", "1 when kv_expired_not_pruned hit its cap.")
        .sample(flag(x.kv_expired_not_pruned_capped));
    m.family("kv_expiry_lag_seconds", "gauge", "Age of the oldest expired KV row still present.")
        .sample(secs(x.kv_expiry_lag_ms));
    m.family("rollup_runs_total", "counter", "Usage rollup runs.").sample(x.rollup_runs_total);
    m.family("rollup_skipped_total", "counter",
             "Usage rollup gates passed up because another broker's pass was recent or running.")
        .sample(x.rollup_skipped_total);
    m.family("rollup_max_quota_ratio", "gauge", "Highest tenant usage over quota at the last rollup.")
        .sample(x.rollup_max_quota_ratio);
    m.family("rollup_sampled", "gauge", "1 when the last rollup sampled instead of counting.")
        .sample(flag(x.rollup_sampled));

    // The ephemeral backstop.
    m.family("backstop_runs_total", "counter", "Ephemeral backstop passes.").sample(x.backstop_runs_total);
    m.family("backstop_failures_total", "counter", "Backstop passes whose provider returned a failure.")
        .sample(x.backstop_failures_total);
    m.family("backstop_redelivered_total", "counter", "Leases the backstop expired.")
        .sample(x.backstop_redelivered_total);
    m.family("backstop_exhausted_total", "counter", "Messages the backstop found past their retry limit.")
        .sample(x.backstop_exhausted_total);
    m.family("backstop_ttl_dropped_total", "counter", "Messages the backstop dropped for their ttl.")
        .sample(x.backstop_ttl_dropped_total);
    m.family("backstop_queues_collected_total", "counter", "Idle implicit queues collected.")
        .sample(x.backstop_queues_collected_total);
    m.family("backstop_hint_wakes_total", "counter",
             "Instants the ephemeral engine reported through its waker (counted; a pass runs once a second).")
        .sample(hint_wakes);
    m.family("backstop_next_expiry_timestamp_seconds", "gauge",
             "Unix time of the nearest lease or ttl the engine reported (-1: none).")
        .sample(x.backstop_next_expiry_unix_ms < 0 ? -1.0 : secs(x.backstop_next_expiry_unix_ms));

    // The pool and admission.
    const PoolFigures &p = x.pool;
    m.family("db_up", "gauge", "1 while a database connection is usable.").sample(flag(p.db_state == "up"));
    m.family("pool_connections", "gauge", "Pooled connections.").sample(static_cast<int64_t>(p.connections));
    {
        auto fam = m.family("pool_connections_by_state", "gauge", "Pooled connections by state.");
        fam.sample(static_cast<int64_t>(p.idle), L{{"state", "idle"}});
        fam.sample(static_cast<int64_t>(p.busy), L{{"state", "busy"}});
        fam.sample(static_cast<int64_t>(p.connecting), L{{"state", "connecting"}});
        fam.sample(static_cast<int64_t>(p.down), L{{"state", "down"}});
    }
    m.family("pool_waiting_for_connection", "gauge", "Calls waiting for a connection.")
        .sample(static_cast<int64_t>(p.waiting_for_connection));
    m.family("pool_connects_total", "counter", "Connections established.").sample(p.connects_total);
    m.family("pool_disconnects_total", "counter", "Connections lost or closed.").sample(p.disconnects_total);
    m.family("pool_deadline_cancels_total", "counter", "Calls cancelled at their deadline.")
        .sample(p.deadline_cancels_total);
    m.family("pool_calls_total", "counter", "Database calls made.").sample(p.calls_total);
    m.family("pool_calls_failed_total", "counter", "Database calls that failed.").sample(p.calls_failed_total);
    m.family("pool_max_slot_wait_seconds", "gauge", "Longest wait for an admission slot.")
        .sample(secs(p.max_slot_wait_ms));
    m.family("pool_setup_failures_total", "counter",
             "Sessions the server accepted and then refused with an answer it repeats (spaced out).")
        .sample(p.setup_failures_total);
    m.family("pool_session_faults_in_row", "gauge", "Refused sessions in a row (0 after a minute without one).")
        .sample(static_cast<int64_t>(p.session_faults_in_row));
    m.family("pool_reconnect_delay_seconds", "gauge", "The delay the last reconnect waited for.")
        .sample(secs(p.reconnect_delay_ms));
    {
        auto slots = m.family("pool_lane_slots", "gauge", "Admission slots per lane.");
        for (int l = 0; l < kLaneCount; ++l)
            slots.sample(static_cast<int64_t>(p.slots[l]), L{{"lane", lane_name(static_cast<Lane>(l))}});
        auto in_use = m.family("pool_lane_slots_in_use", "gauge", "Admission slots taken per lane.");
        for (int l = 0; l < kLaneCount; ++l)
            in_use.sample(static_cast<int64_t>(p.slots_in_use[l]), L{{"lane", lane_name(static_cast<Lane>(l))}});
        auto waiting = m.family("pool_lane_waiting", "gauge", "Calls waiting for an admission slot per lane.");
        for (int l = 0; l < kLaneCount; ++l)
            waiting.sample(static_cast<int64_t>(p.waiting_for_slot[l]), L{{"lane", lane_name(static_cast<Lane>(l))}});
        auto calls = m.family("pool_lane_calls_total", "counter", "Calls admitted per lane.");
        for (int l = 0; l < kLaneCount; ++l)
            calls.sample(p.lane_calls_total[l], L{{"lane", lane_name(static_cast<Lane>(l))}});
    }

    // The floor, and what a long transaction elsewhere leaves behind it.
    {
        const FloorFigures &fl = x.floor;
        m.family("floor_lag_seconds", "gauge",
                 "Server now minus the floor the probe and the claim start from (-1: none yet). Near the floor "
                 "slack (5 s) while due work keeps up; the age of the oldest due timer under a backlog.")
            .sample(fl.lag_ms < 0 ? -1.0 : secs(fl.lag_ms));
        m.family("floor_head_walks_total", "counter", "Passes of the walk from the index head for rows behind the floor.")
            .sample(fl.head_walks_total);
        m.family("floor_head_walk_seconds", "gauge",
                 "The walking time of the last whole pass from the index head, its slices summed (-1: none "
                 "yet): it grows with the dead entries a long transaction elsewhere keeps in the index.")
            .sample(fl.head_walk_ms < 0 ? -1.0 : secs(fl.head_walk_ms));
        m.family("floor_head_walk_failures_total", "counter", "Slices of the walk from the index head that failed.")
            .sample(fl.head_walk_failures_total);
        m.family("floor_behind_total", "counter",
                 "Slices of the walk from the index head that found a row behind the floor (a transaction "
                 "that committed long after it wrote).")
            .sample(fl.behind_total);
        m.family("timers_dead_tuples", "gauge",
                 "n_dead_tup of queen.log_timers at the last walk from the head (-1: unknown): it grows while "
                 "a snapshot elsewhere holds the horizon back.")
            .sample(fl.dead_tuples);
        m.family("floor_resets_total", "counter", "Floors dropped (a new server): the next probe walks from the head.")
            .sample(fl.resets_total);
        m.family("floor_tenants_named", "gauge", "Tenants in the last claim that walked the tenants' ring (0 when it did not).")
            .sample(fl.tenants_named);
        m.family("floor_held_rows", "gauge",
                 "Due timers another transaction keeps locked, passed by the floors and tried by key "
                 "(queen.log_timers_held), at the last probe.")
            .sample(fl.held_rows);
        m.family("floor_ring_tenants", "gauge",
                 "Tenants in the tenants' ring (queen.log_timers_tenants) at this broker's last tidy (-1: none yet).")
            .sample(fl.ring_tenants);
        m.family("floor_ring_removed_total", "counter",
                 "Tenants without timers this broker's tidies removed from the tenants' ring.")
            .sample(fl.ring_removed_total);
    }

    // The claim book: the claimed rows this sweeper holds, by state.
    {
        const ClaimBookStats &c = x.claims;
        m.family("claims", "gauge",
                 "Claimed rows this sweeper holds, by state: claimed (not in a call), firing (in a fire call), "
                 "kept (a busy segment, tried again later), parked (a call's answer lost).")
            .sample(c.claimed, L{{"state", "claimed"}})
            .sample(c.firing, L{{"state", "firing"}})
            .sample(c.kept, L{{"state", "kept"}})
            .sample(c.parked, L{{"state", "parked"}});
        m.family("claims_refused_moves_total", "counter",
                 "Moves of a claimed row the claim book refused (settled twice, sent while in flight): a bug of "
                 "this library; each is logged.")
            .sample(c.refused_moves_total);
    }

    // A lost connection and what followed it.
    {
        const FailoverFigures &fo = x.failover;
        auto ts = [&](int64_t unix_ms) { return unix_ms < 0 ? -1.0 : secs(unix_ms); };
        m.family("failover_lost_total", "counter", "Drain calls that got no answer (connection, deadline, read-only).")
            .sample(fo.lost_total);
        m.family("failover_last_lost_timestamp_seconds", "gauge", "Unix time of the last loss (-1: none).")
            .sample(ts(fo.last_lost_unix_ms));
        m.family("failover_reconnected_timestamp_seconds", "gauge",
                 "Unix time the server was identified again after the last loss (-1: none).")
            .sample(ts(fo.reconnected_unix_ms));
        m.family("failover_resumed_timestamp_seconds", "gauge",
                 "Unix time of the first fire committed after the last loss (-1: none).")
            .sample(ts(fo.resumed_unix_ms));
        m.family("failover_last_gap_seconds", "gauge", "From the last loss to the first fire after it (-1: none).")
            .sample(fo.last_gap_ms < 0 ? -1.0 : secs(fo.last_gap_ms));
        m.family("failover_server_in_recovery", "gauge", "1 when the server the sweeper talks to is a standby.")
            .sample(flag(fo.server_in_recovery));
        m.family("failover_server_changes_total", "counter", "A different server found after a loss.")
            .sample(fo.server_changes_total);
        m.family("failover_read_only_total", "counter", "Drain calls refused by a read-only server.")
            .sample(fo.read_only_total);
        m.family("failover_parked_claims", "gauge", "Claims of lost calls waiting to be handed back.")
            .sample(fo.parked_claims);
        m.family("failover_handed_back_total", "counter", "Claims of lost calls handed back after reconnecting.")
            .sample(fo.handed_back_total);
        m.family("failover_recent_fires_checked_total", "counter",
                 "Announced segments looked for on the new server after a failover.")
            .sample(fo.recent_fires_checked_total);
        m.family("failover_recent_fires_lost_total", "counter",
                 "Timers announced through on_fired that the new primary lacked after a failover "
                 "(asynchronous replication): they fire again.")
            .sample(fo.recent_fires_lost_total);
        m.family("failover_lost_claims_total", "counter", "Claim calls sent whose answer was lost.")
            .sample(fo.lost_claims_total);
        m.family("failover_lost_claims_pending", "gauge", "Lost claims not handed back yet (remembered by id).")
            .sample(fo.lost_claims_pending);
        m.family("failover_lost_claims_handed_back_total", "counter",
                 "Timers of lost claims handed back by claim id after reconnecting.")
            .sample(fo.lost_claims_handed_back_total);
        m.family("failover_in_doubt_fires_total", "counter", "Fire calls sent whose answer was lost.")
            .sample(fo.in_doubt_fires_total);
        m.family("failover_in_doubt_fired_total", "counter", "In-doubt fires found committed in the log.")
            .sample(fo.in_doubt_fired_total);
        m.family("failover_in_doubt_not_fired_total", "counter", "In-doubt fires found not committed.")
            .sample(fo.in_doubt_not_fired_total);
        m.family("failover_in_doubt_pending", "gauge", "In-doubt fires not resolved yet.").sample(fo.in_doubt_pending);
        m.family("failover_in_doubt_unknown_total", "counter",
                 "In-doubt fires that could not be checked (the schema lacks log_timers_in_doubt_v1): not announced.")
            .sample(fo.in_doubt_unknown_total);
        m.family("failover_in_doubt_timers_announced_total", "counter",
                 "Timers of in-doubt fires announced through on_fired once found committed.")
            .sample(fo.in_doubt_timers_announced_total);
    }

    // Teardown (meaningful after stop).
    m.family("teardown_clean", "gauge", "1 after a stop that closed every loop handle.")
        .sample(flag(x.teardown_clean));
    return m.text();
}

}  // namespace qsw
