#include "stats.hpp"

#include <algorithm>
#include <sstream>

namespace qsw {

int64_t LagRing::percentile(double p) const {
    size_t n = size();
    if (n == 0) return 0;
    std::vector<int64_t> v(ring_.begin(), ring_.begin() + static_cast<long>(n));
    size_t k = static_cast<size_t>(p * static_cast<double>(n - 1) + 0.5);
    std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
    return v[k];
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
    j["empty_claims_total"] = x.empty_claims_total;
    j["fired_total"] = x.fired_total;
    j["fired_segments_total"] = x.fired_segments_total;
    j["stale_total"] = x.stale_total;
    j["duplicate_total"] = x.duplicate_total;
    j["released_total"] = x.released_total;
    j["released_on_stop_total"] = x.released_on_stop_total;
    j["fire_txns_total"] = x.fire_txns_total;
    j["fire_bytes_total"] = x.fire_bytes_total;
    j["fire_busy_total"] = x.fire_busy_total;
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
    j["switches"] = {{"fire_enabled", x.fire_enabled}, {"maintenance", x.maintenance}};
    j["fire_paused_cycles_total"] = x.fire_paused_cycles_total;
    j["kv_deleted_total"] = x.kv_deleted_total;
    j["kv_prune_calls_total"] = x.kv_prune_calls_total;
    j["kv_expired_not_pruned"] = x.kv_expired_not_pruned;
    j["kv_expired_not_pruned_capped"] = x.kv_expired_not_pruned_capped;
    j["kv_expiry_lag_ms"] = x.kv_expiry_lag_ms;
    j["rollup"] = {{"runs_total", x.rollup_runs_total},
                   {"max_quota_ratio", x.rollup_max_quota_ratio},
                   {"sampled", x.rollup_sampled},
                   {"tenants", x.rollup_tenants}};
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
    j["last_error"] = x.last_error;
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
                 {"lanes", lanes}};
    j["loop_close_rc"] = x.loop_close_rc;
    j["teardown_clean"] = x.teardown_clean;
    j["config"] = x.config;
    return j;
}

std::string Stats::to_prometheus() {
    nlohmann::json j = to_json();
    std::ostringstream o;
    auto metric = [&](const char *name, const char *type, const char *help, const nlohmann::json &v,
                      const std::string &labels = "") {
        o << "# HELP queen_sweeper_" << name << ' ' << help << "\n# TYPE queen_sweeper_" << name << ' ' << type
          << "\nqueen_sweeper_" << name << labels << ' ';
        if (v.is_boolean()) o << (v.get<bool>() ? 1 : 0);
        else if (v.is_null()) o << "NaN";
        else o << v.dump();
        o << '\n';
    };
    metric("cycles_total", "counter", "Sweeper cycles run.", j["cycles_total"]);
    metric("probes_total", "counter", "Probe calls.", j["probes_total"]);
    metric("claimed_total", "counter", "Timer rows claimed.", j["claimed_total"]);
    metric("empty_claims_total", "counter", "Claims that took nothing while work was due.", j["empty_claims_total"]);
    metric("fired_total", "counter", "Timers delivered into the log.", j["fired_total"]);
    metric("stale_total", "counter", "Segments found stale at fire time.", j["stale_total"]);
    metric("duplicate_total", "counter", "Timers whose txn was already in the log.", j["duplicate_total"]);
    metric("released_total", "counter", "Claimed rows released without delivery.", j["released_total"]);
    metric("fire_txns_total", "counter", "Fire transactions committed.", j["fire_txns_total"]);
    metric("fire_bytes_total", "counter", "Bytes of segments and hashes fired.", j["fire_bytes_total"]);
    for (const char *c : {"transient", "config", "permanent"})
        metric("fire_failures_total", "counter", "Failed fire calls by class.", j["fire_failures"][c],
               std::string("{class=\"") + c + "\"}");
    metric("poisoned_total", "counter", "Timers isolated as poison.", j["poisoned_total"]);
    metric("dlq_total", "counter", "Timers moved to the DLQ.", j["dlq_total"]);
    metric("wakes_total", "counter", "Calls of queen_sweeper_wake.", j["wakes_total"]);
    metric("wake_signals_total", "counter", "Times the loop was actually rung.", j["wake_signals_total"]);
    metric("timers_due", "gauge", "Due timers at the last probe (capped).", j["timers_due"]);
    metric("timers_oldest_late_ms", "gauge", "Lateness of the oldest due timer.", j["timers_oldest_late_ms"]);
    metric("fire_lag_p50_ms", "gauge", "Median fire lag over recent fires.", j["fire_lag_ms"]["p50"]);
    metric("fire_lag_p99_ms", "gauge", "p99 fire lag over recent fires.", j["fire_lag_ms"]["p99"]);
    metric("kv_deleted_total", "counter", "Expired KV rows pruned.", j["kv_deleted_total"]);
    metric("kv_expired_not_pruned", "gauge", "Expired KV rows still present.", j["kv_expired_not_pruned"]);
    metric("kv_expired_not_pruned_capped", "gauge", "1 when the count above hit its cap.",
           j["kv_expired_not_pruned_capped"]);
    metric("kv_expiry_lag_ms", "gauge", "Age of the oldest expired KV row still present.", j["kv_expiry_lag_ms"]);
    for (const char *ph : {"fire", "rollup", "prune", "backstop"}) {
        for (const char *st : {"on", "off_config", "shed", "off"}) {
            metric("phase_state", "gauge", "1 for the current state of each phase.",
                   nlohmann::json(j["phases"][ph] == st),
                   std::string("{phase=\"") + ph + "\",state=\"" + st + "\"}");
        }
    }
    metric("pressure", "gauge", "Consecutive capped cycles.", j["pressure"]);
    metric("slow_pressure", "gauge", "Consecutive cycles whose drain ran out of time.", j["slow_pressure"]);
    metric("sleep_ms", "gauge", "The last computed sleep.", j["sleep_ms"]);
    metric("db_up", "gauge", "1 while a database connection is usable.", nlohmann::json(j["db_state"] == "up"));
    metric("pool_connections_busy", "gauge", "Busy pooled connections.", j["pool"]["busy"]);
    metric("pool_disconnects_total", "counter", "Connections lost or closed.", j["pool"]["disconnects_total"]);
    metric("pool_deadline_cancels_total", "counter", "Calls cancelled at their deadline.",
           j["pool"]["deadline_cancels_total"]);
    metric("backstop_runs_total", "counter", "Ephemeral backstop passes.", j["backstop"]["runs_total"]);
    metric("backstop_redelivered_total", "counter", "Leases the backstop expired.", j["backstop"]["redelivered_total"]);
    metric("backstop_ttl_dropped_total", "counter", "Messages the backstop dropped for ttl.",
           j["backstop"]["ttl_dropped_total"]);
    metric("backstop_queues_collected_total", "counter", "Idle implicit queues collected.",
           j["backstop"]["queues_collected_total"]);
    // The multi-line TYPE/HELP repeats above are legal only once per name.
    std::istringstream in(o.str());
    std::ostringstream out;
    std::vector<std::string> seen;
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("# ", 0) == 0) {
            if (std::find(seen.begin(), seen.end(), line) != seen.end()) continue;
            seen.push_back(line);
        }
        out << line << '\n';
    }
    return out.str();
}

}  // namespace qsw
