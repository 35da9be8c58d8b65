// The sweeper: one libuv loop on a thread of its own, an internal pool of async
// libpq connections, and the cycle of the design document (probe, drain,
// sub-clocks, sleep). Public entry points are called from host threads; every
// other member runs on the loop thread.
#pragma once
#include <uv.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
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
#include "sweeper/claim_book.hpp"
#include "sweeper/context.hpp"
#include "sweeper/cycle_state.hpp"
#include "sweeper/drain.hpp"
#include "sweeper/floor.hpp"
#include "sweeper/ladder.hpp"
#include "sweeper/lifecycle.hpp"
#include "sweeper/readiness.hpp"
#include "sweeper/recovery.hpp"
#include "sweeper/schema_step.hpp"
#include "sweeper/sleep.hpp"
#include "sweeper/subclocks.hpp"
#include "sweeper/wake.hpp"

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
    using Phase = Lifecycle::Phase;

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
        int64_t held = 0;  // listed held rows due (queen.log_timers_held): tried by key
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
    void on_stop_signal();
    void make_pool_and_phases();  // start: the pool, then the phases that use it
    void publish_pool();         // the pool's figures, the claim book's and the log's counts
    void publish_book_locked();  // under stats_.mu
    void note_error(const std::string &phase, const PgResult &r);
    void cycle_failed(const std::string &phase, const PgResult &r);
    int64_t cycle_crashed(const std::string &why);  // a cycle that threw: counted, the backoff returned

    Config cfg_;
    Logger log_;
    Stats stats_;
    queen_sweeper_fired_fn fired_fn_ = nullptr;
    void *fired_user_ = nullptr;

    Lifecycle life_;  // the phase, the loop thread, the stop's flags (host threads and the loop)
    uv_loop_t loop_{};
    WakeBell bell_;   // the wake and stop doorbells, the wake hint, the sleep between cycles
    std::unique_ptr<Pool> pool_;
    Backstop backstop_;  // its own timer and doorbell, no connection: outside the cycle
    // Readiness (wait_ready on host threads) and health; the schema step that readiness
    // waits for (made at start, once the pool exists).
    Readiness readiness_;
    std::unique_ptr<SchemaStep> schema_;

    // Loop-thread state: what one cycle leaves to the next (cycle_state.hpp).
    CycleState cycle_;
    ErrorBackoff backoff_;
    // The phases, each owning its state (made at start, once the pool exists), and the
    // claims they share.
    ClaimBook book_;  // every claimed row, from its claim to its settlement
    std::unique_ptr<LoopContext> ctx_;
    std::unique_ptr<Recovery> recovery_;
    std::unique_ptr<DueFloor> floor_;  // where the probe and the claim start (floor.hpp)
    uint64_t server_changes_seen_ = 0;
    std::unique_ptr<Drain> drain_;
    std::unique_ptr<SubClocks> sub_clocks_;  // C. the usage rollup and the KV prune
};

// Test seams (integration tests link the core). The next cycle throws, as an internal error
// would: contained, the loop goes on. The loop itself fails (outside any cycle, as its own
// libuv failures would), so the "loop that dies says so" path can be exercised for real.
extern std::atomic<bool> g_test_fail_next_cycle;
extern std::atomic<bool> g_test_fail_loop;

}  // namespace qsw
