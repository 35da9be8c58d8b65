// The ephemeral backstop: the engine's sweep for rings nobody touches (leases, ttls, idle
// implicit queues), once a second. No connection, no admission slot, no lock outside the
// engine, on a timer of its own, so a slow or absent database never delays it and shedding
// it would relieve nothing: it is outside the ladder. It owns its provider and its timer;
// the Sweeper calls the lifecycle methods below from its own start and teardown.
//
// One pass a second is both the floor and the ceiling (docs/design.md, "The ephemeral
// backstop", 2026-12-01): the engine's touch path honours a lease or a ttl to the
// millisecond for whoever touches the queue, so the instants the engine reports through the
// waker are counted (hint_wakes_total), never run.
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
    // The pace of the passes, fixed: there is deliberately no knob.
    static constexpr uint64_t kPassEveryMs = 1000;

    // `stats` is for the hint wakes' counter alone (an atomic: the engine's thread rings it).
    Backstop(Logger &log, Stats &stats, uv_loop_t &loop, const std::atomic<bool> &stopping)
        : log_(log), stats_(stats), loop_(loop), stopping_(stopping) {}

    // Before start (the caller holds the lifecycle lock): copies and checks the provider;
    // NULL removes it. A status code, with the last error set on a refusal.
    int set_provider(const queen_sweeper_backstop *p);
    bool present() const { return has_; }
    // Its figures, written by its pass alone on the loop thread; after each pass it calls
    // `publish` (set before start), which gathers every phase's figures into the snapshot.
    const BackstopFigures &figures() const { return fig_; }
    void set_publish(std::function<void()> publish) { publish_ = std::move(publish); }

    // Start, on the host's thread, before the loop thread exists: the timer on the loop,
    // then the engine's waker.
    void init_handles();
    void attach_waker();
    // The loop thread's first turn: a pass one second from now, and every second after.
    void begin();
    // Teardown, on the loop thread: the waker detached first, then the timer closed.
    void detach_waker();
    void close_handles();

private:
    void run();
    static void on_hint(void *ctx, int64_t at_unix_ms);

    Logger &log_;
    Stats &stats_;
    uv_loop_t &loop_;
    const std::atomic<bool> &stopping_;
    bool has_ = false;
    queen_sweeper_backstop provider_{};
    uv_timer_t timer_{};  // repeats every kPassEveryMs
    BackstopFigures fig_;
    std::function<void()> publish_;
};

}  // namespace qsw
