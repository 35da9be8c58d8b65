// What the phases of the loop share, and nothing else: given to each phase object
// (the drain, the recovery after a lost connection, ...) by the Sweeper, which owns every
// piece of it. Loop thread only.
#pragma once
#include <uv.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "base/log.hpp"
#include "config/config.hpp"
#include "pg/pool.hpp"
#include "queen_sweeper.h"
#include "stats/stats.hpp"

namespace qsw {

struct LoopContext {
    const Config &cfg;
    Logger &log;
    Stats &stats;
    Pool &pool;
    uv_loop_t *loop;
    const std::atomic<bool> &stopping;   // a stop was asked: finish what is in flight
    const std::atomic<bool> &hard_stop;  // the stop's time ran out: abandon
    queen_sweeper_fired_fn fired_fn = nullptr;
    void *fired_user = nullptr;
    // Counts a failed call against its phase (errors_total, cycle_errors_total, last_error).
    std::function<void(const std::string &phase, const PgResult &)> note_error;
    // A failure that ends this cycle's drain: counted, logged once, and the cycle backs off.
    std::function<void(const std::string &phase, const PgResult &)> cycle_failed;
    // The pool's figures into the stats (a long drain shows them as it goes).
    std::function<void()> publish_pool;

    uint64_t now() const { return uv_now(loop); }
    // The loop clock (ms) until `at`, 0 once it has passed.
    int64_t ms_until(uint64_t at) const {
        const uint64_t n = now();
        return at > n ? static_cast<int64_t>(at - n) : 0;
    }
    // The host hears of a committed fire: after the commit, never before; a callback that
    // throws is logged and ignored.
    void announce(const std::string &tenant, const std::string &queue, const std::string &partition,
                  uint32_t count, int64_t base_offset) const;
};

// The wall clock (unix ms): what the engine and the wake hints speak; the loop's own
// monotonic clock is LoopContext::now (uv_now). Defined in sweeper.cpp.
int64_t wall_now_ms();
int64_t sat_sub(int64_t a, int64_t b);  // a - b, saturated

}  // namespace qsw
