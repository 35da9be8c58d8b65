// Figures the loop publishes and any thread may read. Each phase writes its own struct on the
// loop thread without a lock; the publish gathers them under the mutex; the wake path only
// touches the atomics.
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "pg/pool.hpp"

namespace qsw {

// Fire lateness since start as cumulative histogram buckets, the form Prometheus
// aggregates across brokers (quantiles of separate processes cannot be averaged).
struct LagHistogram {
    // Upper bounds in milliseconds; the +Inf bucket is the total count.
    static constexpr std::array<int64_t, 14> kBoundsMs = {5,    10,   25,   50,    100,   250,   500,
                                                          1000, 2500, 5000, 10000, 30000, 60000, 300000};
    std::array<int64_t, kBoundsMs.size()> buckets{};  // per bucket, not cumulative
    int64_t count = 0;
    int64_t sum_ms = 0;
    void observe(int64_t ms) {
        for (size_t i = 0; i < kBoundsMs.size(); ++i)
            if (ms <= kBoundsMs[i]) {
                ++buckets[i];
                break;
            }
        ++count;
        sum_ms += ms;
    }
};

// A fixed ring of the most recent fire lags, so p50/p99 cost O(ring) at read time
// and nothing on the fire path beyond one store; every lag also lands in the
// since-start histogram.
class LagRing {
public:
    void add(int64_t ms) {
        ring_[next_ % ring_.size()] = ms;
        ++next_;
        hist_.observe(ms);
    }
    int64_t percentile(double p) const;
    size_t size() const { return std::min<size_t>(next_, ring_.size()); }
    const LagHistogram &histogram() const { return hist_; }

private:
    std::vector<int64_t> ring_ = std::vector<int64_t>(4096, 0);
    size_t next_ = 0;
    LagHistogram hist_;
};

// Where an error happened, for the per-phase error counters: the cycle's steps
// folded into the phases an operator knows (probe, claim, fire, fail, dlq and
// release all serve the fire).
enum class ErrorPhase { schema, fire, prune, rollup, backstop, count };
// schema, fire, prune, rollup, backstop
const char *error_phase_name(ErrorPhase p);
// The classifier's classes, "provider" for a backstop provider's own status, and "internal"
// for this library's own failures (an exception in a step, contained by the loop).
enum class ErrorKind { transient, config, permanent, provider, internal, count };
const char *error_kind_name(ErrorKind k);
ErrorPhase error_phase_of(const std::string &step);  // "claim" -> fire, "KV prune" -> prune, ...

// A lost connection and what followed it (sweeper/drain.cpp): when and where it was lost, the
// server found again, when firing resumed, the claims handed back, and the fires whose
// outcome the lost connection took with it, resolved from the log after reconnecting.
// How long the calls that find due rows take (issue 34): the probe and the claim each
// expect milliseconds whatever the table holds. A call over kSlowMs (a plan that went bad,
// a JIT compile, a walk through what a long transaction keeps alive) is counted, so that
// an alert can say so before the drain runs out of its lease.
struct CallFigures {
    static constexpr int64_t kSlowMs = 1000;
    int64_t last_ms = -1;  // -1: none yet
    int64_t max_ms = 0;
    int64_t calls_total = 0;
    int64_t slow_total = 0;  // calls that took kSlowMs or more
    LagHistogram hist;       // milliseconds, the fire lag's buckets

    void observe(int64_t elapsed_us) {
        const int64_t ms = elapsed_us / 1000;
        last_ms = ms;
        max_ms = std::max(max_ms, ms);
        ++calls_total;
        if (ms >= kSlowMs) ++slow_total;
        hist.observe(ms);
    }
    nlohmann::json to_json() const {
        return {{"last_ms", last_ms}, {"max_ms", max_ms}, {"calls_total", calls_total}, {"slow_total", slow_total}};
    }
};

// The floor the probe and the claim start from, and what a long transaction elsewhere in
// the database leaves behind it (sweeper/floor.hpp, docs/operations.md "Long transactions").
struct FloorFigures {
    int64_t lag_ms = -1;              // server now - the floor at the last probe (-1: no floor yet)
    int64_t head_walks_total = 0;     // walks from the index head for rows behind the floor
    int64_t head_walk_ms = -1;        // how long the last one took (-1: none yet)
    int64_t head_walk_failures_total = 0;
    int64_t behind_total = 0;         // walks that found a row behind the floor (a slow transaction's)
    int64_t dead_tuples = -1;         // n_dead_tup of queen.log_timers at the last walk (-1: unknown)
    int64_t resets_total = 0;         // floors dropped (a new server): the next probe walks from the head
    int64_t tenants_named = 0;        // tenants in the last claim that walked the ring; 0 when it did not
    int64_t held_rows = 0;            // listed held rows due at the last probe (queen.log_timers_held)
    int64_t ring_tenants = -1;        // entries of the tenants' ring at the last tidy (-1: none yet)
    int64_t ring_removed_total = 0;   // tenants without timers the tidies removed from the ring

    nlohmann::json to_json() const {
        return {{"lag_ms", lag_ms},
                {"head_walks_total", head_walks_total},
                {"head_walk_ms", head_walk_ms},
                {"head_walk_failures_total", head_walk_failures_total},
                {"behind_total", behind_total},
                {"dead_tuples", dead_tuples},
                {"resets_total", resets_total},
                {"tenants_named", tenants_named},
                {"held_rows", held_rows},
                {"ring_tenants", ring_tenants},
                {"ring_removed_total", ring_removed_total}};
    }
};

// The claim book (sweeper/claim_book.hpp): the claimed rows this sweeper holds, by state,
// and the moves it refused (a bug of this library if ever above 0).
struct ClaimBookStats {
    int64_t claimed = 0, firing = 0, kept = 0, parked = 0;
    int64_t refused_moves_total = 0;

    nlohmann::json to_json() const {
        return {{"claimed", claimed},
                {"firing", firing},
                {"kept", kept},
                {"parked", parked},
                {"refused_moves_total", refused_moves_total}};
    }
};

struct FailoverFigures {
    int64_t lost_total = 0;              // drain calls that got no answer (connection, deadline, read-only)
    int64_t last_lost_unix_ms = -1;
    std::string last_lost_phase;         // claim, fire, fail, connection
    std::string last_lost_error;
    std::string lost_server;             // host:port the connection was on when it was lost
    std::string server;                  // host:port of the server the sweeper talks to now
    std::string server_identity;         // "<system identifier>/<timeline>" of that server (empty: unreadable)
    bool server_in_recovery = false;
    int64_t server_changes_total = 0;    // a different server after a loss: a failover
    int64_t reconnected_unix_ms = -1;    // the server was identified again after the loss
    int64_t resumed_unix_ms = -1;        // the first fire committed after the loss
    int64_t last_gap_ms = -1;            // lost -> resumed
    int64_t read_only_total = 0;         // drain calls refused by a read-only server (25006)
    int64_t parked_claims = 0;           // claims held from a lost call, waiting to be handed back
    int64_t handed_back_total = 0;       // of those, handed back (token-matched) after reconnecting
    int64_t in_doubt_fires_total = 0;    // fire calls sent whose answer was lost
    int64_t in_doubt_fired_total = 0;    // ... found committed in the log: announced through on_fired
    int64_t in_doubt_not_fired_total = 0;  // ... found not committed: their claims handed back
    int64_t in_doubt_pending = 0;        // ... not resolved yet
    int64_t in_doubt_unknown_total = 0;  // ... could not be checked (no table privileges): not announced
    int64_t in_doubt_timers_announced_total = 0;
    int64_t lost_claims_total = 0;              // claim calls sent whose answer was lost
    int64_t lost_claims_pending = 0;            // ... not handed back yet (remembered by id)
    int64_t lost_claims_handed_back_total = 0;  // timers of those handed back after reconnecting
    int64_t recent_fires_checked_total = 0;  // announced segments looked for on a new server after a failover
    int64_t recent_fires_lost_total = 0;     // ... timers of those it lacked (asynchronous replication)

    nlohmann::json to_json() const {
        return {{"lost_total", lost_total},
                {"last_lost_unix_ms", last_lost_unix_ms},
                {"last_lost_phase", last_lost_phase},
                {"last_lost_error", last_lost_error},
                {"lost_server", lost_server},
                {"server", server},
                {"server_identity", server_identity},
                {"server_in_recovery", server_in_recovery},
                {"server_changes_total", server_changes_total},
                {"reconnected_unix_ms", reconnected_unix_ms},
                {"resumed_unix_ms", resumed_unix_ms},
                {"last_gap_ms", last_gap_ms},
                {"read_only_total", read_only_total},
                {"parked_claims", parked_claims},
                {"handed_back_total", handed_back_total},
                {"recent_fires_checked_total", recent_fires_checked_total},
                {"recent_fires_lost_total", recent_fires_lost_total},
                {"lost_claims", {{"total", lost_claims_total},
                                 {"pending", lost_claims_pending},
                                 {"handed_back_total", lost_claims_handed_back_total}}},
                {"in_doubt", {{"fires_total", in_doubt_fires_total},
                              {"fired_total", in_doubt_fired_total},
                              {"not_fired_total", in_doubt_not_fired_total},
                              {"pending", in_doubt_pending},
                              {"unknown_total", in_doubt_unknown_total},
                              {"timers_announced_total", in_doubt_timers_announced_total}}}};
    }
};

// The drain's figures (sweeper/drain.hpp). The drain alone writes them, on the loop thread and
// without a lock; the snapshot takes a copy at each publish. fired_total, fired_segments_total
// and released_total are the drain's part: the snapshot adds the recovery's (fires found
// committed after a lost answer, rows handed back after reconnecting).
struct DrainFigures {
    int64_t claims_total = 0;
    int64_t claimed_total = 0;
    int64_t claimed_bytes_total = 0;      // payload bytes the claims carried
    int64_t late_handed_back_total = 0;   // rows handed back because their claim's deadline came first
    int64_t busy_kept_segments = 0;       // segments of partitions someone holds, kept to be tried again
    int64_t busy_retries_total = 0;       // tries of kept segments
    int64_t empty_claims_total = 0;    // passes whose first claim took nothing while work was due
    int64_t claims_around_held_empty_total = 0;  // claims around kept segments that took nothing
    int64_t claims_held_back_total = 0;  // such claims not sent again (hold_back_claim)
    int64_t claim_batch = 0;           // rows the next claim asks for (grows while a backlog lasts)
    int64_t claims_ahead_total = 0;    // claims sent while the previous claim was being fired
    int64_t claims_packed_ahead_total = 0;  // of those, packed before their turn to fire came
    int64_t claims_carried_total = 0;  // of those, sent beside a pass's last fire for the next cycle
    int64_t contended_claims_total = 0;  // claims whose fires met another broker (busy or stale)
    int64_t fires_waiting_first_total = 0;  // fires sent waiting at once: every partition busy lately
    int64_t fired_total = 0;           // timers delivered into the log
    int64_t fired_segments_total = 0;
    int64_t stale_total = 0;           // segments found stale at fire time
    int64_t duplicate_total = 0;       // timers whose txn was already in the log
    int64_t released_total = 0;        // claimed rows handed back without delivery
    int64_t fire_txns_total = 0;
    int64_t fire_busy_total = 0;       // segments deferred because their partition was held elsewhere
    int64_t fire_provision_busy_total = 0;  // of those, segments whose queue or partition could not be
                                            // provisioned: another transaction held the name (schema 18)
    int64_t fire_bytes_total = 0;
    int64_t fire_failures_transient = 0, fire_failures_config = 0, fire_failures_permanent = 0;
    int64_t poisoned_total = 0;        // timers isolated as the cause of a permanent failure
    int64_t dlq_total = 0;
    int64_t rejected_total = 0;        // rows the packer refused (e.g. a corrupt zstd payload)
    LagRing fire_lag;
    int64_t fire_lag_max_ms = 0;
    int64_t inflate_deferred_total = 0;  // payload_zstd rows handed back over the inflation budget
    CallFigures claim_calls;
};

// The KV prune's figures (sweeper/prune.hpp), written by the prune alone on the loop thread.
struct PruneFigures {
    std::string phase_prune = "on";  // on, off_config, shed
    int64_t kv_deleted_total = 0;
    int64_t kv_prune_calls_total = 0;
    int64_t kv_expired_not_pruned = 0;
    bool kv_expired_not_pruned_capped = false;
    int64_t kv_expiry_lag_ms = 0;
};

// The usage rollup's figures (sweeper/rollup.hpp), written by the rollup alone. The tenants'
// gauges are shared, not copied, by each publish: they change once per pass.
struct RollupFigures {
    std::string phase_rollup = "on";  // on, off_config, shed
    int64_t rollup_runs_total = 0;
    int64_t rollup_skipped_total = 0;  // gate open here, but another broker's pass was recent or running
    double rollup_max_quota_ratio = 0;
    bool rollup_sampled = false;
    std::shared_ptr<const nlohmann::json> rollup_tenants;  // null: no pass yet (an empty array)
};

// The ephemeral backstop's figures (sweeper/backstop.hpp), written by its timer's pass.
struct BackstopFigures {
    std::string phase_backstop = "off";  // on when a provider is set
    int64_t backstop_runs_total = 0, backstop_failures_total = 0;
    int64_t backstop_redelivered_total = 0, backstop_exhausted_total = 0;
    int64_t backstop_ttl_dropped_total = 0, backstop_queues_collected_total = 0;
    int64_t backstop_next_expiry_unix_ms = -1;
};

// The snapshot a host reads: each phase's own figures (by inheritance, with the same flat
// JSON keys as ever), gathered under Stats::mu by Sweeper::publish_pool. What is declared
// here directly is the sweeper's own: its loop, probe, readiness and lifecycle.
struct Figures : DrainFigures, PruneFigures, RollupFigures, BackstopFigures {
    std::string state = "created";  // created, running, stopping, stopped, disabled
    std::string broker_id;
    int start_shard = 0;
    int64_t cycles_total = 0;
    int64_t probes_total = 0;
    int64_t cycle_crashes_total = 0;      // cycles ended by an internal error (contained: the loop went on)
    int64_t claim_turn_timeouts_fleet_total = 0;  // the whole fleet's claims that walked without the
                                                  // claim turn (its wait ran out), from the last probe
    int64_t released_on_stop_total = 0;
    int64_t timers_due = 0;
    bool timers_due_capped = false;
    int64_t timers_oldest_late_ms = 0;
    int64_t next_in_ms = -1;
    bool fire_enabled = true;
    bool maintenance = false;
    int64_t fire_paused_cycles_total = 0;
    int64_t cycle_errors_total = 0;
    int64_t loop_failures_total = 0;
    // Log lines of a repeating failure left out (each cause's count is said once per
    // kLogRepeatIntervalMs instead, base/log_limit.hpp).
    int64_t log_lines_suppressed_total = 0;
    std::string last_error;
    // Health: errors by phase and class, and cycles in which any phase failed.
    std::array<std::array<int64_t, static_cast<size_t>(ErrorKind::count)>, static_cast<size_t>(ErrorPhase::count)>
        phase_errors{};
    int64_t failed_cycles_total = 0;
    int64_t consecutive_failed_cycles = 0;
    // Readiness: the schema step (apply or version check) and a first completed probe.
    bool ready = false;
    std::string ready_reason = "not started";
    std::string schema_state = "pending";  // pending, applied, current, skipped, newer, older, unversioned, failed
    int64_t schema_version_expected = 0;   // what this library embeds (0: an unversioned schema)
    int64_t schema_version_database = -1;  // what the database records (-1: unknown or none)
    std::vector<std::string> config_warnings;  // e.g. a misspelt QUEEN_* variable, found at create
    std::string phase_fire = "on";
    // The loop.
    int64_t pressure = 0;
    int64_t slow_pressure = 0;
    int64_t capped_cycles_total = 0;
    int64_t sleep_ms = 0;
    int64_t idle_cycles = 0;
    int64_t wake_cut_sleeps_total = 0;  // sleeps a wake actually shortened
    int loop_close_rc = -1;             // uv_loop_close result after stop (0 = clean; -1 before)
    bool teardown_clean = false;
    PoolFigures pool;
    FailoverFigures failover;
    FloorFigures floor;
    ClaimBookStats claims;
    CallFigures probe_calls, claim_calls;
    nlohmann::json config = nlohmann::json::object();
};

// Prometheus text exposition built family by family: HELP and TYPE are written
// once, when the family is opened, and every sample of it follows at once, so a
// name can neither repeat its header nor interleave with another family.
class PromFamilies {
public:
    using Labels = std::vector<std::pair<std::string, std::string>>;
    class Family {
    public:
        // A sample of this family; `suffix` is for a histogram's _bucket, _sum, _count.
        Family &sample(double v, const Labels &labels = {}, const char *suffix = "");
        Family &sample(int64_t v, const Labels &labels = {}, const char *suffix = "") {
            return sample(static_cast<double>(v), labels, suffix);
        }

    private:
        friend class PromFamilies;
        Family(PromFamilies *owner, std::string name) : owner_(owner), name_(std::move(name)) {}
        PromFamilies *owner_;
        std::string name_;  // without the prefix
    };
    // type: counter, gauge, histogram, summary, untyped. The name is the full
    // metric name without the common prefix (counters end in _total).
    Family family(const std::string &name, const char *type, const std::string &help);
    const std::string &text() const { return out_; }
    static std::string escape_label(const std::string &v);
    static std::string format_value(double v);

private:
    std::string out_;
    // Refuses a family opened twice and a sample written after another family was
    // opened: both are bugs in this file, caught by the unit test, never by a scrape.
    std::vector<std::string> opened_;
};

struct Stats {
    std::mutex mu;
    Figures f;
    std::atomic<int64_t> wakes_total{0};
    std::atomic<int64_t> wake_signals_total{0};
    std::atomic<int64_t> backstop_wakes_total{0};

    nlohmann::json to_json();
    std::string to_prometheus();
    // healthy: running, ready, and the last cycle finished with no phase failing.
    static bool healthy(const Figures &f);
};

}  // namespace qsw
