// What a phase object of the cycle is handed by the Sweeper that runs it. A phase owns
// its own state and publishes its own figures; the things below are shared by the whole
// loop, so a phase holds them by reference and never owns them. Everything here is used
// on the loop thread only.
#pragma once
#include <uv.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "base/log.hpp"
#include "config/config.hpp"
#include "pg/pool.hpp"
#include "stats/stats.hpp"

namespace qsw {

// Counts a failed call in stats (last_error, cycle_errors_total, errors_total{phase,class})
// the way every phase does: one place decides how a failure is counted.
using NoteError = std::function<void(const std::string &phase, const PgResult &r)>;

struct PhaseContext {
    const Config &cfg;
    Logger &log;
    Stats &stats;
    Pool &pool;
    uv_loop_t &loop;
    const std::atomic<bool> &stopping;  // a graceful stop: a phase does not start a new call
    NoteError note_error;
};

// A class 42 answer (function missing or not executable) turns a maintenance phase (the
// prune, the rollup) off for the life of the process: said once, with what it costs, and
// counted. The fire keeps running (subclocks.cpp).
void maintenance_phase_off(const PhaseContext &ctx, const char *phase, const PgResult &r);

// The wall clock (unix ms): what the engine and the wake hints speak; the loop's own
// monotonic clock is uv_now. Defined in sweeper.cpp.
int64_t wall_now_ms();
int64_t sat_sub(int64_t a, int64_t b);  // a - b, saturated

// The loop clock (ms) until `at`, 0 once it has passed.
inline int64_t ms_until(const uv_loop_t &loop, uint64_t at) {
    const uint64_t now = uv_now(&loop);
    return at > now ? static_cast<int64_t>(at - now) : 0;
}

}  // namespace qsw
