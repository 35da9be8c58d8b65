// The cycle of the design document, top to bottom:
//   A. PROBE       one read-only call, one server now()
//   B. DRAIN       claim and fire in the same iteration, under a lease budget
//   C. SUB-CLOCKS  usage rollup, then KV prune, each on its own gate (subclocks.hpp)
//                  (the ephemeral backstop runs on its own timer: sweeper.cpp)
//   D. SLEEP       due-driven, clamped, interruptible by the local wake
#include <random>
#include <stdexcept>

#include "pg/classify.hpp"
#include "sweeper/awaitables.hpp"
#include "sweeper/handback.hpp"
#include "sweeper/ladder.hpp"
#include "sweeper/sweeper.hpp"

namespace qsw {

Task<void> Sweeper::run() {
    co_await schema_->run();
    while (!life_.stopping()) {
        // Not ready because of the schema: look again now and then, so a schema an
        // operator applies (or grants given) later makes the sweeper ready.
        if (schema_->recheck_due()) {
            co_await schema_->run();
            if (life_.stopping()) break;
        }
        readiness_.begin_cycle();
        // A cycle's own error is contained: counted against the fire, last_error set, and
        // the loop goes on after a backoff (the fire never switches itself off). The loop
        // ends only when it cannot run at all (its own libuv failures, loop_failed).
        if (g_test_fail_loop.exchange(false)) throw std::runtime_error("injected loop failure (test seam)");
        Settled<int64_t> c = co_await settle(cycle());
        const int64_t sleep_ms = c.error ? cycle_crashed(describe(c.error)) : *c.value;
        readiness_.end_cycle();
        if (life_.stopping()) break;
        co_await bell_.sleep_for(sleep_ms);
    }
    // Graceful: hand back every claim still held so no other broker waits out a lease.
    // A walk from the head still running is cut short first (its call cancelled on the
    // server): the floor it would lower ends with the sweeper, and its connection and
    // admission slot go to the release, which never waits for it. The walk's coroutine
    // holds this loop's state: awaited last.
    if (floor_ && floor_->head_walking()) pool_->cut_short_at_stop("stopping: the walk from the index head cut short");
    if (!life_.hard_stop()) co_await release_held();
    while (floor_ && floor_->head_walking()) co_await loop_delay(&loop_, 5);
}

Task<int64_t> Sweeper::cycle() {
    if (g_test_fail_next_cycle.exchange(false)) throw std::runtime_error("injected internal error (test seam)");
    ++cycle_.cycle_no;
    // Re-arm the wake: from here on, any locally committed instant rings again.
    if (bell_.rearm()) {
        cycle_.idle_cycles = 0;  // a wake resets the idle count
        drain_->note_wake();     // and ends a hold-back of claims around kept segments
    }
    const std::vector<int16_t> shards = shard_order(cycle_.start_shard, cycle_.cycle_no);
    const LadderStep step =
        shedding_ladder(cycle_.pressure, cycle_.slow_pressure, cfg_.sweeper_cycle_max_rows, cfg_.sweeper_claim_batch);

    // After a lost connection: resolve its unanswered fires and hand its claims back
    // (recovery.cpp) before anything else, so they do not wait out the lease.
    co_await recovery_->run();
    if (recovery_->server_changes() != server_changes_seen_) {  // a new server: its own rows and clock
        server_changes_seen_ = recovery_->server_changes();
        floor_->reset();
    }

    // A. PROBE
    const ProbeResult pr = co_await probe(shards);
    publish_pool();
    readiness_.note_probe(pr.ok);
    if (!pr.ok) {
        readiness_.update();  // the reason carries the probe's error
        const int64_t ms = co_await after_failed_probe(shards, step);
        co_return ms;
    }
    backoff_.ms = 0;

    // B. DRAIN
    const DrainStep d = co_await drain_step(pr, shards, step);
    // The walk from the index head for a slow transaction's rows behind the floor: beside
    // the cycle, never on the drain's path (it passes every dead entry behind the floor).
    if (!life_.stopping() && floor_->head_walk_due())
        spawn(floor_->head_walk(), [this](std::exception_ptr e) {
            if (e) log_.error("the walk from the index head ended by an internal error: " + describe(e));
        });
    const int64_t prev_pressure = note_pressure(d);

    // C. SUB-CLOCKS: usage rollup, then KV prune. Shedding starts from the bottom.
    bool kv_work = false;
    if (!life_.stopping()) kv_work = co_await sub_clocks_->run(shards, step, prev_pressure);

    // D. SLEEP (the cycle's figures in the snapshot first)
    publish_pool();
    co_return sleep_after(d, kv_work);
}

// The sub-clocks run on their own gates whatever the fire's health: a broken timer schema
// must not stop the prune (whose alarm would freeze) or the rollup. Only an unreachable or
// overloaded database skips them, since they would fail the same way and add load where
// the fire is already waiting.
Task<int64_t> Sweeper::after_failed_probe(const std::vector<int16_t> &shards, const LadderStep &step) {
    int64_t ms = backoff_.ms;
    if (!backoff_.transient && !life_.stopping()) {
        const bool kv_work = co_await sub_clocks_->run(shards, step, cycle_.pressure);
        ms = std::min(ms, sub_clocks_->ms_until_next_gate());
        if (kv_work) ms = std::min(ms, sub_clocks_->ms_until_prune());
        ms = std::max<int64_t>(ms, 1);
    }
    std::lock_guard<std::mutex> g(stats_.mu);
    ++stats_.f.cycles_total;
    stats_.f.sleep_ms = ms;
    co_return ms;
}

// What the probe says to do, done: nothing (paused, idle, not due yet) or a drain.
Task<Sweeper::DrainStep> Sweeper::drain_step(const ProbeResult &pr, const std::vector<int16_t> &shards,
                                             const LadderStep &step) {
    DrainStep d;
    d.next_in = pr.next_in_ms;
    if (!pr.fire_enabled) {
        // Paused by the operator (or maintenance): nothing is lost, the timers wait.
        // Keep looking at the ceiling so a resume takes effect within one cycle. A claim
        // carried from the last cycle goes back (due again at once for whoever resumes).
        if (drain_->carrying()) co_await drain_->hand_back_carried("the fire is paused");
        d.outcome = CycleOutcome::work_due;
        d.next_in = cfg_.sweeper_max_sleep_ms;
        std::lock_guard<std::mutex> g(stats_.mu);
        ++stats_.f.fire_paused_cycles_total;
        co_return d;
    }
    // A claim carried from the last cycle is fired whatever the probe saw (its rows are in
    // flight, not due to anyone else).
    const bool carrying = drain_->carrying();
    if (pr.empty && pr.held <= 0 && !carrying) co_return d;  // idle
    d.outcome = CycleOutcome::work_due;
    // Nothing due for the walk: a drain only for held rows, at most once per sleep ceiling.
    const bool held_only =
        pr.due <= 0 && (pr.empty || pr.next_in_ms > 0) && !drain_->kept_due() && !carrying;
    if (held_only) {
        d.next_in = pr.empty ? cfg_.sweeper_max_sleep_ms : pr.next_in_ms;
        const uint64_t now = uv_now(&loop_);
        if (!try_held_rows(pr.held, now, cycle_.held_tried_at, cfg_.sweeper_max_sleep_ms)) co_return d;
        cycle_.held_tried_at = now;
    }
    // The rollup's gate within half a lease (the pass claims nothing after half a lease): it
    // may run before the next drain, so this pass carries no claim into it.
    const bool phase_due = sub_clocks_->ms_until_next_gate() <= cfg_.sweeper_lease_ms / 2;
    const Drain::Result dr = co_await drain_->run(shards, step.fire_row_budget, phase_due);
    d.capped = dr.capped;
    d.out_of_time = dr.out_of_time;
    d.failed_transient = dr.failed && backoff_.transient;  // unreachable or overloaded
    if (dr.moved > 0) d.outcome = CycleOutcome::drained;
    else if (dr.empty_claim && !held_only) d.outcome = CycleOutcome::empty_claim;
    else if (dr.failed) d.next_in = cfg_.sweeper_transient_backoff_ms;
    co_return d;
}

// Only database pressure is pressure: a drain that ran out of its half-lease (slow) or whose
// call failed transiently. A drain that merely used up its rows in good time is a backlog on
// a healthy database, and shedding the prune would only blind its alarm. Returns the
// pressure before this cycle (what the sub-clocks are shed by).
int64_t Sweeper::note_pressure(const DrainStep &d) {
    const int64_t prev_pressure = cycle_.pressure;
    const bool db_pressure = d.out_of_time || d.failed_transient;
    cycle_.pressure = db_pressure ? cycle_.pressure + 1 : 0;
    cycle_.slow_pressure = d.out_of_time ? cycle_.slow_pressure + 1 : 0;
    if (d.out_of_time) drain_->reset_batch();  // a slow database: back to the base batch
    // The first steps and the return to 0, not every cycle.
    if (prev_pressure != cycle_.pressure && cycle_.pressure <= 3)
        log_.log(cycle_.pressure ? QUEEN_SWEEPER_LOG_WARN : QUEEN_SWEEPER_LOG_INFO,
                 "pressure " + std::to_string(prev_pressure) + " -> " + std::to_string(cycle_.pressure) +
                     (d.out_of_time        ? ": the drain ran out of its half-lease (the database is slow)"
                      : d.failed_transient ? ": a drain call failed (the database is unreachable or overloaded)"
                                           : ": the database keeps up"));
    return prev_pressure;
}

// D. SLEEP: the bands (sleep.hpp), never past a gate that is due, nor past the next try of
// a held partition's segments, nor past the end of a hold-back of claims around them.
int64_t Sweeper::sleep_after(DrainStep d, bool kv_work) {
    if (d.outcome == CycleOutcome::idle && kv_work) {
        d.outcome = CycleOutcome::work_due;  // expired keys remain: keep the prune's cadence
        d.next_in = cfg_.sweeper_max_sleep_ms;
    }
    cycle_.idle_cycles = d.outcome == CycleOutcome::idle ? cycle_.idle_cycles + 1 : 0;
    SleepBands bands{cfg_.sweeper_min_sleep_ms,       cfg_.sweeper_max_sleep_ms,
                     cfg_.sweeper_idle_max_sleep_ms,  cfg_.sweeper_idle_after_cycles,
                     cfg_.sweeper_empty_claim_min_ms, cfg_.sweeper_empty_claim_max_ms};
    std::uniform_real_distribution<double> jitter(0.0, 1.0);
    // Only a slow database lengthens the sleep; a backlog goes again at the floor.
    SleepInput in{d.outcome, d.next_in, cycle_.idle_cycles, jitter(cycle_.rng), cycle_.slow_pressure};
    const int64_t ms = std::max<int64_t>(
        1, std::min({compute_sleep_ms(bands, in), sub_clocks_->ms_until_next_gate(), drain_->ms_until_kept_due(),
                               drain_->ms_until_hold_back_ends()}));
    std::lock_guard<std::mutex> g(stats_.mu);
    auto &f = stats_.f;
    ++f.cycles_total;
    f.pressure = cycle_.pressure;
    f.slow_pressure = cycle_.slow_pressure;
    if (d.capped) ++f.capped_cycles_total;
    f.sleep_ms = ms;
    f.idle_cycles = cycle_.idle_cycles;
    f.phase_fire = "on";
    return ms;
}

// A cycle that threw: what it held is still in the claim book and goes back on the next cycle's
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
    return std::max<int64_t>(backoff_.ms, 1);
}

void Sweeper::cycle_failed(const std::string &phase, const PgResult &r) {
    note_error(phase, r);
    const ErrorClass c = classify(r);
    backoff_.transient = c == ErrorClass::transient;
    const int64_t prev = backoff_.ms;
    if (c == ErrorClass::transient) {
        backoff_.ms = cfg_.sweeper_transient_backoff_ms;
    } else {
        // A broken schema or a missing function: the fire never turns itself off,
        // it keeps trying with a doubling backoff and says why.
        backoff_.ms = std::clamp<int64_t>(prev * 2, cfg_.sweeper_backoff_min_ms, cfg_.sweeper_backoff_max_ms);
    }
    const std::string msg = phase + " failed (" + error_class_name(c) +
                            (r.sqlstate.empty() ? "" : ", SQLSTATE " + r.sqlstate) + "): " + r.message;
    // Once per cause per interval, with its count (base/log_limit.hpp): the retry delay and
    // any count in the message change from one failure to the next, the cause does not.
    log_.limited(QUEEN_SWEEPER_LOG_WARN, log_cause(phase, r.sqlstate, r.message),
                 msg + "; retrying in " + std::to_string(backoff_.ms) + " ms", static_cast<int64_t>(uv_now(&loop_)));
}

}  // namespace qsw

namespace qsw {

// Graceful stop: every claim still held goes back, so no other broker waits out a lease.
// Fires a lost connection left unanswered are resolved first, so the host hears of those
// that committed; what is left of them is released with the rest.
Task<void> Sweeper::release_held() {
    if (recovery_->has_parked() && pool_->up()) co_await recovery_->run();
    if (book_.empty()) co_return;
    std::vector<RowRef> rows;
    rows.reserve(book_.size());
    book_.for_each([&](std::string_view tenant, std::string_view queue, std::string_view key, std::string_view tok) {
        rows.push_back(RowRef{std::string(tenant), std::string(queue), std::string(key), std::string(tok)});
    });
    std::optional<int64_t> n = co_await release_rows(*ctx_, rows, cfg_.stmt_timeout_ms, "release at stop");
    if (!n) {
        log_.warn("could not release " + std::to_string(rows.size()) + " claim(s) at stop; they lapse with their lease");
        co_return;
    }
    book_.settle_all();
    publish_pool();
    recovery_->forget_parked();
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.released_on_stop_total += *n;
    }
    log_.info("released " + std::to_string(*n) + " claim(s) at stop");
}

}  // namespace qsw
