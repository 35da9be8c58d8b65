// Both ends of the recovery's decisions (sweeper/recovery_policy.hpp): the in-doubt
// settlement and the link state.
#include <gtest/gtest.h>

#include "sweeper/recovery_policy.hpp"

using namespace qsw;

namespace {
ParkedSegment seg(int64_t count, bool hashes = true) {
    ParkedSegment s;
    s.tenant = "t";
    s.queue = "q";
    s.partition = "p";
    s.count = count;
    if (hashes) s.hashes = std::string(16, 'h');
    for (int64_t i = 0; i < count; ++i) s.rows.push_back(static_cast<size_t>(i));
    return s;
}
ParkedFire fire(std::vector<ParkedSegment> segs, bool in_doubt = true) {
    ParkedFire f;
    f.in_doubt = in_doubt;
    f.segments = std::move(segs);
    return f;
}
InDoubtSeen seen(int64_t present, int64_t unlocked, int64_t base = -1) { return InDoubtSeen{present, unlocked, base}; }
}  // namespace

TEST(InDoubtPlan, NothingParkedNothingToDo) {
    const InDoubtPlan p = plan_in_doubt({}, {});
    EXPECT_TRUE(p.decided.empty());
    EXPECT_EQ(p.fired_rows + p.fired_segments + p.fired_calls + p.not_fired_calls, 0);
}

TEST(InDoubtPlan, NothingPresentAndInTheLogIsCommittedAndAnnouncedOnce) {
    const InDoubtPlan p = plan_in_doubt({fire({seg(3), seg(2)})}, {seen(0, 0, 100), seen(0, 0, 200)});
    ASSERT_EQ(p.decided.size(), 1u);
    const InDoubtFirePlan &f = p.decided[0];
    EXPECT_EQ(f.fire, 0u);
    ASSERT_EQ(f.announce.size(), 2u);
    EXPECT_EQ(f.announce[0], (std::pair<size_t, int64_t>{0, 100}));
    EXPECT_EQ(f.announce[1], (std::pair<size_t, int64_t>{1, 200}));
    EXPECT_TRUE(f.release.empty());
    EXPECT_TRUE(f.left.empty());
    EXPECT_EQ(f.count, InDoubtFirePlan::Count::fired);
    EXPECT_EQ(p.fired_rows, 5);
    EXPECT_EQ(p.fired_segments, 2);
    EXPECT_EQ(p.fired_calls, 1);
    EXPECT_EQ(p.not_fired_calls, 0);
}

TEST(InDoubtPlan, AllPresentAndUnlockedDidNotCommitAndGoesBack) {
    const InDoubtPlan p = plan_in_doubt({fire({seg(3), seg(2)})}, {seen(3, 3), seen(2, 2)});
    ASSERT_EQ(p.decided.size(), 1u);
    const InDoubtFirePlan &f = p.decided[0];
    EXPECT_TRUE(f.announce.empty());
    EXPECT_EQ(f.release, (std::vector<size_t>{0, 1}));
    EXPECT_EQ(f.left, (std::vector<size_t>{0, 1}));
    EXPECT_EQ(f.count, InDoubtFirePlan::Count::not_fired);
    EXPECT_EQ(p.fired_rows, 0);
    EXPECT_EQ(p.not_fired_calls, 1);
}

TEST(InDoubtPlan, AnyLockedTimerLeavesTheWholeFireUndecided) {
    // One segment of the fire is still locked by someone: nothing of that fire is decided,
    // even its committed segment; the next fire is decided on its own.
    const InDoubtPlan p = plan_in_doubt({fire({seg(1), seg(2)}), fire({seg(1)})},
                                        {seen(0, 0, 5), seen(2, 1), seen(1, 1)});
    ASSERT_EQ(p.decided.size(), 1u);
    EXPECT_EQ(p.decided[0].fire, 1u);
    EXPECT_EQ(p.decided[0].release, (std::vector<size_t>{0}));
    EXPECT_EQ(p.fired_rows, 0);
    EXPECT_EQ(p.fired_calls, 0);
    EXPECT_EQ(p.not_fired_calls, 1);
}

TEST(InDoubtPlan, ABaseOffsetCommitsOnlyWhenNothingIsPresentAndThereWereHashes) {
    const InDoubtPlan p = plan_in_doubt({fire({seg(2), seg(2, false), seg(2)})},
                                        {seen(1, 1, 40), seen(0, 0, 41), seen(0, 0, 0)});
    ASSERT_EQ(p.decided.size(), 1u);
    const InDoubtFirePlan &f = p.decided[0];
    // Segment 0: some timers present (the log's offset is someone else's): back.
    // Segment 1: no hashes (rows of a fail call): never committed, left, nothing to release.
    // Segment 2: offset 0 is an offset: committed.
    EXPECT_EQ(f.announce, (std::vector<std::pair<size_t, int64_t>>{{2, 0}}));
    EXPECT_EQ(f.release, (std::vector<size_t>{0}));
    EXPECT_EQ(f.left, (std::vector<size_t>{0, 1}));
    EXPECT_EQ(f.count, InDoubtFirePlan::Count::fired);
    EXPECT_EQ(p.fired_rows, 2);
}

TEST(InDoubtPlan, NothingPresentAndNotInTheLogIsLeftNotReleased) {
    const InDoubtPlan p = plan_in_doubt({fire({seg(2)})}, {seen(0, 0, -1)});
    ASSERT_EQ(p.decided.size(), 1u);
    EXPECT_TRUE(p.decided[0].announce.empty());
    EXPECT_TRUE(p.decided[0].release.empty());
    EXPECT_EQ(p.decided[0].left, (std::vector<size_t>{0}));
    EXPECT_EQ(p.decided[0].count, InDoubtFirePlan::Count::not_fired);
}

TEST(InDoubtPlan, MixedFiresCountOnceAndParkedRowsAreNeverCounted) {
    ParkedFire counted = fire({seg(1)});
    counted.counted = true;  // decided before, its release failed: not counted again
    const InDoubtPlan p = plan_in_doubt(
        {fire({seg(4)}), fire({seg(1, false)}, false), counted, fire({seg(2)}), fire({seg(3)})},
        {seen(0, 0, 9), seen(1, 1), seen(1, 1), seen(2, 0), seen(3, 3)});
    ASSERT_EQ(p.decided.size(), 4u);  // fire 3 is locked
    EXPECT_EQ(p.decided[0].fire, 0u);
    EXPECT_EQ(p.decided[0].count, InDoubtFirePlan::Count::fired);
    EXPECT_EQ(p.decided[1].fire, 1u);
    EXPECT_EQ(p.decided[1].count, InDoubtFirePlan::Count::none);  // a fail call's rows
    EXPECT_EQ(p.decided[1].release, (std::vector<size_t>{0}));
    EXPECT_EQ(p.decided[2].fire, 2u);
    EXPECT_EQ(p.decided[2].count, InDoubtFirePlan::Count::none);
    EXPECT_EQ(p.decided[3].fire, 4u);
    EXPECT_EQ(p.decided[3].count, InDoubtFirePlan::Count::not_fired);
    EXPECT_EQ(p.fired_rows, 4);
    EXPECT_EQ(p.fired_segments, 1);
    EXPECT_EQ(p.fired_calls, 1);
    EXPECT_EQ(p.not_fired_calls, 1);
}

TEST(InDoubtPlan, ACheckThatCoversFewerSegmentsLeavesTheRestUndecided) {
    const InDoubtPlan p = plan_in_doubt({fire({seg(1)}), fire({seg(1), seg(1)})}, {seen(0, 0, 1), seen(0, 0, 2)});
    ASSERT_EQ(p.decided.size(), 1u);
    EXPECT_EQ(p.decided[0].fire, 0u);
}

TEST(LinkState, TheStartIsIdentifiedIntoConnectedWithoutAnAgain) {
    const LinkStep st = link_step(Link::unidentified, LinkEvent::identified);
    EXPECT_EQ(st.next, Link::connected);
    EXPECT_FALSE(st.again);
    EXPECT_TRUE(identify_due(Link::unidentified));
    EXPECT_FALSE(identify_due(Link::connected));
    EXPECT_TRUE(identify_due(Link::lost));
    EXPECT_FALSE(identify_due(Link::reconnected));
}

TEST(LinkState, ALossIsDatedOnceUntilTheServerIsFoundAgain) {
    LinkStep st = link_step(Link::connected, LinkEvent::call_lost);
    EXPECT_EQ(st.next, Link::lost);
    EXPECT_TRUE(st.new_loss);
    st = link_step(Link::lost, LinkEvent::call_lost);
    EXPECT_EQ(st.next, Link::lost);
    EXPECT_FALSE(st.new_loss);  // many failed calls, one loss
    st = link_step(Link::lost, LinkEvent::disconnect_seen);
    EXPECT_EQ(st.next, Link::lost);
    EXPECT_FALSE(st.new_loss);
    st = link_step(Link::lost, LinkEvent::identified);
    EXPECT_EQ(st.next, Link::reconnected);
    EXPECT_TRUE(st.again);
    st = link_step(Link::reconnected, LinkEvent::call_lost);  // lost again before any fire: a new loss
    EXPECT_EQ(st.next, Link::lost);
    EXPECT_TRUE(st.new_loss);
    EXPECT_TRUE(link_step(Link::unidentified, LinkEvent::call_lost).new_loss);
}

TEST(LinkState, ADisconnectIsALossOnlyOnceAServerWasKnown) {
    LinkStep st = link_step(Link::connected, LinkEvent::disconnect_seen, true);
    EXPECT_EQ(st.next, Link::lost);
    EXPECT_TRUE(st.new_loss);
    st = link_step(Link::unidentified, LinkEvent::disconnect_seen, false);
    EXPECT_EQ(st.next, Link::unidentified);
    EXPECT_FALSE(st.new_loss);
    st = link_step(Link::reconnected, LinkEvent::disconnect_seen, true);
    EXPECT_EQ(st.next, Link::lost);
    EXPECT_TRUE(st.new_loss);
    st = link_step(Link::unidentified, LinkEvent::disconnect_seen, true);  // a fire resumed before identifying
    EXPECT_EQ(st.next, Link::lost);
    EXPECT_TRUE(st.new_loss);
}

TEST(LinkState, TheFirstFireAfterALossIsTheResumption) {
    LinkStep st = link_step(Link::reconnected, LinkEvent::fired);
    EXPECT_EQ(st.next, Link::connected);
    EXPECT_TRUE(st.resumed);
    st = link_step(Link::lost, LinkEvent::fired);  // fired before the identification came back
    EXPECT_EQ(st.next, Link::unidentified);
    EXPECT_TRUE(st.resumed);
    st = link_step(Link::connected, LinkEvent::fired);
    EXPECT_EQ(st.next, Link::connected);
    EXPECT_FALSE(st.resumed);
    st = link_step(Link::unidentified, LinkEvent::fired);
    EXPECT_EQ(st.next, Link::unidentified);
    EXPECT_FALSE(st.resumed);
    st = link_step(Link::unidentified, LinkEvent::identified);  // after that early fire: no "again"
    EXPECT_FALSE(st.again);
}
