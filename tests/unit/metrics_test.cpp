// The Prometheus text and the JSON stats it mirrors: families with HELP and TYPE
// once, base units, _total counters, a cumulative histogram, escaped labels, the
// health signal, and every JSON figure exported.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "queen_sweeper.h"
#include "stats/stats.hpp"

using namespace qsw;

namespace {

std::vector<std::string> lines_of(const std::string &text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    std::string l;
    while (std::getline(in, l)) out.push_back(l);
    return out;
}

// name{labels} -> value, for the sample lines.
std::map<std::string, std::string> samples_of(const std::string &text) {
    std::map<std::string, std::string> out;
    for (const auto &l : lines_of(text)) {
        if (l.empty() || l[0] == '#') continue;
        const size_t sp = l.rfind(' ');
        out[l.substr(0, sp)] = l.substr(sp + 1);
    }
    return out;
}

// Every leaf of the JSON that is a number or a boolean, as a dotted path.
void numeric_leaves(const nlohmann::json &j, const std::string &path, std::set<std::string> &out) {
    if (j.is_object()) {
        for (auto it = j.begin(); it != j.end(); ++it)
            numeric_leaves(it.value(), path.empty() ? it.key() : path + "." + it.key(), out);
    } else if (j.is_number() || j.is_boolean()) {
        out.insert(path);
    }
}

}  // namespace

TEST(PromFamilies, HeaderOnceThenSamples) {
    PromFamilies m;
    m.family("calls_total", "counter", "Calls.").sample(int64_t(3), {{"lane", "maint"}}).sample(int64_t(4), {{"lane", "push"}});
    m.family("up", "gauge", "Up.").sample(int64_t(1));
    EXPECT_EQ(m.text(),
              "# HELP queen_sweeper_calls_total Calls.\n# TYPE queen_sweeper_calls_total counter\n"
              "queen_sweeper_calls_total{lane=\"maint\"} 3\nqueen_sweeper_calls_total{lane=\"push\"} 4\n"
              "# HELP queen_sweeper_up Up.\n# TYPE queen_sweeper_up gauge\nqueen_sweeper_up 1\n");
}

TEST(PromFamilies, RefusesAFamilyTwiceAndInterleavedSamples) {
    PromFamilies m;
    auto a = m.family("a_total", "counter", "A.");
    a.sample(int64_t(1));
    EXPECT_THROW(m.family("a_total", "counter", "A again."), std::logic_error);
    m.family("b", "gauge", "B.").sample(int64_t(2));
    EXPECT_THROW(a.sample(int64_t(3)), std::logic_error);  // a's samples must stay together
}

TEST(PromFamilies, EscapesLabelValuesAndFormatsNumbers) {
    EXPECT_EQ(PromFamilies::escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    EXPECT_EQ(PromFamilies::format_value(42), "42");
    EXPECT_EQ(PromFamilies::format_value(0.25), "0.25");
    EXPECT_EQ(PromFamilies::format_value(-1), "-1");
    EXPECT_EQ(PromFamilies::format_value(1.0 / 0.0), "+Inf");
    EXPECT_EQ(PromFamilies::format_value(std::nan("")), "NaN");
}

TEST(Metrics, EveryFamilyHasOneHelpAndOneTypeAndConventionalNames) {
    Stats s;
    const std::string text = s.to_prometheus();
    std::map<std::string, int> help, type;
    std::map<std::string, std::string> kind;
    const std::regex header(R"(# (HELP|TYPE) (\S+) (.*))");
    for (const auto &l : lines_of(text)) {
        std::smatch m;
        if (l.rfind("# ", 0) == 0) {
            ASSERT_TRUE(std::regex_match(l, m, header)) << l;
            (m[1] == "HELP" ? help : type)[m[2]]++;
            if (m[1] == "TYPE") kind[m[2]] = m[3];
            continue;
        }
        // Every sample belongs to the family declared last (or its histogram series).
        ASSERT_FALSE(type.empty()) << l;
    }
    ASSERT_FALSE(help.empty());
    for (const auto &[name, n] : help) {
        EXPECT_EQ(n, 1) << name;
        EXPECT_EQ(type[name], 1) << name;
        EXPECT_EQ(name.rfind("queen_sweeper_", 0), 0u) << name;
        // Base units: no milliseconds anywhere.
        EXPECT_EQ(name.find("_ms"), std::string::npos) << name;
        const bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
        EXPECT_EQ(kind[name] == "counter", total) << name << " is a " << kind[name];
    }
    EXPECT_EQ(kind["queen_sweeper_fire_lag_seconds"], "histogram");
}

TEST(Metrics, BuildInfoCarriesVersionAndAbi) {
    Stats s;
    const auto m = samples_of(s.to_prometheus());
    const std::string key = std::string("queen_sweeper_build_info{version=\"") + QUEEN_SWEEPER_VERSION_STRING +
                            "\",abi=\"" + std::to_string(QUEEN_SWEEPER_ABI_MAJOR) + "." +
                            std::to_string(QUEEN_SWEEPER_ABI_MINOR) + "\"}";
    ASSERT_TRUE(m.count(key)) << key;
    EXPECT_EQ(m.at(key), "1");
}

TEST(Metrics, ReleaseMacrosMatchTheBuiltVersion) {
    const std::string macros = std::to_string(QUEEN_SWEEPER_VERSION_MAJOR) + "." +
                               std::to_string(QUEEN_SWEEPER_VERSION_MINOR) + "." +
                               std::to_string(QUEEN_SWEEPER_VERSION_PATCH);
    EXPECT_EQ(macros, QUEEN_SWEEPER_VERSION_STRING);
}

TEST(Metrics, FireLagIsACumulativeHistogramInSeconds) {
    Stats s;
    for (int64_t ms : {1, 7, 7, 120, 4000, 999999}) s.f.fire_lag.add(ms);
    const auto m = samples_of(s.to_prometheus());
    EXPECT_EQ(m.at("queen_sweeper_fire_lag_seconds_bucket{le=\"0.005\"}"), "1");
    EXPECT_EQ(m.at("queen_sweeper_fire_lag_seconds_bucket{le=\"0.01\"}"), "3");
    EXPECT_EQ(m.at("queen_sweeper_fire_lag_seconds_bucket{le=\"0.25\"}"), "4");
    EXPECT_EQ(m.at("queen_sweeper_fire_lag_seconds_bucket{le=\"5\"}"), "5");
    EXPECT_EQ(m.at("queen_sweeper_fire_lag_seconds_bucket{le=\"300\"}"), "5");
    EXPECT_EQ(m.at("queen_sweeper_fire_lag_seconds_bucket{le=\"+Inf\"}"), "6");
    EXPECT_EQ(m.at("queen_sweeper_fire_lag_seconds_count"), "6");
    EXPECT_EQ(m.at("queen_sweeper_fire_lag_seconds_sum"), "1004.134");
}

TEST(Metrics, MillisecondFiguresAreExportedInSeconds) {
    Stats s;
    s.f.timers_oldest_late_ms = 1500;
    s.f.kv_expiry_lag_ms = 250;
    s.f.sleep_ms = 5;
    s.f.pool.max_slot_wait_ms = 2000;
    const auto m = samples_of(s.to_prometheus());
    EXPECT_EQ(m.at("queen_sweeper_timers_oldest_late_seconds"), "1.5");
    EXPECT_EQ(m.at("queen_sweeper_kv_expiry_lag_seconds"), "0.25");
    EXPECT_EQ(m.at("queen_sweeper_sleep_seconds"), "0.005");
    EXPECT_EQ(m.at("queen_sweeper_pool_max_slot_wait_seconds"), "2");
}

TEST(Metrics, HealthyTurnsWithFailingCyclesAndErrorsCountByPhaseAndClass) {
    Stats s;
    s.f.state = "running";
    s.f.ready = true;
    s.f.pool.db_state = "up";
    auto m = samples_of(s.to_prometheus());
    EXPECT_EQ(m.at("queen_sweeper_healthy"), "1");
    // A role without rights: every cycle fails with class 42 while the database is up.
    s.f.consecutive_failed_cycles = 3;
    s.f.failed_cycles_total = 3;
    s.f.phase_errors[static_cast<size_t>(ErrorPhase::fire)][static_cast<size_t>(ErrorKind::config)] = 3;
    m = samples_of(s.to_prometheus());
    EXPECT_EQ(m.at("queen_sweeper_healthy"), "0");
    EXPECT_EQ(m.at("queen_sweeper_db_up"), "1");
    EXPECT_EQ(m.at("queen_sweeper_errors_total{phase=\"fire\",class=\"config\"}"), "3");
    EXPECT_EQ(m.at("queen_sweeper_errors_total{phase=\"prune\",class=\"config\"}"), "0");
    EXPECT_EQ(m.at("queen_sweeper_errors_total{phase=\"backstop\",class=\"provider\"}"), "0");
    EXPECT_EQ(m.count("queen_sweeper_errors_total{phase=\"fire\",class=\"provider\"}"), 0u);
    // Not ready is not healthy either, whatever the cycles say.
    s.f.consecutive_failed_cycles = 0;
    s.f.ready = false;
    EXPECT_EQ(samples_of(s.to_prometheus()).at("queen_sweeper_healthy"), "0");
}

TEST(Metrics, ErrorPhasesFoldTheCycleSteps) {
    EXPECT_EQ(error_phase_of("schema apply"), ErrorPhase::schema);
    EXPECT_EQ(error_phase_of("schema version check"), ErrorPhase::schema);
    for (const char *step : {"probe", "claim", "fire", "fail", "dlq", "release of stale rows", "release at stop"})
        EXPECT_EQ(error_phase_of(step), ErrorPhase::fire) << step;
    EXPECT_EQ(error_phase_of("KV prune"), ErrorPhase::prune);
    EXPECT_EQ(error_phase_of("usage rollup"), ErrorPhase::rollup);
    EXPECT_EQ(error_phase_of("ephemeral backstop"), ErrorPhase::backstop);
}

// Every number and flag of the JSON stats has its metric: a figure added to the JSON
// without one fails here. The table is JSON path -> exported sample.
TEST(Metrics, EveryJsonFigureIsExported) {
    Stats s;
    s.f.next_in_ms = 10;  // a number, not null, so it is a leaf
    s.f.schema_version_database = 2;
    const std::map<std::string, std::string> exported = {
        {"start_shard", "queen_sweeper_broker_info"},
        {"cycles_total", "queen_sweeper_cycles_total"},
        {"probes_total", "queen_sweeper_probes_total"},
        {"claims_total", "queen_sweeper_claims_total"},
        {"claim_batch", "queen_sweeper_claim_batch"},
        {"claims_ahead_total", "queen_sweeper_claims_ahead_total"},
        {"claims_packed_ahead_total", "queen_sweeper_claims_packed_ahead_total"},
        {"claims_carried_total", "queen_sweeper_claims_carried_total"},
        {"contended_claims_total", "queen_sweeper_contended_claims_total"},
        {"fires_waiting_first_total", "queen_sweeper_fires_waiting_first_total"},
        {"claimed_total", "queen_sweeper_claimed_total"},
        {"claimed_bytes_total", "queen_sweeper_claimed_bytes_total"},
        {"cycle_crashes_total", "queen_sweeper_cycle_crashes_total"},
        {"late_handed_back_total", "queen_sweeper_late_handed_back_total"},
        {"busy_kept_segments", "queen_sweeper_busy_kept_segments"},
        {"busy_retries_total", "queen_sweeper_busy_retries_total"},
        {"empty_claims_total", "queen_sweeper_empty_claims_total"},
        {"claims_around_held_empty_total", "queen_sweeper_claims_around_held_empty_total"},
        {"claims_held_back_total", "queen_sweeper_claims_held_back_total"},
        {"fired_total", "queen_sweeper_fired_total"},
        {"fired_segments_total", "queen_sweeper_fired_segments_total"},
        {"stale_total", "queen_sweeper_stale_total"},
        {"duplicate_total", "queen_sweeper_duplicate_total"},
        {"released_total", "queen_sweeper_released_total"},
        {"released_on_stop_total", "queen_sweeper_released_on_stop_total"},
        {"fire_txns_total", "queen_sweeper_fire_txns_total"},
        {"fire_bytes_total", "queen_sweeper_fire_bytes_total"},
        {"fire_busy_total", "queen_sweeper_fire_busy_total"},
        {"fire_provision_busy_total", "queen_sweeper_fire_provision_busy_total"},
        {"claim_turn_timeouts_fleet_total", "queen_sweeper_claim_turn_timeouts_fleet_total"},
        {"fire_failures.transient", "queen_sweeper_fire_failures_total{class=\"transient\"}"},
        {"fire_failures.config", "queen_sweeper_fire_failures_total{class=\"config\"}"},
        {"fire_failures.permanent", "queen_sweeper_fire_failures_total{class=\"permanent\"}"},
        {"poisoned_total", "queen_sweeper_poisoned_total"},
        {"dlq_total", "queen_sweeper_dlq_total"},
        {"rejected_total", "queen_sweeper_rejected_total"},
        {"wakes_total", "queen_sweeper_wakes_total"},
        {"wake_signals_total", "queen_sweeper_wake_signals_total"},
        {"wake_cut_sleeps_total", "queen_sweeper_wake_cut_sleeps_total"},
        {"timers_due", "queen_sweeper_timers_due"},
        {"timers_due_capped", "queen_sweeper_timers_due_capped"},
        {"timers_oldest_late_ms", "queen_sweeper_timers_oldest_late_seconds"},
        {"next_in_ms", "queen_sweeper_next_due_in_seconds"},
        {"fire_lag_ms.p50", "queen_sweeper_fire_lag_seconds_bucket{le=\"0.05\"}"},
        {"fire_lag_ms.p99", "queen_sweeper_fire_lag_seconds_bucket{le=\"+Inf\"}"},
        {"fire_lag_ms.max", "queen_sweeper_fire_lag_max_seconds"},
        {"calls.probe.last_ms", "queen_sweeper_call_last_seconds{statement=\"probe\"}"},
        {"calls.probe.max_ms", "queen_sweeper_call_max_seconds{statement=\"probe\"}"},
        {"calls.probe.calls_total", "queen_sweeper_call_seconds_count{statement=\"probe\"}"},
        {"calls.probe.slow_total", "queen_sweeper_slow_calls_total{statement=\"probe\"}"},
        {"calls.claim.last_ms", "queen_sweeper_call_last_seconds{statement=\"claim\"}"},
        {"calls.claim.max_ms", "queen_sweeper_call_max_seconds{statement=\"claim\"}"},
        {"calls.claim.calls_total", "queen_sweeper_call_seconds_count{statement=\"claim\"}"},
        {"calls.claim.slow_total", "queen_sweeper_slow_calls_total{statement=\"claim\"}"},
        {"fire_lag_ms.samples", "queen_sweeper_fire_lag_seconds_count"},
        {"switches.fire_enabled", "queen_sweeper_fire_enabled"},
        {"switches.maintenance", "queen_sweeper_maintenance"},
        {"fire_paused_cycles_total", "queen_sweeper_fire_paused_cycles_total"},
        {"kv_deleted_total", "queen_sweeper_kv_deleted_total"},
        {"kv_prune_calls_total", "queen_sweeper_kv_prune_calls_total"},
        {"kv_expired_not_pruned", "queen_sweeper_kv_expired_not_pruned"},
        {"kv_expired_not_pruned_capped", "queen_sweeper_kv_expired_not_pruned_capped"},
        {"kv_expiry_lag_ms", "queen_sweeper_kv_expiry_lag_seconds"},
        {"rollup.runs_total", "queen_sweeper_rollup_runs_total"},
        {"rollup.skipped_total", "queen_sweeper_rollup_skipped_total"},
        {"rollup.max_quota_ratio", "queen_sweeper_rollup_max_quota_ratio"},
        {"rollup.sampled", "queen_sweeper_rollup_sampled"},
        {"pressure", "queen_sweeper_pressure"},
        {"slow_pressure", "queen_sweeper_slow_pressure"},
        {"capped_cycles_total", "queen_sweeper_capped_cycles_total"},
        {"sleep_ms", "queen_sweeper_sleep_seconds"},
        {"idle_cycles", "queen_sweeper_idle_cycles"},
        {"cycle_errors_total", "queen_sweeper_cycle_errors_total"},
        {"loop_failures_total", "queen_sweeper_loop_failures_total"},
        {"log_lines_suppressed_total", "queen_sweeper_log_lines_suppressed_total"},
        {"inflate_deferred_total", "queen_sweeper_inflate_deferred_total"},
        {"failed_cycles_total", "queen_sweeper_failed_cycles_total"},
        {"consecutive_failed_cycles", "queen_sweeper_consecutive_failed_cycles"},
        {"healthy", "queen_sweeper_healthy"},
        {"ready", "queen_sweeper_ready"},
        {"schema.version_expected", "queen_sweeper_schema_version_expected"},
        {"schema.version_database", "queen_sweeper_schema_version_database"},
        {"backstop.runs_total", "queen_sweeper_backstop_runs_total"},
        {"backstop.failures_total", "queen_sweeper_backstop_failures_total"},
        {"backstop.redelivered_total", "queen_sweeper_backstop_redelivered_total"},
        {"backstop.exhausted_total", "queen_sweeper_backstop_exhausted_total"},
        {"backstop.ttl_dropped_total", "queen_sweeper_backstop_ttl_dropped_total"},
        {"backstop.queues_collected_total", "queen_sweeper_backstop_queues_collected_total"},
        {"backstop.hint_wakes_total", "queen_sweeper_backstop_hint_wakes_total"},
        {"backstop.next_expiry_unix_ms", "queen_sweeper_backstop_next_expiry_timestamp_seconds"},
        {"pool.connections", "queen_sweeper_pool_connections"},
        {"pool.idle", "queen_sweeper_pool_connections_by_state{state=\"idle\"}"},
        {"pool.busy", "queen_sweeper_pool_connections_by_state{state=\"busy\"}"},
        {"pool.connecting", "queen_sweeper_pool_connections_by_state{state=\"connecting\"}"},
        {"pool.down", "queen_sweeper_pool_connections_by_state{state=\"down\"}"},
        {"pool.connects_total", "queen_sweeper_pool_connects_total"},
        {"pool.disconnects_total", "queen_sweeper_pool_disconnects_total"},
        {"pool.deadline_cancels_total", "queen_sweeper_pool_deadline_cancels_total"},
        {"pool.calls_total", "queen_sweeper_pool_calls_total"},
        {"pool.calls_failed_total", "queen_sweeper_pool_calls_failed_total"},
        {"pool.waiting_for_connection", "queen_sweeper_pool_waiting_for_connection"},
        {"pool.max_slot_wait_ms", "queen_sweeper_pool_max_slot_wait_seconds"},
        {"pool.setup_failures_total", "queen_sweeper_pool_setup_failures_total"},
        {"pool.session_faults_in_row", "queen_sweeper_pool_session_faults_in_row"},
        {"pool.reconnect_delay_ms", "queen_sweeper_pool_reconnect_delay_seconds"},
        {"teardown_clean", "queen_sweeper_teardown_clean"},
        {"failover.lost_total", "queen_sweeper_failover_lost_total"},
        {"failover.last_lost_unix_ms", "queen_sweeper_failover_last_lost_timestamp_seconds"},
        {"failover.reconnected_unix_ms", "queen_sweeper_failover_reconnected_timestamp_seconds"},
        {"failover.resumed_unix_ms", "queen_sweeper_failover_resumed_timestamp_seconds"},
        {"failover.last_gap_ms", "queen_sweeper_failover_last_gap_seconds"},
        {"failover.server_in_recovery", "queen_sweeper_failover_server_in_recovery"},
        {"failover.server_changes_total", "queen_sweeper_failover_server_changes_total"},
        {"failover.read_only_total", "queen_sweeper_failover_read_only_total"},
        {"failover.parked_claims", "queen_sweeper_failover_parked_claims"},
        {"failover.handed_back_total", "queen_sweeper_failover_handed_back_total"},
        {"failover.lost_claims.total", "queen_sweeper_failover_lost_claims_total"},
        {"failover.recent_fires_checked_total", "queen_sweeper_failover_recent_fires_checked_total"},
        {"failover.recent_fires_lost_total", "queen_sweeper_failover_recent_fires_lost_total"},
        {"failover.lost_claims.pending", "queen_sweeper_failover_lost_claims_pending"},
        {"failover.lost_claims.handed_back_total", "queen_sweeper_failover_lost_claims_handed_back_total"},
        {"failover.in_doubt.fires_total", "queen_sweeper_failover_in_doubt_fires_total"},
        {"failover.in_doubt.fired_total", "queen_sweeper_failover_in_doubt_fired_total"},
        {"failover.in_doubt.not_fired_total", "queen_sweeper_failover_in_doubt_not_fired_total"},
        {"failover.in_doubt.pending", "queen_sweeper_failover_in_doubt_pending"},
        {"failover.in_doubt.timers_announced_total", "queen_sweeper_failover_in_doubt_timers_announced_total"},
        {"failover.in_doubt.unknown_total", "queen_sweeper_failover_in_doubt_unknown_total"},
        {"floor.lag_ms", "queen_sweeper_floor_lag_seconds"},
        {"floor.head_walks_total", "queen_sweeper_floor_head_walks_total"},
        {"floor.head_walk_ms", "queen_sweeper_floor_head_walk_seconds"},
        {"floor.head_walk_failures_total", "queen_sweeper_floor_head_walk_failures_total"},
        {"floor.behind_total", "queen_sweeper_floor_behind_total"},
        {"floor.dead_tuples", "queen_sweeper_timers_dead_tuples"},
        {"floor.resets_total", "queen_sweeper_floor_resets_total"},
        {"floor.tenants_named", "queen_sweeper_floor_tenants_named"},
        {"floor.held_rows", "queen_sweeper_floor_held_rows"},
        {"floor.ring_tenants", "queen_sweeper_floor_ring_tenants"},
        {"floor.ring_removed_total", "queen_sweeper_floor_ring_removed_total"},
        {"claims.claimed", "queen_sweeper_claims{state=\"claimed\"}"},
        {"claims.firing", "queen_sweeper_claims{state=\"firing\"}"},
        {"claims.kept", "queen_sweeper_claims{state=\"kept\"}"},
        {"claims.parked", "queen_sweeper_claims{state=\"parked\"}"},
        {"claims.refused_moves_total", "queen_sweeper_claims_refused_moves_total"},
    };
    nlohmann::json j = s.to_json();
    std::set<std::string> leaves;
    numeric_leaves(j, "", leaves);
    const std::string text = s.to_prometheus();
    const auto m = samples_of(text);
    for (const auto &leaf : leaves) {
        if (leaf.rfind("config.", 0) == 0) continue;              // the configuration, not a figure
        if (leaf == "loop_close_rc") continue;                    // teardown_clean says it as a flag
        if (leaf.rfind("pool.lanes.", 0) == 0) {                  // per lane, labelled
            const std::string lane = leaf.substr(11, leaf.find('.', 11) - 11);
            const std::string what = leaf.substr(leaf.rfind('.') + 1);
            const std::map<std::string, std::string> fam = {{"slots", "pool_lane_slots"},
                                                            {"in_use", "pool_lane_slots_in_use"},
                                                            {"waiting", "pool_lane_waiting"},
                                                            {"calls_total", "pool_lane_calls_total"}};
            ASSERT_TRUE(fam.count(what)) << leaf;
            EXPECT_TRUE(m.count("queen_sweeper_" + fam.at(what) + "{lane=\"" + lane + "\"}")) << leaf;
            continue;
        }
        if (leaf.rfind("phase_errors.", 0) == 0) {                // by phase and class
            const std::string phase = leaf.substr(13, leaf.find('.', 13) - 13);
            const std::string cls = leaf.substr(leaf.rfind('.') + 1);
            const bool pairs = (phase == "backstop") == (cls == "provider");
            EXPECT_EQ(m.count("queen_sweeper_errors_total{phase=\"" + phase + "\",class=\"" + cls + "\"}"),
                      pairs ? 1u : 0u)
                << leaf;
            continue;
        }
        auto it = exported.find(leaf);
        ASSERT_NE(it, exported.end()) << "JSON figure " << leaf << " has no metric";
        const std::string &sample = it->second;
        if (sample == "queen_sweeper_broker_info") {
            EXPECT_NE(text.find("queen_sweeper_broker_info{"), std::string::npos);
            continue;
        }
        EXPECT_TRUE(m.count(sample)) << leaf << " -> " << sample;
    }
    // And the phases and the state, which are strings in the JSON, as labelled gauges.
    for (const char *ph : {"fire", "rollup", "prune", "backstop"})
        EXPECT_TRUE(m.count(std::string("queen_sweeper_phase_state{phase=\"") + ph + "\",state=\"on\"}")) << ph;
    EXPECT_EQ(m.at("queen_sweeper_state{state=\"created\"}"), "1");
}

TEST(StatusName, NamesEveryCodeOfTheHeader) {
    EXPECT_STREQ(queen_sweeper_status_name(QUEEN_SWEEPER_OK), "QUEEN_SWEEPER_OK");
    EXPECT_STREQ(queen_sweeper_status_name(QUEEN_SWEEPER_EINVAL), "QUEEN_SWEEPER_EINVAL");
    EXPECT_STREQ(queen_sweeper_status_name(QUEEN_SWEEPER_ENOMEM), "QUEEN_SWEEPER_ENOMEM");
    EXPECT_STREQ(queen_sweeper_status_name(QUEEN_SWEEPER_ESTATE), "QUEEN_SWEEPER_ESTATE");
    EXPECT_STREQ(queen_sweeper_status_name(QUEEN_SWEEPER_ETIMEDOUT), "QUEEN_SWEEPER_ETIMEDOUT");
    EXPECT_STREQ(queen_sweeper_status_name(QUEEN_SWEEPER_ECORRUPT), "QUEEN_SWEEPER_ECORRUPT");
    EXPECT_STREQ(queen_sweeper_status_name(QUEEN_SWEEPER_EVERSION), "QUEEN_SWEEPER_EVERSION");
    EXPECT_STREQ(queen_sweeper_status_name(QUEEN_SWEEPER_EINTERNAL), "QUEEN_SWEEPER_EINTERNAL");
    EXPECT_STREQ(queen_sweeper_status_name(-9999), "QUEEN_SWEEPER_UNKNOWN");
    EXPECT_STREQ(queen_sweeper_status_name(1), "QUEEN_SWEEPER_UNKNOWN");
}

TEST(StatusName, WaitReadyRefusesASweeperThatIsNotRunning) {
    queen_sweeper *sw = nullptr;
    ASSERT_EQ(queen_sweeper_create("{\"read_env\": false, \"log_stderr\": false}", &sw), QUEEN_SWEEPER_OK);
    EXPECT_EQ(queen_sweeper_wait_ready(sw, 10), QUEEN_SWEEPER_ESTATE);
    EXPECT_NE(std::string(queen_sweeper_last_error()).find("not started"), std::string::npos);
    EXPECT_EQ(queen_sweeper_wait_ready(nullptr, 10), QUEEN_SWEEPER_EINVAL);
    ASSERT_EQ(queen_sweeper_stop(sw, 1000), QUEEN_SWEEPER_OK);
    EXPECT_EQ(queen_sweeper_wait_ready(sw, 10), QUEEN_SWEEPER_ESTATE);
    EXPECT_NE(std::string(queen_sweeper_last_error()).find("stopped"), std::string::npos);
    queen_sweeper_destroy(&sw);
    // A disabled sweeper never becomes ready: refused at once, not after the timeout.
    ASSERT_EQ(queen_sweeper_create("{\"read_env\": false, \"sweeper\": false, \"log_stderr\": false}", &sw),
              QUEEN_SWEEPER_OK);
    ASSERT_EQ(queen_sweeper_start(sw), QUEEN_SWEEPER_OK);
    EXPECT_EQ(queen_sweeper_wait_ready(sw, 60000), QUEEN_SWEEPER_ESTATE);
    EXPECT_NE(std::string(queen_sweeper_last_error()).find("disabled"), std::string::npos);
    queen_sweeper_destroy(&sw);
}

TEST(StatusName, TheApiTableEndsWithTheFunctionsOfMinorOne) {
    const queen_sweeper_api *api = queen_sweeper_get_api(QUEEN_SWEEPER_ABI_MAJOR);
    ASSERT_NE(api, nullptr);
    EXPECT_EQ(api->struct_size, sizeof(queen_sweeper_api));
    EXPECT_EQ(api->abi_minor, 1u);
    EXPECT_EQ(api->wait_ready, &queen_sweeper_wait_ready);
    EXPECT_EQ(api->status_name, &queen_sweeper_status_name);
    // Appended, never inserted: the 1.0 fields keep their offsets.
    EXPECT_GT(offsetof(queen_sweeper_api, wait_ready), offsetof(queen_sweeper_api, txn_hash));
    EXPECT_GT(offsetof(queen_sweeper_api, status_name), offsetof(queen_sweeper_api, wait_ready));
}
