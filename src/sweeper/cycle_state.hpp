// What one cycle leaves to the next (cycle.cpp, probe.cpp): the shard rotation, the
// pressure that sheds work and lengthens the sleep, the idle count and the jitter of the
// sleep bands; and, after a failed cycle, the backoff before the next. Loop thread only.
#pragma once
#include <cstdint>
#include <random>
#include <string>

namespace qsw {

struct CycleState {
    CycleState(int first_shard, unsigned seed) : start_shard(first_shard), rng(seed) {}

    int start_shard = 0;            // where this broker's rotation of the shards begins
    int64_t cycle_no = 0;
    int64_t idle_cycles = 0;        // consecutive idle cycles (the idle band of the sleep)
    int64_t pressure = 0;           // consecutive cycles under database pressure (the ladder)
    int64_t slow_pressure = 0;      // consecutive drains that ran out of their half-lease
    bool fire_paused_logged = false;  // the probe's "fire paused" was logged, "resumed" not yet
    uint64_t held_tried_at = 0;     // loop ms of the last claim sent for held rows alone (floor.hpp)
    std::minstd_rand rng;           // the empty-claim band's jitter
};

// After a failed cycle (Sweeper::cycle_failed).
struct ErrorBackoff {
    int64_t ms = 0;
    bool transient = false;    // the last failure was transient (database unreachable)
};

}  // namespace qsw
