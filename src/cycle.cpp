// The cycle of the design document, top to bottom:
//   A. PROBE       one read-only call, one server now()
//   B. DRAIN       claim and fire in the same iteration, under a lease budget
//   C. SUB-CLOCKS  usage rollup, then KV prune, each on its own gate
//                  (the ephemeral backstop runs on its own timer: sweeper.cpp)
//   D. SLEEP       due-driven, clamped, interruptible by the local wake
#include <random>

#include "classify.hpp"
#include "ladder.hpp"
#include "schema.hpp"
#include "sweeper.hpp"

namespace qsw {

Task<void> Sweeper::run() {
    if (cfg_.apply_schema) co_await apply_schema();
    while (!stopping_.load()) {
        const int64_t sleep_ms = co_await cycle();
        if (stopping_.load()) break;
        co_await sleep_for(sleep_ms);
    }
    // Graceful: hand back every claim still held so no other broker waits out a lease.
    if (!hard_stop_.load()) co_await release_held();
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
    ++cycle_no_;
    // Re-arm the wake: from here on, any locally committed instant rings again.
    wake_hint_.store(INT64_MAX);
    if (std::exchange(woken_, false)) idle_cycles_ = 0;  // a wake resets the idle count
    const std::vector<int16_t> shards = shard_order(start_shard_, cycle_no_);
    const LadderStep step =
        shedding_ladder(pressure_, slow_pressure_, cfg_.sweeper_cycle_max_rows, cfg_.sweeper_claim_batch);

    // After a lost connection: resolve its unanswered fires and hand its claims back
    // (drain.cpp) before anything else, so they do not wait out the lease.
    co_await recover_after_loss();

    // A. PROBE
    const ProbeResult pr = co_await probe(shards);
    publish_pool();
    if (!pr.ok) {
        // The sub-clocks run on their own gates whatever the fire's health: a broken
        // timer schema must not stop the prune (whose alarm would freeze) or the rollup.
        // Only an unreachable or overloaded database skips them, since they would fail
        // the same way and add load where the fire is already waiting.
        int64_t ms = error_backoff_ms_;
        if (!last_error_transient_ && !stopping_.load()) {
            bool kv_work = false;
            co_await sub_clocks(shards, step, pressure_, kv_work);
            const uint64_t now = uv_now(&loop_);
            ms = std::min(ms, ms_until_next_gate());
            if (kv_work && !prune_off_)
                ms = std::min<int64_t>(ms, next_prune_mono_ > now ? static_cast<int64_t>(next_prune_mono_ - now) : 0);
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
    } else if (pr.due > 0 || pr.next_in_ms <= 0) {
        DrainResult dr = co_await drain(shards, step.fire_row_budget);
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
    if (prev_pressure != pressure_ && pressure_ <= 3)  // the first steps and the return to 0, not every cycle
        log_.log(pressure_ ? QUEEN_SWEEPER_LOG_WARN : QUEEN_SWEEPER_LOG_INFO,
                 "pressure " + std::to_string(prev_pressure) + " -> " + std::to_string(pressure_) +
                     (capped ? ": the drain hit its budget" : ": the drain finished within its budget"));

    // C. SUB-CLOCKS: usage rollup, then KV prune. Shedding starts from the bottom.
    bool kv_work = false;
    if (!stopping_.load()) co_await sub_clocks(shards, step, prev_pressure, kv_work);

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
    const int64_t ms = std::max<int64_t>(1, std::min(compute_sleep_ms(bands, in), ms_until_next_gate()));
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

void Sweeper::cycle_failed(const std::string &phase, const PgResult &r) {
    note_error(phase, r);
    const ErrorClass c = classify_sqlstate(r.sqlstate);
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
