// The sleep between cycles: a pure function of four bands, with no clock and no
// randomness inside, so both ends of every band are assertable in a test.
#pragma once
#include <cstdint>

namespace qsw {

// What the cycle that just ended saw; decides which band applies.
enum class CycleOutcome {
    work_due,     // the probe reported a next instant (or due rows) and the drain was not empty
    drained,      // the drain moved rows: the probe's nextInMs is stale, go again at the floor
    empty_claim,  // work was due but the claim took nothing: another broker is draining it
    idle,         // the timer table is empty
};

struct SleepBands {
    int64_t min_sleep_ms = 5;
    int64_t max_sleep_ms = 1000;
    int64_t idle_max_sleep_ms = 30000;
    int64_t idle_after_cycles = 5;
    int64_t empty_claim_min_ms = 25;
    int64_t empty_claim_max_ms = 200;
};

struct SleepInput {
    CycleOutcome outcome = CycleOutcome::idle;
    int64_t next_in_ms = 0;     // from the probe; used by work_due
    int64_t idle_cycles = 0;    // consecutive idle cycles including this one
    double jitter = 0.0;        // in [0, 1]; NaN or out of range falls to the low end
    int64_t pressure = 0;       // consecutive capped cycles: doubles the floor, up to the ceiling
};

// Never below 1 ms. If min > max the floor wins. The empty-claim band never
// exceeds the max sleep. Idle: the max sleep for the first idle_after_cycles
// cycles, then doubling, saturating, capped at idle_max_sleep_ms.
int64_t compute_sleep_ms(const SleepBands &bands, const SleepInput &in);

// A wake during a sleep: how long the sleep lasts from now. Until the hinted instant
// (hint_unix_ms - wall_now_ms, on the wall clock the host's instants are on), but never
// past what is left of the sleep already scheduled (remaining_ms, on the monotonic clock)
// and never longer than ceiling_ms (sweeper_max_sleep_ms: a wake means timers exist). A
// wall clock stepped back during the sleep makes the hint look far away; without the two
// bounds one wake would park the loop for as long as the step. Never negative.
int64_t wake_rearm_ms(int64_t hint_unix_ms, int64_t wall_now_ms, int64_t remaining_ms, int64_t ceiling_ms);

}  // namespace qsw
