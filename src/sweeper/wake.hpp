// The wake and the sleep between cycles. Host threads reach the loop through two doorbells
// (libuv asyncs: the wake and the stop) behind one gate, so no ringer is inside
// uv_async_send when teardown closes them. The wake carries a hint, the nearest instant a
// host committed since the cycle last re-armed it; the loop sleeps on a timer that a wake
// cuts short (never lengthens) and the stop ends.
#pragma once
#include <uv.h>

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <functional>

#include "base/task.hpp"
#include "config/config.hpp"
#include "stats/stats.hpp"

namespace qsw {

class WakeBell {
public:
    WakeBell(const Config &cfg, Stats &stats, uv_loop_t &loop, const std::atomic<bool> &stopping)
        : cfg_(cfg), stats_(stats), loop_(loop), stopping_(stopping) {}

    // Start, on the host's thread, before the loop thread exists: both doorbells and the
    // sleep's timer on the loop. on_stop runs on the loop thread each time the stop rings.
    void init_handles(std::function<void()> on_stop);
    // The doorbells may ring from now on (open), or no longer (refuse: the loop thread
    // could not be started).
    void open() { accepting_.store(true); }
    void refuse() { accepting_.store(false); }

    // Host threads. A wake is counted; only an instant earlier than the one already
    // promised rings the loop. Every int64 is a valid instant (before the epoch: due now).
    void wake(int64_t at_unix_ms) noexcept;
    bool ring_stop() noexcept { return ring(&stop_async_); }

    // Loop thread. At a cycle's start: from here on any locally committed instant rings
    // again; true when a wake cut the sleep (or the cycle) since the last re-arm.
    bool rearm();
    // The sleep between cycles: ms at most, less when a wake arrived meanwhile or arrives
    // during it; none once the stop was asked.
    Task<void> sleep_for(int64_t ms);
    // The database answers again after an outage: a sleep backing off for it ends now.
    void cut_short();
    // The stop: a sleep in progress ends at once.
    void end_sleep();

    // Teardown, on the loop thread: the gate shut (waiting out any ringer still between
    // its check and its send), then the timer and both doorbells closed.
    void close_handles();

private:
    bool ring(uv_async_t *doorbell) noexcept;
    void on_wake_signal();
    void start_timer(int64_t in_ms);

    const Config &cfg_;
    Stats &stats_;
    uv_loop_t &loop_;
    const std::atomic<bool> &stopping_;
    std::function<void()> on_stop_;

    // Host threads and the loop.
    std::atomic<int64_t> hint_{INT64_MAX};  // the nearest locally committed instant since the last re-arm
    std::atomic<bool> accepting_{false};
    std::atomic<int> ringers_in_flight_{0};
    uv_async_t wake_async_{};
    uv_async_t stop_async_{};

    // Loop thread.
    uv_timer_t sleep_timer_{};
    std::coroutine_handle<> sleeper_;  // the cycle's loop, while it sleeps
    int64_t deadline_unix_ms_ = 0;
    uint64_t deadline_mono_ = 0;  // the same deadline on the loop's monotonic clock
    bool woken_ = false;
};

}  // namespace qsw
