#include "sweeper/sleep.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace qsw {

int64_t compute_sleep_ms(const SleepBands &b, const SleepInput &in) {
    const int64_t floor_ms = std::max<int64_t>(b.min_sleep_ms, 1);
    // An inverted pair (min > max) lets the floor win: a zero or tiny ceiling
    // must never turn the loop into a busy wait.
    const int64_t ceil_ms = std::max(floor_ms, b.max_sleep_ms);
    int64_t ms = floor_ms;
    switch (in.outcome) {
    case CycleOutcome::drained: {
        // Under pressure the floor doubles per step, up to the ceiling: the fire
        // shrinks its batch and lengthens its sleep instead of switching off.
        ms = floor_ms;
        for (int64_t p = 0; p < in.pressure && ms < ceil_ms; ++p) ms *= 2;
        ms = std::min(ms, ceil_ms);
        break;
    }
    case CycleOutcome::work_due:
        ms = std::clamp(in.next_in_ms, floor_ms, ceil_ms);
        for (int64_t p = 0; p < in.pressure && ms < ceil_ms; ++p) ms *= 2;
        ms = std::min(ms, ceil_ms);
        break;
    case CycleOutcome::empty_claim: {
        // Not the floor: the floor is a spin when another broker holds the rows.
        int64_t lo = std::max<int64_t>(b.empty_claim_min_ms, 1);
        int64_t hi = std::max(lo, b.empty_claim_max_ms);
        double j = in.jitter;
        if (!(j >= 0.0 && j <= 1.0)) j = 0.0;  // NaN and out-of-range fall to the low end
        ms = lo + static_cast<int64_t>(std::floor(j * static_cast<double>(hi - lo)));
        ms = std::min(ms, ceil_ms);
        break;
    }
    case CycleOutcome::idle: {
        const int64_t idle_cap = std::max(ceil_ms, b.idle_max_sleep_ms);
        ms = ceil_ms;
        int64_t doublings = in.idle_cycles - std::max<int64_t>(b.idle_after_cycles, 0);
        for (int64_t i = 0; i < doublings && ms < idle_cap; ++i) {
            ms = ms > std::numeric_limits<int64_t>::max() / 2 ? idle_cap : ms * 2;
        }
        ms = std::min(ms, idle_cap);
        break;
    }
    }
    return std::max<int64_t>(ms, 1);
}

int64_t wake_rearm_ms(int64_t hint_unix_ms, int64_t wall_now_ms, int64_t remaining_ms, int64_t ceiling_ms) {
    // In saturating steps: both instants come from outside (a host's hint, the wall clock).
    int64_t until_hint;
    if (hint_unix_ms <= wall_now_ms) until_hint = 0;
    else if (wall_now_ms < 0 && hint_unix_ms > std::numeric_limits<int64_t>::max() + wall_now_ms)
        until_hint = std::numeric_limits<int64_t>::max();
    else until_hint = hint_unix_ms - wall_now_ms;
    const int64_t ms = std::min({until_hint, std::max<int64_t>(remaining_ms, 0), std::max<int64_t>(ceiling_ms, 0)});
    return std::max<int64_t>(ms, 0);
}

}  // namespace qsw
