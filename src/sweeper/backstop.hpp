// The ephemeral backstop: the engine's sweep for rings nobody touches (leases, ttls, idle
// implicit queues). No connection, no admission slot, no lock outside the engine, on a
// timer of its own, so a slow or absent database never delays it and shedding it would
// relieve nothing: it is outside the ladder. It owns its provider, its libuv handles (a
// timer and the doorbell the engine rings) and the instants it owes a pass at; the Sweeper
// calls the lifecycle methods below from its own start and teardown.
#pragma once
#include <uv.h>

#include <atomic>
#include <cstdint>
#include <functional>

#include "base/log.hpp"
#include "queen_sweeper.h"
#include "stats/stats.hpp"

namespace qsw {

class Backstop {
public:
    // Rings a doorbell of the loop only while the loop accepts it (the Sweeper's guard
    // against a handle closing under a ringer); returns whether it rang.
    using Ring = std::function<bool(uv_async_t *)>;
    Backstop(Logger &log, Stats &stats, uv_loop_t &loop, const std::atomic<bool> &stopping, Ring ring)
        : log_(log), stats_(stats), loop_(loop), stopping_(stopping), ring_(std::move(ring)) {}

    // Before start (the caller holds the lifecycle lock): copies and checks the provider;
    // NULL removes it. A status code, with the last error set on a refusal.
    int set_provider(const queen_sweeper_backstop *p);
    bool present() const { return has_; }

    // Start, on the host's thread, before the loop thread exists: the handles on the loop,
    // then the engine's waker (after the handles: the engine may ring at once).
    void init_handles();
    void attach_waker();
    // The loop thread's first turn: the first pass one second from now.
    void begin();
    // Teardown, on the loop thread: the waker detached first (the engine never rings a
    // closing handle), and the handles closed once no ringer can be inside a send.
    void detach_waker();
    void close_handles();

private:
    void run();
    void schedule();
    static void on_hint(void *ctx, int64_t at_unix_ms);

    Logger &log_;
    Stats &stats_;
    uv_loop_t &loop_;
    const std::atomic<bool> &stopping_;
    Ring ring_;
    bool has_ = false;
    queen_sweeper_backstop provider_{};
    uv_async_t async_{};  // the engine's doorbell: an instant earlier than any owed
    uv_timer_t timer_{};  // the next pass
    // The doorbell coalesces: hint_ re-arms it (only an earlier instant rings again),
    // due_ is the earliest instant a pass is owed at, read by the loop.
    std::atomic<int64_t> hint_{INT64_MAX};
    std::atomic<int64_t> due_{INT64_MAX};
    int64_t last_run_unix_ms_ = 0;
};

}  // namespace qsw
