// The cycle of the design document, top to bottom:
//   A. PROBE       one read-only call, one server now()
//   B. DRAIN       claim and fire in the same iteration, under a lease budget
//   C. SUB-CLOCKS  usage rollup, then KV prune, each on its own gate (subclocks.hpp)
//                  (the ephemeral backstop runs on its own timer: sweeper.cpp)
//   D. SLEEP       due-driven, clamped, interruptible by the local wake
#include <random>
#include <stdexcept>
#include <string_view>

#include "pg/classify.hpp"
#include "pg/schema.hpp"
#include "sweeper/handback.hpp"
#include "sweeper/ladder.hpp"
#include "sweeper/sweeper.hpp"

namespace qsw {

Task<void> Sweeper::run() {
    co_await prepare_schema();
    while (!stopping_.load()) {
        // Not ready because of the schema: look again now and then, so a schema an
        // operator applies (or grants given) later makes the sweeper ready.
        if (!schema_ok_ && uv_now(&loop_) >= next_schema_check_mono_) {
            co_await prepare_schema();
            if (stopping_.load()) break;
        }
        {
            std::lock_guard<std::mutex> g(stats_.mu);
            errors_at_cycle_start_ = stats_.f.cycle_errors_total;
        }
        // A cycle's own error is contained: counted against the fire, last_error set, and
        // the loop goes on after a backoff (the fire never switches itself off). The loop
        // ends only when it cannot run at all (its own libuv failures, loop_failed).
        if (g_test_fail_loop.exchange(false)) throw std::runtime_error("injected loop failure (test seam)");
        Settled<int64_t> c = co_await settle(cycle());
        const int64_t sleep_ms = c.error ? cycle_crashed(describe(c.error)) : *c.value;
        end_cycle_health();
        if (stopping_.load()) break;
        co_await sleep_for(sleep_ms);
    }
    // Graceful: hand back every claim still held so no other broker waits out a lease.
    if (!hard_stop_.load()) co_await release_held();
}

// The schema version this library's sql/ records (sql/007_version.sql). An embedded
// schema without queen.schema_version_v1 is unversioned: no check is possible.
constexpr int64_t kSchemaVersion = 5;

static bool embedded_schema_versioned() {
    return std::string_view(kSchemaSql).find("schema_version_v1") != std::string_view::npos;
}

Task<Sweeper::SchemaVersion> Sweeper::read_schema_version() {
    Query q;
    q.sql = "SELECT queen.schema_version_v1()";
    q.timeout_ms = cfg_.stmt_timeout_ms;
    PgResult r = co_await pool_->query(Lane::maint, std::move(q));
    SchemaVersion v;
    if (r.ok && r.rows() == 1 && !r.is_null(0, 0)) {
        v.ok = true;
        v.version = std::stoll(r.get(0, 0));
    } else if (r.ok || r.sqlstate == "42883" || r.sqlstate == "3F000" || r.sqlstate == "42P01") {
        // No function, no schema, no table, or nothing recorded: the database predates
        // versioning or has no schema at all.
        v.ok = true;
        v.absent = true;
    } else {
        v.error = std::move(r);
    }
    co_return v;
}

std::string Sweeper::last_stats_error() {
    std::lock_guard<std::mutex> g(stats_.mu);
    return stats_.f.last_error;
}

Task<void> Sweeper::prepare_schema() {
    const bool first = next_schema_check_mono_ == 0;
    next_schema_check_mono_ = uv_now(&loop_) + 5000;
    const bool versioned = embedded_schema_versioned();
    const int64_t want = versioned ? kSchemaVersion : 0;
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.schema_version_expected = want;
    }
    const std::string fix = "apply the library's sql/*.sql with psql -f as a role that may run DDL (see sql/README.md), "
                            "or set apply_schema=true";
    if (!versioned) {
        // A build without the version file: the schema step is the apply alone.
        if (!cfg_.apply_schema) set_schema_outcome(true, "unversioned", "");
        else if (first) {
            const bool ok = co_await apply_schema();
            set_schema_outcome(ok, ok ? "applied" : "failed", last_stats_error());
        }
        co_return;
    }
    SchemaVersion v = co_await read_schema_version();
    if (stopping_.load()) co_return;
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.schema_version_database = v.ok && !v.absent ? v.version : -1;
    }
    if (v.ok && !v.absent && v.version == want) {
        if (cfg_.apply_schema && first) log_.info("schema version " + std::to_string(want) + " already recorded: DDL skipped");
        set_schema_outcome(true, cfg_.apply_schema ? "skipped" : "current", "");
        co_return;
    }
    if (v.ok && !v.absent && v.version > want) {
        // Never apply older DDL over a newer schema: it would replace newer functions. The _v1
        // functions this library calls are kept by every later schema, so it runs as is.
        log_.warn("the database records schema version " + std::to_string(v.version) + ", newer than this library's " +
                  std::to_string(want) + ": " + (cfg_.apply_schema ? "DDL not applied; " : "") +
                  "the _v1 functions it calls are kept by newer schemas; upgrade this library when convenient");
        set_schema_outcome(true, "newer", "");
        co_return;
    }
    if (cfg_.apply_schema && first) {
        // Older, absent or unreadable: apply, then read back what the apply recorded.
        if (!co_await apply_schema()) {
            set_schema_outcome(false, "failed",
                               last_stats_error() + "; grant the role the rights to run DDL "
                               "on schema queen, or apply sql/*.sql as its owner and set apply_schema=false");
            co_return;
        }
        SchemaVersion after = co_await read_schema_version();
        {
            std::lock_guard<std::mutex> g(stats_.mu);
            stats_.f.schema_version_database = after.ok && !after.absent ? after.version : -1;
        }
        if (after.ok && !after.absent && after.version == want) {
            set_schema_outcome(true, "applied", "");
        } else {
            const std::string msg = "after the schema apply the database records version " +
                                    (after.ok && !after.absent ? std::to_string(after.version) : std::string("none")) +
                                    ", this library expects " + std::to_string(want);
            log_.error(msg);
            set_schema_outcome(false, "failed", msg);
        }
        co_return;
    }
    // apply_schema=false (or a failed apply being looked at again): say what to do.
    std::string state, reason;
    if (v.ok && v.absent) {
        state = "unversioned";
        reason = "the database has no queen.schema_version_v1(): the schema is not applied or predates version " +
                 std::to_string(want) + "; " + fix;
    } else if (v.ok) {
        state = "older";
        reason = "the database records schema version " + std::to_string(v.version) + ", older than this library's " +
                 std::to_string(want) + "; " + fix;
    } else {
        const bool transient = classify_sqlstate(v.error.sqlstate) == ErrorClass::transient;
        state = "pending";
        reason = "cannot read the schema version" +
                 (v.error.sqlstate.empty() ? std::string() : " (SQLSTATE " + v.error.sqlstate + ")") + ": " +
                 v.error.message +
                 (transient ? "" : v.error.sqlstate == "42501" ? "; grant the role USAGE on schema queen and EXECUTE "
                                                                 "on its functions (sql/README.md)"
                                                               : "");
        if (!transient) note_error("schema version check", v.error);
    }
    if (reason != schema_reason_) {
        if (state == "pending" && classify_sqlstate(v.error.sqlstate) == ErrorClass::transient) log_.info(reason);
        else log_.warn(reason);
    }
    set_schema_outcome(false, state, reason);
}

Task<bool> Sweeper::apply_schema() {
    int64_t backoff = 100;
    while (!stopping_.load()) {
        Query q;
        q.sql = kSchemaSql;
        q.simple = true;
        q.timeout_ms = std::max<int64_t>(cfg_.stmt_timeout_ms, 60000);
        PgResult r = co_await pool_->query(Lane::maint, std::move(q));
        if (r.ok) {
            log_.info("schema applied");
            co_return true;
        }
        // Two brokers applying at the same moment race on catalog rows; the files
        // are idempotent, so trying again is the whole fix.
        const bool race = r.sqlstate == "23505" || r.sqlstate == "42P07" || r.sqlstate == "42710" ||
                          r.sqlstate == "XX000" || r.sqlstate == "40P01";
        if (!race && classify_sqlstate(r.sqlstate) != ErrorClass::transient) {
            note_error("schema apply", r);
            log_.error("schema apply failed (SQLSTATE " + r.sqlstate + "): " + r.message +
                       "; the sweeper carries on and its calls will report what is missing");
            co_return false;
        }
        note_error("schema apply", r);
        publish_pool();
        co_await sleep_for(backoff);
        backoff = std::min<int64_t>(backoff * 2, 5000);
    }
    co_return false;
}

Task<int64_t> Sweeper::cycle() {
    if (g_test_fail_next_cycle.exchange(false)) throw std::runtime_error("injected internal error (test seam)");
    ++cycle_no_;
    // Re-arm the wake: from here on, any locally committed instant rings again.
    wake_hint_.store(INT64_MAX);
    if (std::exchange(woken_, false)) idle_cycles_ = 0;  // a wake resets the idle count
    const std::vector<int16_t> shards = shard_order(start_shard_, cycle_no_);
    const LadderStep step =
        shedding_ladder(pressure_, slow_pressure_, cfg_.sweeper_cycle_max_rows, cfg_.sweeper_claim_batch);

    // After a lost connection: resolve its unanswered fires and hand its claims back
    // (drain.cpp) before anything else, so they do not wait out the lease.
    co_await recovery_->run();

    // A. PROBE
    const ProbeResult pr = co_await probe(shards);
    publish_pool();
    note_probe(pr.ok);
    if (!pr.ok) update_ready();  // the reason carries the probe's error
    if (!pr.ok) {
        // The sub-clocks run on their own gates whatever the fire's health: a broken
        // timer schema must not stop the prune (whose alarm would freeze) or the rollup.
        // Only an unreachable or overloaded database skips them, since they would fail
        // the same way and add load where the fire is already waiting.
        int64_t ms = error_backoff_ms_;
        if (!last_error_transient_ && !stopping_.load()) {
            const bool kv_work = co_await sub_clocks_->run(shards, step, pressure_);
            ms = std::min(ms, sub_clocks_->ms_until_next_gate());
            if (kv_work) ms = std::min(ms, sub_clocks_->ms_until_prune());
            ms = std::max<int64_t>(ms, 1);
        }
        {
            std::lock_guard<std::mutex> g(stats_.mu);
            ++stats_.f.cycles_total;
            stats_.f.sleep_ms = ms;
        }
        co_return ms;
    }
    error_backoff_ms_ = 0;

    // B. DRAIN
    CycleOutcome outcome = CycleOutcome::idle;
    int64_t next_in = pr.next_in_ms;
    bool capped = false, out_of_time = false;
    if (!pr.fire_enabled) {
        // Paused by the operator (or maintenance): nothing is lost, the timers wait.
        // Keep looking at the ceiling so a resume takes effect within one cycle.
        outcome = CycleOutcome::work_due;
        next_in = cfg_.sweeper_max_sleep_ms;
        std::lock_guard<std::mutex> g(stats_.mu);
        ++stats_.f.fire_paused_cycles_total;
    } else if (pr.empty) {
        outcome = CycleOutcome::idle;
    } else if (pr.due > 0 || pr.next_in_ms <= 0 || drain_->kept_due()) {
        Drain::Result dr = co_await drain_->run(shards, step.fire_row_budget);
        capped = dr.capped;
        out_of_time = dr.out_of_time;
        if (dr.moved > 0) outcome = CycleOutcome::drained;
        else if (dr.empty_claim) outcome = CycleOutcome::empty_claim;
        else if (dr.failed) {
            outcome = CycleOutcome::work_due;
            next_in = cfg_.sweeper_transient_backoff_ms;
        } else outcome = CycleOutcome::work_due;
    } else {
        outcome = CycleOutcome::work_due;
    }
    const int64_t prev_pressure = pressure_;
    pressure_ = capped ? pressure_ + 1 : 0;
    slow_pressure_ = out_of_time ? slow_pressure_ + 1 : 0;
    if (out_of_time) drain_->reset_batch();  // a slow database: back to the base batch
    if (prev_pressure != pressure_ && pressure_ <= 3)  // the first steps and the return to 0, not every cycle
        log_.log(pressure_ ? QUEEN_SWEEPER_LOG_WARN : QUEEN_SWEEPER_LOG_INFO,
                 "pressure " + std::to_string(prev_pressure) + " -> " + std::to_string(pressure_) +
                     (capped ? ": the drain hit its budget" : ": the drain finished within its budget"));

    // C. SUB-CLOCKS: usage rollup, then KV prune. Shedding starts from the bottom.
    bool kv_work = false;
    if (!stopping_.load()) kv_work = co_await sub_clocks_->run(shards, step, prev_pressure);

    // D. SLEEP
    if (outcome == CycleOutcome::idle && kv_work) {
        outcome = CycleOutcome::work_due;  // expired keys remain: keep the prune's cadence
        next_in = cfg_.sweeper_max_sleep_ms;
    }
    idle_cycles_ = outcome == CycleOutcome::idle ? idle_cycles_ + 1 : 0;
    SleepBands bands{cfg_.sweeper_min_sleep_ms,       cfg_.sweeper_max_sleep_ms,
                     cfg_.sweeper_idle_max_sleep_ms,  cfg_.sweeper_idle_after_cycles,
                     cfg_.sweeper_empty_claim_min_ms, cfg_.sweeper_empty_claim_max_ms};
    std::uniform_real_distribution<double> jitter(0.0, 1.0);
    // Only a slow database lengthens the sleep; a backlog goes again at the floor.
    SleepInput in{outcome, next_in, idle_cycles_, jitter(rng_), slow_pressure_};
    // Never past a gate that is due, nor past the next try of a held partition's segments.
    const int64_t ms = std::max<int64_t>(
        1, std::min({compute_sleep_ms(bands, in), sub_clocks_->ms_until_next_gate(), drain_->ms_until_kept_due()}));
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        auto &f = stats_.f;
        ++f.cycles_total;
        f.pressure = pressure_;
        f.slow_pressure = slow_pressure_;
        if (capped) ++f.capped_cycles_total;
        f.sleep_ms = ms;
        f.idle_cycles = idle_cycles_;
        f.phase_fire = "on";
    }
    co_return ms;
}

// A cycle that threw: what it held is still in held_ and goes back on the next cycle's
// hand-backs or at stop; the failure is counted and the next cycle comes after a backoff.
int64_t Sweeper::cycle_crashed(const std::string &why) {
    PgResult bad;
    bad.origin = Origin::internal;
    bad.message = "the cycle ended by an internal error: " + why;
    log_.error(bad.message + "; the loop goes on after a backoff");
    cycle_failed("fire", bad);
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        ++stats_.f.cycles_total;
        ++stats_.f.cycle_crashes_total;
    }
    return std::max<int64_t>(error_backoff_ms_, 1);
}

void Sweeper::cycle_failed(const std::string &phase, const PgResult &r) {
    note_error(phase, r);
    const ErrorClass c = classify(r);
    last_error_transient_ = c == ErrorClass::transient;
    const int64_t prev = error_backoff_ms_;
    if (c == ErrorClass::transient) {
        error_backoff_ms_ = cfg_.sweeper_transient_backoff_ms;
    } else {
        // A broken schema or a missing function: the fire never turns itself off,
        // it keeps trying with a doubling backoff and says why.
        error_backoff_ms_ = std::clamp<int64_t>(prev * 2, cfg_.sweeper_backoff_min_ms, cfg_.sweeper_backoff_max_ms);
    }
    const std::string msg = phase + " failed (" + error_class_name(c) +
                            (r.sqlstate.empty() ? "" : ", SQLSTATE " + r.sqlstate) + "): " + r.message;
    if (msg != last_logged_error_) {
        log_.warn(msg + "; retrying in " + std::to_string(error_backoff_ms_) + " ms");
        last_logged_error_ = msg;
    }
}

}  // namespace qsw

namespace qsw {

// Graceful stop: every claim still held goes back, so no other broker waits out a lease.
// Fires a lost connection left unanswered are resolved first, so the host hears of those
// that committed; what is left of them is released with the rest.
Task<void> Sweeper::release_held() {
    if (recovery_->has_parked() && pool_->up()) co_await recovery_->run();
    if (held_.empty()) co_return;
    std::vector<RowRef> rows;
    rows.reserve(held_.size());
    for (const auto &[k, tok] : held_.all()) rows.push_back(RowRef{std::get<0>(k), std::get<1>(k), std::get<2>(k), tok});
    std::optional<int64_t> n = co_await release_rows(*ctx_, rows, cfg_.stmt_timeout_ms, "release at stop");
    if (!n) {
        log_.warn("could not release " + std::to_string(rows.size()) + " claim(s) at stop; they lapse with their lease");
        co_return;
    }
    held_.clear();
    recovery_->forget_parked();
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.released_on_stop_total += *n;
    }
    log_.info("released " + std::to_string(*n) + " claim(s) at stop");
}

}  // namespace qsw
