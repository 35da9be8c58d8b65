// The sweeper: one libuv loop on a thread of its own, an internal pool of async
// libpq connections, and the cycle of the design document (probe, drain,
// sub-clocks, sleep). Public entry points are called from host threads; every
// other member runs on the loop thread.
#pragma once
#include <uv.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "base/log.hpp"
#include "base/task.hpp"
#include "codec/packer.hpp"
#include "config/config.hpp"
#include "pg/pool.hpp"
#include "queen_sweeper.h"
#include "stats/stats.hpp"
#include "sweeper/backstop.hpp"
#include "sweeper/claims.hpp"
#include "sweeper/context.hpp"
#include "sweeper/drain.hpp"
#include "sweeper/floor.hpp"
#include "sweeper/ladder.hpp"
#include "sweeper/readiness.hpp"
#include "sweeper/recovery.hpp"
#include "sweeper/schema_step.hpp"
#include "sweeper/sleep.hpp"
#include "sweeper/subclocks.hpp"

namespace qsw {

constexpr int kShards = 64;  // fixed forever: there is no shard-count knob

class Sweeper {
public:
    explicit Sweeper(Config cfg);
    ~Sweeper();

    int set_log_callback(queen_sweeper_log_fn fn, void *user);
    int set_fired_callback(queen_sweeper_fired_fn fn, void *user);
    int set_backstop(const queen_sweeper_backstop *p);
    int start();
    int stop(uint32_t timeout_ms);
    void wake(int64_t deliver_at_unix_ms) noexcept;
    // Blocks until the sweeper is ready (OK), the time runs out (ETIMEDOUT), or it is
    // not running (ESTATE: never started, disabled, stopping or stopped).
    int wait_ready(uint32_t timeout_ms);
    Stats &stats() { return stats_; }

    // Test seam: the shard order a cycle visits (pure: broker identity + cycle number).
    static std::vector<int16_t> shard_order(int start_shard, int64_t cycle);
    static int start_shard_for(const std::string &broker_id);

private:
    enum class Phase { created, running, stopped, disabled };

    // Loop-thread parts.
    void thread_main();
    void on_run_done(std::exception_ptr err);
    void teardown();
    void loop_failed(const std::string &why);
    Task<void> run();
    Task<int64_t> cycle();  // returns the sleep that follows
    struct ProbeResult {
        bool ok = false;
        bool empty = true;
        int64_t next_in_ms = 0;
        int64_t due = 0;
        bool fire_enabled = true;
    };
    Task<ProbeResult> probe(const std::vector<int16_t> &shards);
    // What the cycle's drain step decided (cycle.cpp), for the pressure and the sleep.
    struct DrainStep {
        CycleOutcome outcome = CycleOutcome::idle;
        int64_t next_in = 0;
        bool capped = false, out_of_time = false, failed_transient = false;
    };
    Task<int64_t> after_failed_probe(const std::vector<int16_t> &shards, const LadderStep &step);
    Task<DrainStep> drain_step(const ProbeResult &pr, const std::vector<int16_t> &shards, const LadderStep &step);
    int64_t note_pressure(const DrainStep &d);
    int64_t sleep_after(DrainStep d, bool kv_work);
    // Graceful stop: hands back every claim still held (after resolving lost fires).
    Task<void> release_held();
    Task<void> sleep_for(int64_t ms);
    bool ring(uv_async_t *doorbell) noexcept;
    void on_wake_signal();
    void on_stop_signal();
    void on_pool_up();  // the pool found the database again: cut the backoff short
    void publish_pool();
    void note_error(const std::string &phase, const PgResult &r);
    void cycle_failed(const std::string &phase, const PgResult &r);
    int64_t cycle_crashed(const std::string &why);  // a cycle that threw: counted, the backoff returned

    Config cfg_;
    Logger log_;
    Stats stats_;
    queen_sweeper_fired_fn fired_fn_ = nullptr;
    void *fired_user_ = nullptr;

    std::mutex life_mu_;  // serialises start/stop
    Phase phase_ = Phase::created;
    std::thread thread_;
    uv_loop_t loop_{};
    uv_async_t wake_async_{};
    uv_async_t stop_async_{};
    uv_timer_t sleep_timer_{};
    std::unique_ptr<Pool> pool_;
    Backstop backstop_;  // its own timer and doorbell, no connection: outside the cycle
    // The phases, each owning its state (made at start, once the pool exists).
    std::unique_ptr<SubClocks> sub_clocks_;  // C. the usage rollup and the KV prune

    // The wake: the nearest locally committed instant since the last re-arm.
    std::atomic<int64_t> wake_hint_{INT64_MAX};
    std::atomic<bool> accepting_wakes_{false};
    std::atomic<int> wakers_in_flight_{0};

    std::atomic<bool> stopping_{false};
    std::atomic<bool> hard_stop_{false};
    std::mutex done_mu_;
    std::condition_variable done_cv_;
    bool graceful_done_ = false;
    // Readiness (wait_ready on host threads) and health; the schema step that readiness
    // waits for (made at start, once the pool exists).
    Readiness readiness_;
    std::unique_ptr<SchemaStep> schema_;

    // Loop-thread state.
    std::coroutine_handle<> sleeper_;
    int64_t sleep_deadline_unix_ms_ = 0;
    uint64_t sleep_deadline_mono_ = 0;  // the same deadline on the loop's monotonic clock
    bool woken_ = false;
    int start_shard_ = 0;
    int64_t cycle_no_ = 0;
    int64_t idle_cycles_ = 0;
    int64_t pressure_ = 0;
    int64_t slow_pressure_ = 0;
    bool fire_paused_logged_ = false;
    int64_t error_backoff_ms_ = 0;
    bool last_error_transient_ = false;  // the last cycle_failed was transient (database unreachable)
    std::string last_logged_error_;
    std::minstd_rand rng_;
    // The phases that own their state (drain.hpp, recovery.hpp), and the claims they share.
    HeldClaims held_;
    std::unique_ptr<LoopContext> ctx_;
    std::unique_ptr<Recovery> recovery_;
    std::unique_ptr<DueFloor> floor_;  // where the probe and the claim start (floor.hpp)
    uint64_t server_changes_seen_ = 0;
    std::unique_ptr<Drain> drain_;
};

// Test seams (integration tests link the core). The next cycle throws, as an internal error
// would: contained, the loop goes on. The loop itself fails (outside any cycle, as its own
// libuv failures would), so the "loop that dies says so" path can be exercised for real.
extern std::atomic<bool> g_test_fail_next_cycle;
extern std::atomic<bool> g_test_fail_loop;

}  // namespace qsw
