// Both ends of every rule of the drain (sweeper/drain_policy.hpp, sweeper/busy_partitions.hpp).
#include <gtest/gtest.h>

#include <limits>

#include "sweeper/busy_partitions.hpp"
#include "sweeper/drain_policy.hpp"

using namespace qsw;

namespace {
BatchInput backlog(int64_t batch, int64_t elapsed_ms, int64_t bytes) {
    BatchInput in;
    in.batch = batch;
    in.elapsed_ms = elapsed_ms;
    in.claimed_bytes = bytes;
    return in;  // base 200, ceiling 2000, lease 30 s, budget 8 MiB, whole and full
}
}  // namespace

TEST(DrainPolicy, TheBatchDoublesThroughAFastBacklogUpToTheCeiling) {
    EXPECT_EQ(next_claim_batch(backlog(200, 1874, 0)), 400);   // under lease/16 (1875)
    EXPECT_EQ(next_claim_batch(backlog(200, 1875, 0)), 200);   // at lease/16: kept
    EXPECT_EQ(next_claim_batch(backlog(1600, 10, 0)), 2000);   // capped
    EXPECT_EQ(next_claim_batch(backlog(2000, 10, 0)), 2000);
    EXPECT_EQ(next_claim_batch(backlog(200, 10, 4 << 20)), 400);        // half the budget: grows
    EXPECT_EQ(next_claim_batch(backlog(200, 10, (4 << 20) + 1)), 200);  // over half: kept
}

TEST(DrainPolicy, TheBatchHalvesWhenSlowOrFullOfBytesNeverBelowTheBase) {
    EXPECT_EQ(next_claim_batch(backlog(2000, 3751, 0)), 1000);  // over lease/8 (3750)
    EXPECT_EQ(next_claim_batch(backlog(2000, 3750, 0)), 2000);  // at it: kept
    EXPECT_EQ(next_claim_batch(backlog(2000, 10, 8 << 20)), 1000);  // the byte budget filled
    EXPECT_EQ(next_claim_batch(backlog(300, 60000, 0)), 200);
    EXPECT_EQ(next_claim_batch(backlog(200, 60000, 0)), 200);
}

TEST(DrainPolicy, AShortClaimEndsTheBacklogAndTheRestOfABudgetHoldsTheBatch) {
    BatchInput in = backlog(1600, 10, 0);
    in.full = false;
    EXPECT_EQ(next_claim_batch(in), 200);
    in = backlog(1600, 60000, 8 << 20);
    in.full = false;
    EXPECT_EQ(next_claim_batch(in), 200);
    in = backlog(1600, 10, 0);
    in.whole = false;                        // the rest of a budget says nothing of the batch
    EXPECT_EQ(next_claim_batch(in), 1600);
}

TEST(DrainPolicy, ExtremeBatchInputsStayInBounds) {
    BatchInput in = backlog(std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max(),
                            std::numeric_limits<int64_t>::max());
    EXPECT_EQ(next_claim_batch(in), 1000);
    in = backlog(-5, -5, -5);
    EXPECT_EQ(next_claim_batch(in), 400);
    in.base = 500;
    in.ceiling = 100;  // a ceiling under the base: the base wins
    EXPECT_EQ(next_claim_batch(in), 500);
    in.lease_ms = 0;
    in.byte_budget = 0;
    EXPECT_EQ(next_claim_batch(in), 500);
}

TEST(DrainPolicy, ClaimsGoAheadOnlyThroughAnUncontendedBacklog) {
    EXPECT_TRUE(claim_ahead(true, false, false));
    EXPECT_FALSE(claim_ahead(false, false, false));
    EXPECT_FALSE(claim_ahead(true, true, false));
    EXPECT_FALSE(claim_ahead(true, false, true));
}

TEST(DrainPolicy, AClaimIsCarriedIntoTheNextCycleOnlyWhenAHealthyBacklogSpentTheBudget) {
    CarryInput in;
    in.ahead = true;
    in.budget_spent = true;
    EXPECT_TRUE(carry_claim(in));
    // Each condition alone stops it.
    for (int which = 0; which < 8; ++which) {
        CarryInput x = in;
        switch (which) {
            case 0: x.ahead = false; break;          // no backlog, contended, or stopping
            case 1: x.budget_spent = false; break;   // rows left: the pass claims them itself
            case 2: x.out_of_time = true; break;     // a slow database
            case 3: x.failed = true; break;          // a failed call ends the drain
            case 4: x.shed = true; break;            // the ladder cut the budget
            case 5: x.holding_back = true; break;    // around kept segments
            case 6: x.carrying = true; break;        // one carried claim at a time
            case 7: x.phase_due = true; break;       // the rollup may run before the next drain
        }
        EXPECT_FALSE(carry_claim(x)) << which;
    }
    EXPECT_FALSE(carry_claim(CarryInput{}));
}

TEST(DrainPolicy, EveryFireOfAClaimIsDueWellInsideItsLease) {
    EXPECT_EQ(fire_deadline(1000, 30000), 1000u + 22500u);
    EXPECT_EQ(fire_deadline(1000, 100), 1000u + 75u);
    EXPECT_EQ(fire_deadline(1000, 0), 1000u);
    EXPECT_EQ(fire_deadline(1000, -5), 1000u);
}

TEST(DrainPolicy, ACallNeverOutlivesItsClaimsDeadline) {
    auto b = call_budget(1000, 1000 + 22500, 30000);
    EXPECT_TRUE(b.go);
    EXPECT_EQ(b.timeout_ms, 22500);  // stmt_timeout equal to the lease: the deadline wins
    b = call_budget(1000, 1000 + 60000, 30000);
    EXPECT_EQ(b.timeout_ms, 30000);
    b = call_budget(1000, 1000 + kMinCallMs, 30000);
    EXPECT_TRUE(b.go);
    EXPECT_EQ(b.timeout_ms, kMinCallMs);
    EXPECT_FALSE(call_budget(1000, 1000 + kMinCallMs - 1, 30000).go);  // too late: back
    EXPECT_FALSE(call_budget(5000, 1000, 30000).go);
    EXPECT_EQ(call_budget(1000, 5000, 0).timeout_ms, 1);
}

TEST(DrainPolicy, AHeldPartitionIsRetriedWithBackoffThenWithShortWaits) {
    EXPECT_EQ(busy_retry(0).delay_ms, 0);  // at once, a short wait: another broker's fire
    EXPECT_TRUE(busy_retry(0).wait);
    EXPECT_EQ(busy_retry(0).lock_wait_ms, 100);
    EXPECT_EQ(busy_retry(-3).delay_ms, 0);
    EXPECT_EQ(busy_retry(1).delay_ms, 100);
    EXPECT_FALSE(busy_retry(1).wait);
    EXPECT_EQ(busy_retry(2).delay_ms, 200);
    EXPECT_EQ(busy_retry(3).delay_ms, 400);
    EXPECT_FALSE(busy_retry(3).wait);
    EXPECT_EQ(busy_retry(4).delay_ms, 800);
    EXPECT_TRUE(busy_retry(4).wait);
    EXPECT_EQ(busy_retry(4).lock_wait_ms, 200);
    EXPECT_EQ(busy_retry(5).delay_ms, 1000);
    EXPECT_EQ(busy_retry(1000000).delay_ms, 1000);
    EXPECT_TRUE(busy_retry(1000000).wait);
    // Bounded calls while a partition stays held: at most one per retry delay.
    int64_t calls_in_a_minute = 0, t = 0;
    for (int64_t n = 1; t < 60000; ++n, ++calls_in_a_minute) t += busy_retry(n).delay_ms;
    EXPECT_LE(calls_in_a_minute, 64);  // about 1/s once the backoff is at its cap
}

TEST(DrainPolicy, AnEmptyClaimAroundKeptRowsIsNotSentAgainUntilSomethingChanges) {
    HoldBackInput in;
    in.came_back_empty = true;
    in.empty_at_mono = 10000;
    in.now_mono = 10000;
    in.window_ms = 200;
    EXPECT_TRUE(hold_back_claim(in));  // at once: held back
    in.now_mono = 10199;
    EXPECT_TRUE(hold_back_claim(in));  // the last instant of the window
    in.now_mono = 10200;
    EXPECT_FALSE(hold_back_claim(in));  // the window is over: claim around them again
    in.now_mono = 9000;
    EXPECT_TRUE(hold_back_claim(in));  // a clock read before the answer: inside the window
    in.now_mono = 10050;
    HoldBackInput x = in;
    x.came_back_empty = false;  // the claim around them took rows: other partitions are due
    EXPECT_FALSE(hold_back_claim(x));
    x = in;
    x.partition_freed = true;  // a partition it left out fired or went back: its rows may be due
    EXPECT_FALSE(hold_back_claim(x));
    x = in;
    x.woken = true;  // a local commit may have made another partition's timer due
    EXPECT_FALSE(hold_back_claim(x));
    x = in;
    x.window_ms = 0;  // sweeper_empty_claim_max_ms 0: never held back
    EXPECT_FALSE(hold_back_claim(x));
    x.window_ms = -5;
    EXPECT_FALSE(hold_back_claim(x));
    x = in;
    x.window_ms = 3600000;  // the largest window the configuration allows
    x.now_mono = 10000 + 3599999;
    EXPECT_TRUE(hold_back_claim(x));
    x.now_mono = UINT64_MAX;
    EXPECT_FALSE(hold_back_claim(x));
}

TEST(DrainPolicy, AFailedFireGoesWhereItsCauseSays) {
    FailedFireInput in;
    in.timers = 10;
    in.answer_lost = true;
    EXPECT_EQ(failed_fire(in), FailedFire::park);
    in = {};
    in.timers = 10;
    in.lock_timeout = true;
    EXPECT_EQ(failed_fire(in), FailedFire::busy);
    in = {};
    in.timers = 10;
    in.config = true;
    EXPECT_EQ(failed_fire(in), FailedFire::hand_back);
    in = {};
    in.timers = 10;
    in.internal = true;
    EXPECT_EQ(failed_fire(in), FailedFire::hand_back);
    in = {};
    in.timers = 10;
    EXPECT_EQ(failed_fire(in), FailedFire::isolate);  // permanent, many timers
    in.timers = 1;
    EXPECT_EQ(failed_fire(in), FailedFire::fail);
    in.timers = 10;
    in.isolating = true;
    EXPECT_EQ(failed_fire(in), FailedFire::fail);
    in.isolating = false;
    in.isolate_enabled = false;
    EXPECT_EQ(failed_fire(in), FailedFire::fail);
    in.isolate_enabled = true;
    in.transient = true;
    EXPECT_EQ(failed_fire(in), FailedFire::fail);  // transient: no attempt spent, never isolated
}

TEST(DrainPolicy, ABatchWaitsForItsPartitionsAtOnceOnlyWhenEveryOneWasBusyLately) {
    EXPECT_FALSE(fire_waits_first(0, 0));  // nothing to fire
    EXPECT_FALSE(fire_waits_first(3, 0));
    EXPECT_FALSE(fire_waits_first(3, 2));  // one free partition fires without waiting for the rest
    EXPECT_TRUE(fire_waits_first(3, 3));
    EXPECT_TRUE(fire_waits_first(1, 1));
    EXPECT_TRUE(fire_waits_first(1, 5));  // more than asked: still every one
}

TEST(DrainPolicy, APartitionIsBusyLatelyForASecondAfterItsBusyAnswer) {
    BusyPartitions b;
    EXPECT_FALSE(b.recent("t", "q", "p", 1000));
    b.note("t", "q", "p", 1000);
    EXPECT_TRUE(b.recent("t", "q", "p", 1000));
    EXPECT_TRUE(b.recent("t", "q", "p", 1000 + BusyPartitions::kRecentMs - 1));
    EXPECT_FALSE(b.recent("t", "q", "p", 1000 + BusyPartitions::kRecentMs));
    EXPECT_TRUE(b.recent("t", "q", "p", 500));  // a clock read before the answer: still recent
    // the key is the triple, NUL-joined: no two triples share one
    EXPECT_FALSE(b.recent("t", "q", "p2", 1000));
    EXPECT_FALSE(b.recent("t", "qp", "", 1000));
    b.note("t", "q", "p", 5000);  // noted again: recent from then
    EXPECT_TRUE(b.recent("t", "q", "p", 5500));
}

TEST(DrainPolicy, TheBusyPartitionsForgetEverythingAtTheirBound) {
    BusyPartitions b;
    for (size_t i = 0; i < BusyPartitions::kMaxEntries; ++i) b.note("t", "q", std::to_string(i), 100);
    EXPECT_EQ(b.size(), BusyPartitions::kMaxEntries);
    b.note("t", "q", "0", 200);  // one already known: no growth, nothing forgotten
    EXPECT_EQ(b.size(), BusyPartitions::kMaxEntries);
    b.note("t", "q", "new", 200);  // past the bound: all forgotten, the new one kept
    EXPECT_EQ(b.size(), 1u);
    EXPECT_TRUE(b.recent("t", "q", "new", 200));
    EXPECT_FALSE(b.recent("t", "q", "1", 200));
}
