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
#include "sweeper/ladder.hpp"
#include "sweeper/sleep.hpp"

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
    Task<bool> apply_schema();
    // The schema step at start: apply (skipped when the database already records this
    // version) or only check the recorded version; sets schema_ok_ and the reason.
    Task<void> prepare_schema();
    struct SchemaVersion {
        bool ok = false;       // the call answered
        bool absent = false;   // no queen.schema_version_v1(): unversioned or no schema
        int64_t version = -1;
        PgResult error;
    };
    Task<SchemaVersion> read_schema_version();
    // Readiness: schema step done and a probe completed; otherwise the reason.
    void set_schema_outcome(bool ok, const std::string &state, const std::string &reason);
    void note_probe(bool ok);
    void update_ready();
    void end_cycle_health();
    std::string last_stats_error();
    Task<int64_t> cycle();  // returns the sleep that follows
    struct ProbeResult {
        bool ok = false;
        bool empty = true;
        int64_t next_in_ms = 0;
        int64_t due = 0;
        bool fire_enabled = true;
    };
    Task<ProbeResult> probe(const std::vector<int16_t> &shards);
    struct DrainResult {
        int64_t moved = 0;     // rows that left the table (fired, duplicate) or failed over
        int64_t claimed = 0;
        bool empty_claim = false;
        bool capped = false;       // hit the row budget or the deadline
        bool out_of_time = false;  // hit the half-lease deadline: the database is slow
        bool failed = false;
    };
    Task<DrainResult> drain(std::vector<int16_t> shards, int64_t row_budget);
    struct ClaimCall {
        std::string id;        // the claim id sent (its rows' claim_token)
        int64_t want = 0;
        bool whole = false;    // asked for a whole batch (not the rest of a budget)
        uint64_t started = 0;  // loop clock when the claim was sent
        bool ok = false;
        PgResult error;                  // when !ok
        std::vector<ClaimedTimer> rows;  // decoded, each registered in held_
        std::string undecodable;         // a column that did not decode (the claim goes back)
    };
    Task<void> claim_rows(const std::vector<int16_t> &shards, int64_t want, ClaimCall &out);
    Task<void> fire_claim(ClaimCall &c, DrainResult &acc, bool &ok, size_t &packed_bytes);
    Task<void> hand_back_claim(std::vector<ClaimedTimer> &rows);
    void adapt_claim_batch(uint64_t elapsed_ms, size_t packed_bytes);
    void set_claim_batch(int64_t rows);
    int64_t fire_contention();
    bool contended_recently();
    Task<void> drain_worker(const std::vector<int16_t> &shards, DrainResult &acc, int64_t &rows_left,
                            uint64_t deadline_mono_ms);
    Task<void> fire_batch(std::vector<ClaimedTimer> &rows, FireBatch &batch, bool isolating, bool wait);
    Task<void> fail_rows(std::vector<ClaimedTimer> &rows, const std::vector<size_t> &which, const std::string &error,
                         const std::string &cls);
    Task<void> release_held();
    // Failover (drain.cpp): calls a lost connection left without an answer.
    struct ParkedSegment {
        std::string tenant, queue, partition;
        int64_t count = 0;
        std::string hashes;  // empty: rows of a failed fail call, nothing to look for in the log
        std::vector<std::pair<std::string, std::string>> rows;  // (timer key, claim token), frame order
    };
    struct ParkedFire {
        bool in_doubt = false;  // sent, answer lost: it may have committed
        bool counted = false;   // its resolution is in the stats already
        std::vector<ParkedSegment> segments;
    };
    void park(std::vector<ClaimedTimer> &rows, const FireBatch &batch, const std::vector<size_t> *only,
              bool in_doubt);
    void note_lost(const char *phase, const PgResult &r);
    // A claim sent whose answer was lost: it may have committed, its rows then held under
    // its id until the lease ends. Named by id and by the window its lease ends in (server
    // clock, from the probe's now), so it can be handed back once connected again.
    struct LostClaim {
        std::string id;
        int64_t lease_from_unix_ms = 0, lease_to_unix_ms = 0;
        uint64_t forget_at_mono = 0;  // past its lease: its rows are anyone's again
    };
    void remember_lost_claim(const ClaimCall &c);
    Task<void> hand_back_lost_claims();
    Task<void> recover_after_loss();
    Task<bool> identify_server();
    Task<void> release_rows(std::vector<ClaimedTimer> &rows, const std::vector<size_t> &which, int64_t expected);
    Task<bool> kv_prune(const std::vector<int16_t> &shards, bool &kv_work);
    void phase_off_config(const char *phase, const PgResult &r);
    Task<bool> usage_rollup(const std::vector<int16_t> &shards);
    Task<void> sleep_for(int64_t ms);
    CallbackAwaiter<int> delay(int64_t ms);  // a plain pause: not the cycle's sleep, not woken
    CallbackAwaiter<int> join_all(std::vector<Task<void>> tasks);
    void run_backstop();
    void schedule_backstop();
    bool ring(uv_async_t *doorbell) noexcept;
    void on_wake_signal();
    void on_stop_signal();
    void publish_pool();
    void note_error(const std::string &phase, const PgResult &r);
    void cycle_failed(const std::string &phase, const PgResult &r);
    Task<void> sub_clocks(const std::vector<int16_t> &shards, const LadderStep &step, int64_t step_pressure,
                          bool &kv_work);
    int64_t ms_until_next_gate() const;
    static void backstop_wake(void *ctx, int64_t at_unix_ms);

    Config cfg_;
    Logger log_;
    Stats stats_;
    queen_sweeper_fired_fn fired_fn_ = nullptr;
    void *fired_user_ = nullptr;
    bool has_backstop_ = false;
    queen_sweeper_backstop backstop_{};

    std::mutex life_mu_;  // serialises start/stop
    Phase phase_ = Phase::created;
    std::thread thread_;
    uv_loop_t loop_{};
    uv_async_t wake_async_{};
    uv_async_t stop_async_{};
    uv_async_t backstop_async_{};
    uv_timer_t sleep_timer_{};
    uv_timer_t backstop_timer_{};
    std::unique_ptr<Pool> pool_;

    // The wake: the nearest locally committed instant since the last re-arm.
    std::atomic<int64_t> wake_hint_{INT64_MAX};
    std::atomic<int64_t> backstop_hint_{INT64_MAX};
    std::atomic<int64_t> backstop_due_{INT64_MAX};  // earliest instant a backstop pass is owed at
    std::atomic<bool> accepting_wakes_{false};
    std::atomic<int> wakers_in_flight_{0};

    std::atomic<bool> stopping_{false};
    std::atomic<bool> hard_stop_{false};
    std::mutex done_mu_;
    std::condition_variable done_cv_;
    bool graceful_done_ = false;

    // Readiness, read by wait_ready on host threads.
    std::mutex ready_mu_;
    std::condition_variable ready_cv_;
    bool ready_ = false;
    bool schema_ok_ = false;      // loop thread
    bool probe_done_ = false;     // loop thread
    std::string schema_reason_ = "the schema step has not run yet";
    uint64_t next_schema_check_mono_ = 0;
    int64_t errors_at_cycle_start_ = 0;

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
    int64_t claim_batch_now_ = 0;  // 0 until the first drain: then sweeper_claim_batch (drain.cpp)
    // Loop clock until which claims are sent after their fires, not beside them (drain.cpp).
    uint64_t contended_until_mono_ = 0;
    static constexpr uint64_t kContendedHoldMs = 1000;
    bool prune_off_ = false, rollup_off_ = false, rollup_shed_ = false;  // class 42: off for the life of the process
    uint64_t next_prune_mono_ = 0, next_rollup_mono_ = 0;
    double last_quota_ratio_ = 0;
    int64_t backstop_last_run_unix_ms_ = 0;
    bool fire_paused_logged_ = false;
    int64_t error_backoff_ms_ = 0;
    bool last_error_transient_ = false;  // the last cycle_failed was transient (database unreachable)
    std::string last_logged_error_;
    bool fire_config_failed_ = false;  // a class 42 fire error: the drain hands back and backs off
    PgResult fire_config_error_;
    std::string shed_state_logged_ = "on/on";
    std::minstd_rand rng_;
    // Claims this sweeper holds: (tenant, queue, key) -> token. Released at a graceful stop.
    std::map<std::tuple<std::string, std::string, std::string>, std::string> held_;
    std::vector<ParkedFire> parked_;
    std::vector<LostClaim> lost_claims_;
    // The server's clock against the loop's: now() of the last probe, and the loop clock
    // when it was sent and answered. A claim's now() lies between its send and its loss.
    int64_t server_now_unix_ms_ = 0;
    uint64_t server_now_sent_mono_ = 0, server_now_got_mono_ = 0;
    int64_t seen_disconnects_ = 0;
    bool identify_pending_ = true;   // learn the server's host:port on the next cycle
    bool awaiting_resume_ = false;   // a loss was seen and no fire has committed since
    bool reconnected_since_loss_ = false;  // the server was found again since the last loss
    bool check_refused_logged_ = false;    // the in-doubt check lacks table privileges (said once)
};

int64_t wall_now_ms();
int64_t sat_sub(int64_t a, int64_t b);  // a - b, saturated

// Test seam (integration tests link the core): the next cycle throws, as an internal
// error would, so the "loop that dies says so" path can be exercised for real.
extern std::atomic<bool> g_test_fail_next_cycle;

}  // namespace qsw
