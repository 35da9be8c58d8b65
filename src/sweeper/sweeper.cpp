// Lifecycle: start, the loop thread, teardown and stop; the phase and the stop's flags are
// kept by a Lifecycle (lifecycle.hpp), the wake and the sleep by the WakeBell (wake.*). The
// ephemeral backstop (backstop.cpp) has its handles inited and closed from here, with the
// loop's others. The cycle itself lives in cycle.cpp, probe.cpp, drain.cpp and subclocks.cpp
// (with prune.cpp, rollup.cpp).
#include "sweeper/sweeper.hpp"

#include <algorithm>
#include <chrono>

#include "base/last_error.hpp"
#include "pg/classify.hpp"

namespace qsw {

std::atomic<bool> g_test_fail_next_cycle{false};
std::atomic<bool> g_test_fail_loop{false};

int64_t sat_sub(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_sub_overflow(a, b, &r)) return b < 0 ? INT64_MAX : INT64_MIN;
    return r;
}

int64_t wall_now_ms() {
    using namespace std::chrono;
    return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

Sweeper::Sweeper(Config cfg)
    : cfg_(std::move(cfg)),
      bell_(cfg_, stats_, loop_, life_.stopping_flag()),
      backstop_(log_, stats_, loop_, life_.stopping_flag()),
      readiness_(log_, stats_, life_.stopping_flag()),
      cycle_(start_shard_for(cfg_.broker_id), std::random_device{}()) {
    log_.set_level(cfg_.log_level_number());
    log_.set_stderr(cfg_.log_stderr);
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.broker_id = cfg_.broker_id;
        stats_.f.start_shard = cycle_.start_shard;
        stats_.f.config = cfg_.to_json();
        stats_.f.config_warnings = cfg_.warnings;
    }
    // At create no callback can be set yet: these reach stderr (unless log_stderr is
    // false), and a callback set before start gets them again at start.
    for (const auto &w : cfg_.warnings) log_.warn(w);
}

Sweeper::~Sweeper() { stop(5000); }

int Sweeper::start_shard_for(const std::string &broker_id) {
    // FNV-1a of the broker's identity: N brokers start at different heads of the
    // index instead of all queueing on shard 0. Ownership is never implied.
    uint32_t h = 2166136261u;
    for (unsigned char c : broker_id) {
        h ^= c;
        h *= 16777619u;
    }
    return static_cast<int>(h % kShards);
}

std::vector<int16_t> Sweeper::shard_order(int start_shard, int64_t cycle) {
    std::vector<int16_t> v(kShards);
    const int64_t first = ((start_shard + cycle) % kShards + kShards) % kShards;
    for (int i = 0; i < kShards; ++i) v[i] = static_cast<int16_t>((first + i) % kShards);
    return v;
}

int Sweeper::set_log_callback(queen_sweeper_log_fn fn, void *user) {
    auto held = life_.hold();
    if (life_.phase() != Phase::created) {
        set_last_error("queen_sweeper_set_log_callback: the sweeper has already been started");
        return QUEEN_SWEEPER_ESTATE;
    }
    log_.set_callback(fn, user);
    return QUEEN_SWEEPER_OK;
}

int Sweeper::set_fired_callback(queen_sweeper_fired_fn fn, void *user) {
    auto held = life_.hold();
    if (life_.phase() != Phase::created) {
        set_last_error("queen_sweeper_set_fired_callback: the sweeper has already been started");
        return QUEEN_SWEEPER_ESTATE;
    }
    fired_fn_ = fn;
    fired_user_ = user;
    return QUEEN_SWEEPER_OK;
}

int Sweeper::set_backstop(const queen_sweeper_backstop *p) {
    auto held = life_.hold();
    if (life_.phase() != Phase::created) {
        set_last_error("queen_sweeper_set_backstop: the sweeper has already been started");
        return QUEEN_SWEEPER_ESTATE;
    }
    return backstop_.set_provider(p);
}

int Sweeper::start() {
    auto held = life_.hold();
    if (life_.phase() != Phase::created) {
        set_last_error(life_.phase() == Phase::running ? "queen_sweeper_start: already started"
                                                       : "queen_sweeper_start: a stopped sweeper cannot be restarted");
        return QUEEN_SWEEPER_ESTATE;
    }
    if (!cfg_.sweeper) {
        // The surfaces still exist: keys are not pruned and timers wait, nothing is lost. A
        // warning, so a host without a log callback still sees it (on stderr): an operator
        // must know that timers will not fire from this process.
        log_.warn("sweeper disabled by configuration (sweeper=false): timers will not fire and KV keys "
                  "will not be pruned by this process; nothing is lost, they wait");
        life_.set_phase(Phase::disabled);
        std::lock_guard<std::mutex> s(stats_.mu);
        stats_.f.state = "disabled";
        stats_.f.ready_reason = "sweeper disabled by configuration (sweeper=false)";
        stats_.f.teardown_clean = true;  // no loop, no handle: nothing to tear down
        return QUEEN_SWEEPER_OK;
    }
    int rc = uv_loop_init(&loop_);
    if (rc != 0) {
        set_last_error(std::string("queen_sweeper_start: uv_loop_init failed: ") + uv_strerror(rc));
        return QUEEN_SWEEPER_EINTERNAL;
    }
    // Every handle is initialised here, before the thread exists.
    bell_.init_handles([this] { on_stop_signal(); });
    backstop_.init_handles();
    backstop_.set_publish([this] { publish_pool(); });
    make_pool_and_phases();
    {
        std::lock_guard<std::mutex> s(stats_.mu);
        stats_.f.state = "running";
        static_cast<BackstopFigures &>(stats_.f) = backstop_.figures();
        stats_.f.ready_reason = cfg_.apply_schema ? "applying the schema" : "checking the schema version";
    }
    log_.info("sweeper starting: " + cfg_.to_json().dump());
    if (log_.has_callback())
        for (const auto &w : cfg_.warnings) log_.warn(w);
    if (cfg_.sweeper_parallelism > cfg_.lane_maint_slots)
        log_.warn("sweeper_parallelism " + std::to_string(cfg_.sweeper_parallelism) + " exceeds lane_maint_slots " +
                  std::to_string(cfg_.lane_maint_slots) + ": fires beyond the slots wait for admission");
    bell_.open();
    backstop_.attach_waker();
    try {
        life_.launch([this] { thread_main(); });
    } catch (const std::exception &e) {
        bell_.refuse();
        set_last_error(std::string("queen_sweeper_start: cannot create the loop thread: ") + e.what());
        return QUEEN_SWEEPER_EINTERNAL;
    }
    life_.set_phase(Phase::running);
    return QUEEN_SWEEPER_OK;
}

void Sweeper::make_pool_and_phases() {
    PoolOptions po;
    po.conninfo = cfg_.conninfo;
    po.pool_size = static_cast<int>(cfg_.pool_size);
    po.lane_slots = {static_cast<int>(cfg_.lane_push_slots), static_cast<int>(cfg_.lane_pop_slots),
                     static_cast<int>(cfg_.lane_ack_slots), static_cast<int>(cfg_.lane_maint_slots)};
    po.connect_timeout_ms = cfg_.connect_timeout_ms;
    po.stmt_timeout_ms = cfg_.stmt_timeout_ms;
    // The database answers again after an outage (a failover): a cycle backing off for it
    // goes at once instead of finishing its backoff.
    po.on_up = [this] { bell_.cut_short(); };
    pool_ = std::make_unique<Pool>(&loop_, po, log_);
    ctx_ = std::make_unique<LoopContext>(LoopContext{cfg_, log_, stats_, *pool_, &loop_, life_.stopping_flag(),
                                                     life_.hard_stop_flag(), fired_fn_, fired_user_,
                                                     [this](const std::string &ph, const PgResult &r) { note_error(ph, r); },
                                                     [this](const std::string &ph, const PgResult &r) { cycle_failed(ph, r); },
                                                     [this] { publish_pool(); }});
    recovery_ = std::make_unique<Recovery>(*ctx_, book_);
    floor_ = std::make_unique<DueFloor>(*ctx_);
    drain_ = std::make_unique<Drain>(*ctx_, book_, *recovery_, *floor_);
    sub_clocks_ = std::make_unique<SubClocks>(*ctx_);
    schema_ = std::make_unique<SchemaStep>(*ctx_, readiness_, [this](int64_t ms) { return bell_.sleep_for(ms); });
}

void Sweeper::thread_main() {
    pool_->start();
    backstop_.begin();
    spawn(run(), [this](std::exception_ptr e) { on_run_done(e); });
    uv_run(&loop_, UV_RUN_DEFAULT);
    // Anything a bug left open is closed here, and counted against a clean teardown.
    int stray = 0;
    uv_walk(
        &loop_,
        [](uv_handle_t *h, void *arg) {
            if (!uv_is_closing(h)) {
                ++*static_cast<int *>(arg);
                uv_close(h, nullptr);
            }
        },
        &stray);
    uv_run(&loop_, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&loop_);
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.loop_close_rc = rc;
        stats_.f.teardown_clean = rc == 0 && stray == 0;
    }
    if (rc != 0 || stray != 0)
        log_.error("loop teardown not clean: uv_loop_close=" + std::to_string(rc) +
                   " stray handles=" + std::to_string(stray));
}

void Sweeper::on_run_done(std::exception_ptr err) {
    if (err) {
        std::string why;
        try {
            std::rethrow_exception(err);
        } catch (const std::bad_alloc &) {
            why = "out of memory";
        } catch (const std::exception &e) {
            why = e.what();
        } catch (...) {
            why = "unknown internal error";
        }
        loop_failed("sweeper loop ended by an internal error: " + why);
    }
    life_.mark_done();
    teardown();
}

void Sweeper::loop_failed(const std::string &why) {
    // A loop that dies says so: state leaves "running" (a host polling stats sees it, the
    // metrics export it), last_error carries the reason, the host's log callback hears it.
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.state = "failed";
        stats_.f.last_error = why;
        ++stats_.f.loop_failures_total;
    }
    log_.error(why + "; timers wait for another broker or a restart of this one");
}

void Sweeper::teardown() {
    backstop_.detach_waker();
    publish_pool();
    pool_->shutdown("sweeper stopped");
    pool_->drain_posted();
    pool_->close_handles();
    bell_.close_handles();
    backstop_.close_handles();
}

int Sweeper::stop(uint32_t timeout_ms) {
    auto held = life_.hold();
    if (life_.phase() != Phase::running) {
        if (life_.phase() == Phase::created) life_.set_phase(Phase::stopped);
        return QUEEN_SWEEPER_OK;
    }
    {
        std::lock_guard<std::mutex> s(stats_.mu);
        if (stats_.f.state != "failed") stats_.f.state = "stopping";
    }
    life_.ask_stop();
    readiness_.wake_waiters();
    bell_.ring_stop();
    int rc = QUEEN_SWEEPER_OK;
    if (!life_.wait_done(timeout_ms)) {
        // Past the timeout: cancel what is in flight and leave the claims to their lease.
        life_.abandon();
        bell_.ring_stop();
        rc = QUEEN_SWEEPER_ETIMEDOUT;
        set_last_error("queen_sweeper_stop: the graceful stop did not finish within " + std::to_string(timeout_ms) +
                       " ms; in-flight calls were cancelled");
    }
    life_.join();
    life_.set_phase(Phase::stopped);
    {
        std::lock_guard<std::mutex> s(stats_.mu);
        // A loop that died keeps saying so after the stop.
        if (stats_.f.state != "failed") stats_.f.state = "stopped";
    }
    log_.info(rc == 0 ? "sweeper stopped" : "sweeper stopped after its timeout");
    return rc;
}

void Sweeper::wake(int64_t at) noexcept { bell_.wake(at); }

void Sweeper::on_stop_signal() {
    if (life_.hard_stop()) pool_->shutdown("sweeper stop timed out");
    bell_.end_sleep();
}

void Sweeper::publish_pool() {
    if (!pool_) return;
    PoolFigures p = pool_->figures();
    // Counts of repeating failures whose interval ended are said here, once a cycle at least.
    log_.flush_limited(static_cast<int64_t>(uv_now(&loop_)));
    const int64_t suppressed = log_.suppressed_total();
    // What the claim book refused since the last time (a bug of this library): said once per
    // interval with its count, never silently, and outside the stats lock (the host's log
    // callback may read the stats).
    if (const std::string refused = book_.take_refusal(); !refused.empty())
        log_.limited(QUEEN_SWEEPER_LOG_ERROR, "claim-book",
                     "claim book: " + refused +
                         " (a bug of this library; the row's claim is settled by its lease or handed back at stop)",
                     static_cast<int64_t>(uv_now(&loop_)));
    std::lock_guard<std::mutex> g(stats_.mu);
    stats_.f.pool = std::move(p);
    stats_.f.log_lines_suppressed_total = suppressed;
    publish_book_locked();
    // Each phase's own figures, gathered: the drain's, and the recovery's with its part of
    // what both count (fires found committed after a lost answer, rows handed back).
    if (drain_) static_cast<DrainFigures &>(stats_.f) = drain_->figures();
    if (floor_) stats_.f.floor = floor_->figures();
    static_cast<BackstopFigures &>(stats_.f) = backstop_.figures();
    if (sub_clocks_) {
        static_cast<RollupFigures &>(stats_.f) = sub_clocks_->rollup_figures();
        static_cast<PruneFigures &>(stats_.f) = sub_clocks_->prune_figures();
        stats_.f.floor.ring_tenants = sub_clocks_->ring_tidy_figures().tenants;
        stats_.f.floor.ring_removed_total = sub_clocks_->ring_tidy_figures().removed_total;
    }
    if (recovery_) {
        const Recovery::Shares &sh = recovery_->shares();
        stats_.f.failover = recovery_->figures();
        stats_.f.fired_total += sh.fired;
        stats_.f.fired_segments_total += sh.fired_segments;
        stats_.f.released_total += sh.released;
    }
}

// The claim book's figures.
void Sweeper::publish_book_locked() {
    const ClaimBookFigures &b = book_.figures();
    auto &c = stats_.f.claims;
    c.claimed = b.by_state[static_cast<size_t>(RowState::claimed)];
    c.firing = b.by_state[static_cast<size_t>(RowState::firing)];
    c.kept = b.by_state[static_cast<size_t>(RowState::kept)];
    c.parked = b.by_state[static_cast<size_t>(RowState::parked)];
    c.refused_moves_total = b.refused_moves_total;
}

void Sweeper::note_error(const std::string &phase, const PgResult &r) {
    std::string msg = phase + " failed";
    if (!r.sqlstate.empty()) msg += " (SQLSTATE " + r.sqlstate + ")";
    msg += ": " + r.message;
    const ErrorClass c = classify(r);
    const ErrorKind k = is_internal(r)                ? ErrorKind::internal
                        : c == ErrorClass::transient ? ErrorKind::transient
                        : c == ErrorClass::config    ? ErrorKind::config
                                                     : ErrorKind::permanent;
    std::lock_guard<std::mutex> g(stats_.mu);
    stats_.f.last_error = msg;
    ++stats_.f.cycle_errors_total;
    ++stats_.f.phase_errors[static_cast<size_t>(error_phase_of(phase))][static_cast<size_t>(k)];
}

// ---- Readiness -------------------------------------------------------------------------

int Sweeper::wait_ready(uint32_t timeout_ms) {
    {
        auto held = life_.hold();
        if (life_.phase() != Phase::running) {
            set_last_error(std::string("queen_sweeper_wait_ready: the sweeper is ") +
                           (life_.phase() == Phase::created    ? "not started"
                            : life_.phase() == Phase::disabled ? "disabled by configuration (sweeper=false)"
                                                        : "stopped"));
            return QUEEN_SWEEPER_ESTATE;
        }
    }
    return readiness_.wait(timeout_ms);
}

}  // namespace qsw
