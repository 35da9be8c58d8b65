// Lifecycle, the wake and the sleep. The ephemeral backstop (backstop.cpp) has its handles
// inited and closed from here, with the loop's others. The cycle itself lives in
// cycle.cpp, probe.cpp, drain.cpp and subclocks.cpp (with prune.cpp, rollup.cpp).
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
      backstop_(log_, stats_, loop_, stopping_),
      readiness_(log_, stats_, stopping_),
      rng_(std::random_device{}()) {
    log_.set_level(cfg_.log_level_number());
    log_.set_stderr(cfg_.log_stderr);
    start_shard_ = start_shard_for(cfg_.broker_id);
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.broker_id = cfg_.broker_id;
        stats_.f.start_shard = start_shard_;
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
    std::lock_guard<std::mutex> g(life_mu_);
    if (phase_ != Phase::created) {
        set_last_error("queen_sweeper_set_log_callback: the sweeper has already been started");
        return QUEEN_SWEEPER_ESTATE;
    }
    log_.set_callback(fn, user);
    return QUEEN_SWEEPER_OK;
}

int Sweeper::set_fired_callback(queen_sweeper_fired_fn fn, void *user) {
    std::lock_guard<std::mutex> g(life_mu_);
    if (phase_ != Phase::created) {
        set_last_error("queen_sweeper_set_fired_callback: the sweeper has already been started");
        return QUEEN_SWEEPER_ESTATE;
    }
    fired_fn_ = fn;
    fired_user_ = user;
    return QUEEN_SWEEPER_OK;
}

int Sweeper::set_backstop(const queen_sweeper_backstop *p) {
    std::lock_guard<std::mutex> g(life_mu_);
    if (phase_ != Phase::created) {
        set_last_error("queen_sweeper_set_backstop: the sweeper has already been started");
        return QUEEN_SWEEPER_ESTATE;
    }
    return backstop_.set_provider(p);
}

int Sweeper::start() {
    std::lock_guard<std::mutex> g(life_mu_);
    if (phase_ != Phase::created) {
        set_last_error(phase_ == Phase::running ? "queen_sweeper_start: already started"
                                                : "queen_sweeper_start: a stopped sweeper cannot be restarted");
        return QUEEN_SWEEPER_ESTATE;
    }
    if (!cfg_.sweeper) {
        // The surfaces still exist: keys are not pruned and timers wait, nothing is lost. A
        // warning, so a host without a log callback still sees it (on stderr): an operator
        // must know that timers will not fire from this process.
        log_.warn("sweeper disabled by configuration (sweeper=false): timers will not fire and KV keys "
                  "will not be pruned by this process; nothing is lost, they wait");
        phase_ = Phase::disabled;
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
    uv_async_init(&loop_, &wake_async_, [](uv_async_t *a) { static_cast<Sweeper *>(a->data)->on_wake_signal(); });
    uv_async_init(&loop_, &stop_async_, [](uv_async_t *a) { static_cast<Sweeper *>(a->data)->on_stop_signal(); });
    wake_async_.data = stop_async_.data = this;
    backstop_.init_handles();
    uv_timer_init(&loop_, &sleep_timer_);
    sleep_timer_.data = this;
    PoolOptions po;
    po.conninfo = cfg_.conninfo;
    po.pool_size = static_cast<int>(cfg_.pool_size);
    po.lane_slots = {static_cast<int>(cfg_.lane_push_slots), static_cast<int>(cfg_.lane_pop_slots),
                     static_cast<int>(cfg_.lane_ack_slots), static_cast<int>(cfg_.lane_maint_slots)};
    po.connect_timeout_ms = cfg_.connect_timeout_ms;
    po.stmt_timeout_ms = cfg_.stmt_timeout_ms;
    // The database answers again after an outage (a failover): a cycle backing off for it
    // goes at once instead of finishing its backoff.
    po.on_up = [this] { on_pool_up(); };
    pool_ = std::make_unique<Pool>(&loop_, po, log_);
    ctx_ = std::make_unique<LoopContext>(LoopContext{cfg_, log_, stats_, *pool_, &loop_, stopping_, hard_stop_,
                                                     fired_fn_, fired_user_,
                                                     [this](const std::string &ph, const PgResult &r) { note_error(ph, r); },
                                                     [this](const std::string &ph, const PgResult &r) { cycle_failed(ph, r); },
                                                     [this] { publish_pool(); }});
    recovery_ = std::make_unique<Recovery>(*ctx_, held_);
    floor_ = std::make_unique<DueFloor>(*ctx_);
    drain_ = std::make_unique<Drain>(*ctx_, held_, *recovery_, *floor_);
    sub_clocks_ = std::make_unique<SubClocks>(*ctx_);
    schema_ = std::make_unique<SchemaStep>(*ctx_, readiness_, [this](int64_t ms) { return sleep_for(ms); });
    {
        std::lock_guard<std::mutex> s(stats_.mu);
        stats_.f.state = "running";
        stats_.f.phase_backstop = backstop_.present() ? "on" : "off";
        stats_.f.ready_reason = cfg_.apply_schema ? "applying the schema" : "checking the schema version";
    }
    log_.info("sweeper starting: " + cfg_.to_json().dump());
    if (log_.has_callback())
        for (const auto &w : cfg_.warnings) log_.warn(w);
    if (cfg_.sweeper_parallelism > cfg_.lane_maint_slots)
        log_.warn("sweeper_parallelism " + std::to_string(cfg_.sweeper_parallelism) + " exceeds lane_maint_slots " +
                  std::to_string(cfg_.lane_maint_slots) + ": fires beyond the slots wait for admission");
    accepting_wakes_.store(true);
    backstop_.attach_waker();
    try {
        thread_ = std::thread([this] { thread_main(); });
    } catch (const std::exception &e) {
        accepting_wakes_.store(false);
        set_last_error(std::string("queen_sweeper_start: cannot create the loop thread: ") + e.what());
        return QUEEN_SWEEPER_EINTERNAL;
    }
    phase_ = Phase::running;
    return QUEEN_SWEEPER_OK;
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
    {
        std::lock_guard<std::mutex> g(done_mu_);
        graceful_done_ = true;
    }
    done_cv_.notify_all();
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
    // No waker may be inside uv_async_send when the handle closes.
    accepting_wakes_.store(false);
    while (wakers_in_flight_.load() != 0) std::this_thread::yield();
    auto close = [](auto *h) {
        if (!uv_is_closing(reinterpret_cast<uv_handle_t *>(h))) uv_close(reinterpret_cast<uv_handle_t *>(h), nullptr);
    };
    uv_timer_stop(&sleep_timer_);
    close(&wake_async_);
    close(&stop_async_);
    close(&sleep_timer_);
    backstop_.close_handles();
}

int Sweeper::stop(uint32_t timeout_ms) {
    std::lock_guard<std::mutex> g(life_mu_);
    if (phase_ != Phase::running) {
        if (phase_ == Phase::created) phase_ = Phase::stopped;
        return QUEEN_SWEEPER_OK;
    }
    {
        std::lock_guard<std::mutex> s(stats_.mu);
        if (stats_.f.state != "failed") stats_.f.state = "stopping";
    }
    stopping_.store(true);
    readiness_.wake_waiters();
    ring(&stop_async_);
    int rc = QUEEN_SWEEPER_OK;
    {
        std::unique_lock<std::mutex> lk(done_mu_);
        if (!done_cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [this] { return graceful_done_; })) {
            lk.unlock();
            // Past the timeout: cancel what is in flight and leave the claims to their lease.
            hard_stop_.store(true);
            ring(&stop_async_);
            rc = QUEEN_SWEEPER_ETIMEDOUT;
            set_last_error("queen_sweeper_stop: the graceful stop did not finish within " +
                           std::to_string(timeout_ms) + " ms; in-flight calls were cancelled");
        }
    }
    if (thread_.joinable()) thread_.join();
    phase_ = Phase::stopped;
    {
        std::lock_guard<std::mutex> s(stats_.mu);
        // A loop that died keeps saying so after the stop.
        if (stats_.f.state != "failed") stats_.f.state = "stopped";
    }
    log_.info(rc == 0 ? "sweeper stopped" : "sweeper stopped after its timeout");
    return rc;
}

void Sweeper::wake(int64_t at) noexcept {
    stats_.wakes_total.fetch_add(1, std::memory_order_relaxed);
    // Every int64 is a valid argument. An instant before the epoch means "due now"; the
    // clamp keeps `hint - now` in the sleep arithmetic from overflowing (INT64_MIN once
    // parked the loop for ~292 million years).
    if (at < 0) at = 0;
    int64_t cur = wake_hint_.load(std::memory_order_acquire);
    // Only an instant earlier than the one already promised rings the loop.
    while (at < cur) {
        if (wake_hint_.compare_exchange_weak(cur, at, std::memory_order_acq_rel)) {
            if (ring(&wake_async_)) stats_.wake_signals_total.fetch_add(1, std::memory_order_relaxed);
            return;
        }
    }
}

bool Sweeper::ring(uv_async_t *doorbell) noexcept {
    // The doorbell may only be rung while the loop accepts it: teardown flips
    // accepting_wakes_ and then waits until no ringer is between check and send.
    wakers_in_flight_.fetch_add(1);
    const bool rung = accepting_wakes_.load() && uv_async_send(doorbell) == 0;
    wakers_in_flight_.fetch_sub(1);
    return rung;
}

void Sweeper::on_wake_signal() {
    if (!sleeper_) return;  // mid-cycle: the sleep that follows reads the hint itself
    const int64_t hint = wake_hint_.load();
    if (hint >= sleep_deadline_unix_ms_) return;  // the loop already looks by then
    // Bounded by the sleep already promised (monotonic) and by the ceiling: a wall clock
    // stepped back makes the hint look far away, and must not make this sleep longer.
    const uint64_t mono = uv_now(&loop_);
    const int64_t left = sleep_deadline_mono_ > mono ? static_cast<int64_t>(sleep_deadline_mono_ - mono) : 0;
    const int64_t in = wake_rearm_ms(hint, wall_now_ms(), left, cfg_.sweeper_max_sleep_ms);
    woken_ = true;
    sleep_deadline_unix_ms_ = hint;
    sleep_deadline_mono_ = mono + static_cast<uint64_t>(in);
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        ++stats_.f.wake_cut_sleeps_total;
    }
    uv_timer_start(&sleep_timer_, [](uv_timer_t *t) {
        auto *s = static_cast<Sweeper *>(t->data);
        auto h = std::exchange(s->sleeper_, nullptr);
        if (h) h.resume();
    }, static_cast<uint64_t>(in), 0);
}

void Sweeper::on_pool_up() {
    if (!sleeper_ || stopping_.load()) return;
    const int64_t now = wall_now_ms();
    int64_t hint = wake_hint_.load();
    while (now < hint && !wake_hint_.compare_exchange_weak(hint, now)) {
    }
    on_wake_signal();
}

void Sweeper::on_stop_signal() {
    if (hard_stop_.load()) pool_->shutdown("sweeper stop timed out");
    if (sleeper_) {
        uv_timer_stop(&sleep_timer_);
        auto h = std::exchange(sleeper_, nullptr);
        h.resume();
    }
}

struct SleepAwaiter {
    Sweeper *s;
    std::coroutine_handle<> *slot;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) noexcept { *slot = h; }
    void await_resume() const noexcept {}
};

Task<void> Sweeper::sleep_for(int64_t ms) {
    if (stopping_.load()) co_return;
    // A wake that arrived while the cycle ran already lowered the hint.
    int64_t deadline = wall_now_ms() + ms;
    const int64_t hint = wake_hint_.load();
    if (hint < deadline) {
        woken_ = true;
        deadline = std::max(hint, wall_now_ms());
    }
    sleep_deadline_unix_ms_ = deadline;
    const int64_t in = std::clamp<int64_t>(sat_sub(deadline, wall_now_ms()), 0, std::max<int64_t>(ms, 0));
    sleep_deadline_mono_ = uv_now(&loop_) + static_cast<uint64_t>(in);
    uv_timer_start(&sleep_timer_, [](uv_timer_t *t) {
        auto *s = static_cast<Sweeper *>(t->data);
        auto h = std::exchange(s->sleeper_, nullptr);
        if (h) h.resume();
    }, static_cast<uint64_t>(in), 0);
    co_await SleepAwaiter{this, &sleeper_};
    sleep_deadline_unix_ms_ = 0;
}

void Sweeper::publish_pool() {
    if (!pool_) return;
    PoolFigures p = pool_->figures();
    std::lock_guard<std::mutex> g(stats_.mu);
    stats_.f.pool = std::move(p);
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
        std::lock_guard<std::mutex> g(life_mu_);
        if (phase_ != Phase::running) {
            set_last_error(std::string("queen_sweeper_wait_ready: the sweeper is ") +
                           (phase_ == Phase::created    ? "not started"
                            : phase_ == Phase::disabled ? "disabled by configuration (sweeper=false)"
                                                        : "stopped"));
            return QUEEN_SWEEPER_ESTATE;
        }
    }
    return readiness_.wait(timeout_ms);
}

}  // namespace qsw
