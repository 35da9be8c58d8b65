// The floor's and the tenants' decisions (sweeper/floor.hpp), at both ends.
#include <gtest/gtest.h>

#include "sweeper/floor.hpp"
#include "sweeper/ring_tidy.hpp"

using namespace qsw;

TEST(Floor, AnAnswerMovesTheFloorForwardOnlyInItsEpoch) {
    const FloorTicket sent{1000, 3};
    EXPECT_EQ(floor_after_answer(1000, 3, sent, 2000), std::optional<int64_t>(2000));
    // never back by an answer
    EXPECT_EQ(floor_after_answer(3000, 3, sent, 2000), std::optional<int64_t>(3000));
    // an answer to a call sent before a walk lowered the floor is dropped
    EXPECT_EQ(floor_after_answer(500, 4, sent, 2000), std::optional<int64_t>(500));
    // no answer (a subset of shards, an empty claim): unchanged
    EXPECT_EQ(floor_after_answer(1000, 3, sent, std::nullopt), std::optional<int64_t>(1000));
    // the first floor
    EXPECT_EQ(floor_after_answer(std::nullopt, 0, FloorTicket{std::nullopt, 0}, 7),
              std::optional<int64_t>(7));
    EXPECT_EQ(floor_after_answer(std::nullopt, 1, FloorTicket{std::nullopt, 0}, 7), std::nullopt);
    // extreme instants
    EXPECT_EQ(floor_after_answer(INT64_MIN, 0, FloorTicket{INT64_MIN, 0}, INT64_MAX),
              std::optional<int64_t>(INT64_MAX));
}

TEST(Floor, AWalkFromTheHeadLowersTheFloorToWhatItFound) {
    EXPECT_EQ(floor_after_walk(5000, 1200), std::optional<int64_t>(1200));
    EXPECT_EQ(floor_after_walk(5000, std::nullopt), std::optional<int64_t>(5000));
    // a row found "behind" a floor that is already lower changes nothing
    EXPECT_EQ(floor_after_walk(1000, 1200), std::optional<int64_t>(1000));
    // no floor: the walks start at the head already
    EXPECT_EQ(floor_after_walk(std::nullopt, 1200), std::nullopt);
    EXPECT_EQ(floor_after_walk(0, INT64_MIN), std::optional<int64_t>(INT64_MIN));
}

TEST(Floor, TheWalkFromTheHeadCostsAtMostATwentiethOfTheTime) {
    EXPECT_EQ(head_walk_pause_ms(0), kHeadWalkMinPauseMs);
    EXPECT_EQ(head_walk_pause_ms(-5), kHeadWalkMinPauseMs);
    EXPECT_EQ(head_walk_pause_ms(2), kHeadWalkMinPauseMs);
    EXPECT_EQ(head_walk_pause_ms(10), 200);
    EXPECT_EQ(head_walk_pause_ms(1000), 20000);
    EXPECT_EQ(head_walk_pause_ms(5000), kHeadWalkMaxPauseMs);
    EXPECT_EQ(head_walk_pause_ms(INT64_MAX), kHeadWalkMaxPauseMs);  // no overflow
}

TEST(Floor, APassWalksFromItsEndBackToTheLowestFloorASliceAtATimeThenTheRestFromTheHead) {
    // from the end back, width at a time
    auto s = head_walk_slice(5000, 1000, 700);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->from_ms, std::optional<int64_t>(4300));
    EXPECT_EQ(s->until_ms, 5000);
    // never below low
    s = head_walk_slice(1200, 1000, 700);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->from_ms, std::optional<int64_t>(1000));
    EXPECT_EQ(s->until_ms, 1200);
    // at low (or below: a floor lowered past it): the rest, from the index's head
    s = head_walk_slice(1000, 1000, 700);
    ASSERT_TRUE(s);
    EXPECT_FALSE(s->from_ms);
    EXPECT_EQ(s->until_ms, 1000);
    s = head_walk_slice(900, 1000, 700);
    ASSERT_TRUE(s);
    EXPECT_FALSE(s->from_ms);
    EXPECT_EQ(s->until_ms, 900);
    // over once the slice from the head is done
    EXPECT_FALSE(head_walk_slice(std::nullopt, 1000, 700));
    // a width out of range is brought into it; no overflow near the ends of int64
    s = head_walk_slice(100000, 1000, 0);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->from_ms, std::optional<int64_t>(100000 - kHeadWalkMinWidthMs));
    s = head_walk_slice(INT64_MIN + 10, INT64_MIN, INT64_MAX);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->from_ms, std::optional<int64_t>(INT64_MIN));
    s = head_walk_slice(INT64_MAX, INT64_MIN, INT64_MAX);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->from_ms, std::optional<int64_t>(INT64_MAX - kHeadWalkMaxWidthMs));
}

TEST(Floor, ASliceOfTheWalkIsSizedToTakeAFewMilliseconds) {
    // took what a slice should: the same width
    EXPECT_EQ(head_walk_width_ms(60000, kHeadWalkSliceMs), 60000);
    // ten times too long: a tenth as wide, at once
    EXPECT_EQ(head_walk_width_ms(60000, 10 * kHeadWalkSliceMs), 6000);
    // far too long: not narrower than the least width
    EXPECT_EQ(head_walk_width_ms(60000, 1000000), kHeadWalkMinWidthMs);
    EXPECT_EQ(head_walk_width_ms(-5, 1000000), kHeadWalkMinWidthMs);
    // cheap: at most 4 times wider a slice, never wider than the most
    EXPECT_EQ(head_walk_width_ms(60000, 0), 240000);
    EXPECT_EQ(head_walk_width_ms(60000, -3), 240000);
    EXPECT_EQ(head_walk_width_ms(kHeadWalkMaxWidthMs, 0), kHeadWalkMaxWidthMs);
    EXPECT_EQ(head_walk_width_ms(INT64_MAX, 1), kHeadWalkMaxWidthMs);  // no overflow
}

TEST(Floor, TheProbeLooksToTheSleepCeilingUntilItMustLookFurther) {
    // busy: the ceiling
    EXPECT_EQ(probe_horizon_ms(0, 0, 1000, 3), std::optional<int64_t>(1000));
    EXPECT_EQ(probe_horizon_ms(2, 0, 1000, 3), std::optional<int64_t>(1000));
    // nothing within it idle_after_cycles times: as far as it must (an empty table?)
    EXPECT_EQ(probe_horizon_ms(3, 0, 1000, 3), std::nullopt);
    // idle: no bound
    EXPECT_EQ(probe_horizon_ms(0, 1, 1000, 3), std::nullopt);
    // extreme knobs
    EXPECT_EQ(probe_horizon_ms(0, 0, 0, 3), std::optional<int64_t>(1));
    EXPECT_EQ(probe_horizon_ms(0, 0, 1000, 0), std::optional<int64_t>(1000));
    EXPECT_EQ(probe_horizon_ms(1, 0, 1000, 0), std::nullopt);
}

TEST(Floor, ABacklogIsWhatTheProbeCappedOrAFullClaimSays) {
    EXPECT_TRUE(backlog_after_probe(true));
    EXPECT_FALSE(backlog_after_probe(false));
    // a full claim starts or keeps one; a short one ends it
    EXPECT_TRUE(backlog_after_claim(false, 200, 200));
    EXPECT_TRUE(backlog_after_claim(true, 200, 200));
    EXPECT_FALSE(backlog_after_claim(true, 199, 200));
    EXPECT_FALSE(backlog_after_claim(true, 0, 200));
    // more than asked (never expected) is full
    EXPECT_TRUE(backlog_after_claim(false, 500, 200));
    // a claim that asked for nothing changes nothing
    EXPECT_TRUE(backlog_after_claim(true, 0, 0));
    EXPECT_FALSE(backlog_after_claim(false, 0, 0));
    EXPECT_TRUE(backlog_after_claim(true, 0, -1));
}

TEST(Floor, TheRingIsWalkedEveryClaimWhileTenantsShareAndOnceASecondForOneTenant) {
    // no backlog: never
    EXPECT_FALSE(qsw::ring_wanted(false, 5, 10000, 0, 1000));
    // several tenants, or none known: every claim
    EXPECT_TRUE(qsw::ring_wanted(true, 2, 10000, 9999, 1000));
    EXPECT_TRUE(qsw::ring_wanted(true, 0, 10000, 9999, 1000));
    // one tenant: once per interval
    EXPECT_TRUE(qsw::ring_wanted(true, 1, 10000, 0, 1000));      // never walked yet
    EXPECT_FALSE(qsw::ring_wanted(true, 1, 10000, 9500, 1000));
    EXPECT_TRUE(qsw::ring_wanted(true, 1, 10500, 9500, 1000));   // at the interval's end
    EXPECT_TRUE(qsw::ring_wanted(true, 1, 9000, 9500, 1000));    // a clock that went back
    // extreme intervals
    EXPECT_TRUE(qsw::ring_wanted(true, 1, 10000, 10000, 0));
    EXPECT_TRUE(qsw::ring_wanted(true, 1, 10000, 10000, -5));
    EXPECT_FALSE(qsw::ring_wanted(true, 1, 10000, 1, INT64_MAX));
    // alone, 20 x the last claim that walked it, 100 ms to 1 s
    EXPECT_EQ(qsw::ring_alone_every_ms(0), 100);
    EXPECT_EQ(qsw::ring_alone_every_ms(-7), 100);
    EXPECT_EQ(qsw::ring_alone_every_ms(5), 100);
    EXPECT_EQ(qsw::ring_alone_every_ms(20), 400);
    EXPECT_EQ(qsw::ring_alone_every_ms(362), 1000);
    EXPECT_EQ(qsw::ring_alone_every_ms(INT64_MAX), 1000);
}

TEST(Floor, HeldRowsAreTriedByKeyAtMostOncePerCeiling) {
    // none held: never
    EXPECT_FALSE(qsw::try_held_rows(0, 5000, 0, 1000));
    EXPECT_FALSE(qsw::try_held_rows(-1, 5000, 0, 1000));
    // held, never tried: at once
    EXPECT_TRUE(qsw::try_held_rows(1, 5000, 0, 1000));
    // within the ceiling of the last try: not yet; at it and after: again
    EXPECT_FALSE(qsw::try_held_rows(3, 5999, 5000, 1000));
    EXPECT_TRUE(qsw::try_held_rows(3, 6000, 5000, 1000));
    EXPECT_TRUE(qsw::try_held_rows(3, 60000, 5000, 1000));
    // a clock that went back tries (never a stall), and a ceiling under 1 ms is 1 ms
    EXPECT_TRUE(qsw::try_held_rows(1, 4000, 5000, 1000));
    EXPECT_FALSE(qsw::try_held_rows(1, 5000, 5000, 0));
    EXPECT_TRUE(qsw::try_held_rows(1, 5001, 5000, 0));
}

// The tenants' ring's tidy: its interval while the ring holds tenants, a longer one while it
// is empty, the transient backoff after a failure (at least 1 ms).
TEST(RingTidy, TheWaitFollowsTheAnswer) {
    EXPECT_EQ(qsw::ring_tidy_wait(true, 1, 1000), qsw::kRingTidyEveryMs);
    EXPECT_EQ(qsw::ring_tidy_wait(true, 1000000, 1000), qsw::kRingTidyEveryMs);
    EXPECT_EQ(qsw::ring_tidy_wait(true, 0, 1000), qsw::kRingTidyIdleMs);
    EXPECT_EQ(qsw::ring_tidy_wait(false, 5, 1000), 1000);
    EXPECT_EQ(qsw::ring_tidy_wait(false, 0, 0), 1);
    EXPECT_EQ(qsw::ring_tidy_wait(false, 0, -5), 1);
}
