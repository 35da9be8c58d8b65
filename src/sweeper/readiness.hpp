// Readiness and health. Ready is latched: it says start-up is complete (the schema step
// succeeded and a first probe completed), and host threads wait for it (wait_ready).
// Whether the sweeper works now is `healthy`, which turns with every cycle in which a
// phase counted a failure. The loop thread writes both; wait_ready reads under the mutex.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "base/log.hpp"
#include "stats/stats.hpp"

namespace qsw {

class Readiness {
public:
    Readiness(Logger &log, Stats &stats, const std::atomic<bool> &stopping)
        : log_(log), stats_(stats), stopping_(stopping) {}

    // Host threads: blocks until ready (OK), the stop (ESTATE) or the timeout (ETIMEDOUT,
    // with the reason in the last error).
    int wait(uint32_t timeout_ms);
    // The stop: every waiter wakes and sees `stopping`.
    void wake_waiters();

    // Loop thread: the schema step's outcome (the reason is what a host reads while not ready).
    void set_schema_outcome(bool ok, const std::string &state, const std::string &reason);
    bool schema_ok() const { return schema_ok_; }
    const std::string &schema_reason() const { return schema_reason_; }
    // A probe answered (ok) or not; the reason then carries the last error.
    void note_probe(bool ok);
    void update();

    // Health, per cycle: failed when any phase counted an error between these two.
    void begin_cycle();
    void end_cycle();

private:
    Logger &log_;
    Stats &stats_;
    const std::atomic<bool> &stopping_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool ready_ = false;          // under mu_, for the waiters
    bool schema_ok_ = false;      // loop thread
    bool probe_done_ = false;     // loop thread
    std::string schema_reason_ = "the schema step has not run yet";
    int64_t errors_at_cycle_start_ = 0;
};

}  // namespace qsw
