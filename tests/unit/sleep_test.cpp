// Both ends of every band of the sleep, asserted rather than sampled.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "sweeper/sleep.hpp"

using namespace qsw;

namespace {
SleepBands defaults() { return SleepBands{}; }
int64_t sleep_of(CycleOutcome o, int64_t next = 0, int64_t idle = 0, double jitter = 0, int64_t pressure = 0,
                 SleepBands b = defaults()) {
    return compute_sleep_ms(b, SleepInput{o, next, idle, jitter, pressure});
}
}  // namespace

TEST(Sleep, WorkDueClampsToTheFloorAndTheCeiling) {
    EXPECT_EQ(sleep_of(CycleOutcome::work_due, 0), 5);
    EXPECT_EQ(sleep_of(CycleOutcome::work_due, -50), 5);
    EXPECT_EQ(sleep_of(CycleOutcome::work_due, 5), 5);
    EXPECT_EQ(sleep_of(CycleOutcome::work_due, 6), 6);
    EXPECT_EQ(sleep_of(CycleOutcome::work_due, 999), 999);
    EXPECT_EQ(sleep_of(CycleOutcome::work_due, 1000), 1000);
    EXPECT_EQ(sleep_of(CycleOutcome::work_due, 1001), 1000);
    EXPECT_EQ(sleep_of(CycleOutcome::work_due, std::numeric_limits<int64_t>::max()), 1000);
}

TEST(Sleep, DrainThatMovedRowsGoesAgainAtTheFloor) {
    EXPECT_EQ(sleep_of(CycleOutcome::drained, 800), 5);
}

TEST(Sleep, PressureDoublesTheSleepUpToTheCeiling) {
    EXPECT_EQ(sleep_of(CycleOutcome::drained, 0, 0, 0, 1), 10);
    EXPECT_EQ(sleep_of(CycleOutcome::drained, 0, 0, 0, 3), 40);
    EXPECT_EQ(sleep_of(CycleOutcome::drained, 0, 0, 0, 100), 1000);
    EXPECT_EQ(sleep_of(CycleOutcome::work_due, 600, 0, 0, 1), 1000);
}

TEST(Sleep, EmptyClaimLandsInTheJitteredBandNotOnTheFloor) {
    EXPECT_EQ(sleep_of(CycleOutcome::empty_claim, 0, 0, 0.0), 25);
    EXPECT_EQ(sleep_of(CycleOutcome::empty_claim, 0, 0, 1.0), 200);
    EXPECT_EQ(sleep_of(CycleOutcome::empty_claim, 0, 0, 0.5), 112);
}

TEST(Sleep, NanAndOutOfRangeJitterFallToTheLowEnd) {
    EXPECT_EQ(sleep_of(CycleOutcome::empty_claim, 0, 0, std::nan("")), 25);
    EXPECT_EQ(sleep_of(CycleOutcome::empty_claim, 0, 0, -0.1), 25);
    EXPECT_EQ(sleep_of(CycleOutcome::empty_claim, 0, 0, 1.0001), 25);
    EXPECT_EQ(sleep_of(CycleOutcome::empty_claim, 0, 0, std::numeric_limits<double>::infinity()), 25);
}

TEST(Sleep, EmptyClaimNeverExceedsTheMaxSleep) {
    SleepBands b;
    b.max_sleep_ms = 100;
    EXPECT_EQ(sleep_of(CycleOutcome::empty_claim, 0, 0, 1.0, 0, b), 100);
    EXPECT_EQ(sleep_of(CycleOutcome::empty_claim, 0, 0, 0.0, 0, b), 25);
}

TEST(Sleep, IdleHoldsTheMaxSleepThenDoublesAndSaturates) {
    for (int64_t i = 1; i <= 5; ++i) EXPECT_EQ(sleep_of(CycleOutcome::idle, 0, i), 1000) << i;
    EXPECT_EQ(sleep_of(CycleOutcome::idle, 0, 6), 2000);
    EXPECT_EQ(sleep_of(CycleOutcome::idle, 0, 7), 4000);
    EXPECT_EQ(sleep_of(CycleOutcome::idle, 0, 9), 16000);
    EXPECT_EQ(sleep_of(CycleOutcome::idle, 0, 10), 30000);
    EXPECT_EQ(sleep_of(CycleOutcome::idle, 0, 1000000), 30000);
    EXPECT_EQ(sleep_of(CycleOutcome::idle, 0, std::numeric_limits<int64_t>::max()), 30000);
}

TEST(Sleep, InvertedKnobsLetTheFloorWin) {
    SleepBands b;
    b.min_sleep_ms = 2000;
    b.max_sleep_ms = 1000;
    EXPECT_EQ(sleep_of(CycleOutcome::work_due, 0, 0, 0, 0, b), 2000);
    EXPECT_EQ(sleep_of(CycleOutcome::work_due, 50000, 0, 0, 0, b), 2000);
    EXPECT_EQ(sleep_of(CycleOutcome::drained, 0, 0, 0, 0, b), 2000);
    b.empty_claim_min_ms = 300;
    b.empty_claim_max_ms = 100;  // inverted band: its low end wins
    EXPECT_EQ(sleep_of(CycleOutcome::empty_claim, 0, 0, 1.0, 0, b), 300);
}

TEST(Sleep, ZeroKnobsNeverBusyWait) {
    SleepBands b{0, 0, 0, 0, 0, 0};
    for (auto o : {CycleOutcome::work_due, CycleOutcome::drained, CycleOutcome::empty_claim, CycleOutcome::idle}) {
        EXPECT_EQ(sleep_of(o, 0, 0, 0.0, 0, b), 1);
        EXPECT_EQ(sleep_of(o, 0, 50, 1.0, 5, b), 1);
    }
}

TEST(Sleep, IdleMaxBelowTheCeilingIsRaisedToIt) {
    SleepBands b;
    b.idle_max_sleep_ms = 10;
    EXPECT_EQ(sleep_of(CycleOutcome::idle, 0, 100, 0, 0, b), 1000);
}

// A wake re-arms the sleep. The clocks are injected: the wall clock the hint is on, and
// what is left of the scheduled sleep on the monotonic clock.
TEST(WakeRearm, WaitsUntilTheHintWhenItIsInsideTheSleep) {
    const int64_t wall = 1'800'000'000'000;
    EXPECT_EQ(wake_rearm_ms(wall + 200, wall, 900, 1000), 200);
    EXPECT_EQ(wake_rearm_ms(wall, wall, 900, 1000), 0);
    EXPECT_EQ(wake_rearm_ms(wall - 5, wall, 900, 1000), 0);  // already due: at once
}

TEST(WakeRearm, AWallClockSteppedBackNeverLengthensTheSleep) {
    // The sleep was scheduled for 900 ms more at wall W; the wall clock then steps back an
    // hour, and a host rings a hint 100 ms after the old W: on the stepped clock it is an
    // hour and 100 ms away. The sleep keeps its 900 ms.
    const int64_t wall_before = 1'800'000'000'000;
    const int64_t stepped = wall_before - 3'600'000;
    EXPECT_EQ(wake_rearm_ms(wall_before + 100, stepped, 900, 1000), 900);
    // The remaining sleep is the bound whatever the step, down to nothing left.
    EXPECT_EQ(wake_rearm_ms(wall_before + 100, stepped, 0, 1000), 0);
    EXPECT_EQ(wake_rearm_ms(wall_before + 100, stepped, -7, 1000), 0);
}

TEST(WakeRearm, NeverLongerThanTheCeilingWhileTimersExist) {
    // An idle backoff of 30 s is being slept; a wake says a timer exists: at most the
    // ceiling (sweeper_max_sleep_ms), even when the hint is further than that.
    const int64_t wall = 1'800'000'000'000;
    EXPECT_EQ(wake_rearm_ms(wall + 20'000, wall, 29'000, 1000), 1000);
    EXPECT_EQ(wake_rearm_ms(wall + 999, wall, 29'000, 1000), 999);
    EXPECT_EQ(wake_rearm_ms(wall + 20'000, wall, 29'000, 0), 0);
}

TEST(WakeRearm, ExtremeInstantsSaturate) {
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
    EXPECT_EQ(wake_rearm_ms(kMax, kMin, 500, 1000), 500);
    EXPECT_EQ(wake_rearm_ms(kMin, kMax, 500, 1000), 0);
    EXPECT_EQ(wake_rearm_ms(kMax, 0, kMax, kMax), kMax);
}
