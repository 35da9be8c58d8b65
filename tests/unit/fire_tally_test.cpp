// Both ends of what a fire's answer means for its batch (sweeper/fire_tally.hpp).
#include <gtest/gtest.h>

#include "sweeper/fire_tally.hpp"

using namespace qsw;

namespace {
// A batch of `per` rows per segment, segment s holding rows [s*per, (s+1)*per).
struct Fixture {
    std::vector<ClaimedTimer> rows;
    FireBatch batch;
};
Fixture batch_of(size_t segments, size_t per, int64_t late_ms = -1000) {
    Fixture f;
    for (size_t s = 0; s < segments; ++s) {
        PackedSegment seg;
        seg.tenant = "t";
        seg.queue = "q" + std::to_string(s);
        seg.partition = "p";
        seg.count = static_cast<uint32_t>(per);
        seg.bytes = 100;
        for (size_t i = 0; i < per; ++i) {
            ClaimedTimer t;
            t.timer_key = "k" + std::to_string(f.rows.size());
            t.late_ms = late_ms;
            seg.rows.push_back(f.rows.size());
            f.rows.push_back(t);
        }
        f.batch.segments.push_back(seg);
        f.batch.bytes += seg.bytes;
    }
    return f;
}
FireAnswer answer(const char *text) {
    FireAnswer a = parse_fire_answer(text);
    EXPECT_TRUE(a.readable) << text;
    return a;
}
}  // namespace

TEST(FireTally, AnEmptyAnswerKeepsEverySegmentBusyAndForgetsNothing) {
    const Fixture f = batch_of(3, 2);
    const FireTally t = tally_fire(answer(R"({"segments": []})"), f.batch, f.rows, 0);
    EXPECT_EQ(t.busy.segments.size(), 3u);
    EXPECT_EQ(t.busy.bytes, 300u);
    EXPECT_TRUE(t.done_rows.empty());
    EXPECT_EQ(t.fired + t.stale + t.dup + t.released, 0);
    EXPECT_TRUE(t.fired_notes.empty());
}

TEST(FireTally, AllFiredCountsLagsAndAnnouncesEachSegmentWithItsOffset) {
    const Fixture f = batch_of(2, 3, -1000);
    const FireTally t = tally_fire(
        answer(R"({"segments": [{"status": "fired", "baseOffset": 10}, {"status": "fired", "baseOffset": 13}]})"),
        f.batch, f.rows, 1250);
    EXPECT_EQ(t.fired, 6);
    EXPECT_EQ(t.fired_segs, 2);
    ASSERT_EQ(t.lags.size(), 6u);
    EXPECT_EQ(t.lags[0], 250);
    EXPECT_EQ(t.lag_max, 250);
    EXPECT_EQ(t.fired_notes, (std::vector<std::pair<size_t, int64_t>>{{0, 10}, {1, 13}}));
    EXPECT_TRUE(t.busy.segments.empty());
    EXPECT_EQ(t.done_rows, (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
    // Fired early on the loop's clock (a negative lateness): never below zero.
    EXPECT_EQ(tally_fire(answer(R"({"segments": [{"status": "fired"}]})"), batch_of(1, 1).batch, batch_of(1, 1).rows,
                         0).lag_max,
              0);
}

TEST(FireTally, StaleDuplicateOtherAndBusyMixed) {
    const Fixture f = batch_of(5, 2);
    const FireTally t = tally_fire(answer(R"({"segments": [
            {"status": "stale", "held": 1},
            {"status": "duplicate", "duplicates": 2, "released": 2},
            {"status": "busy"},
            {"status": "weird"},
            {"status": "fired", "baseOffset": 7}], "provisionBusy": 1})"),
                                   f.batch, f.rows, 0);
    EXPECT_EQ(t.stale, 1);
    EXPECT_EQ(t.stale_unheld, 1);
    EXPECT_EQ(t.stale_rows, (std::vector<size_t>{0, 1}));
    EXPECT_EQ(t.dup, 2);
    EXPECT_EQ(t.released, 1 + 2);
    ASSERT_EQ(t.busy.segments.size(), 1u);
    EXPECT_EQ(t.busy.segments[0].queue, "q2");
    EXPECT_EQ(t.provision_busy, 1);
    EXPECT_EQ(t.fired, 2);
    EXPECT_EQ(t.fired_notes, (std::vector<std::pair<size_t, int64_t>>{{4, 7}}));
    // Every segment but the busy and the stale one is settled, the unknown status included;
    // the stale one's rows are settled by their hand-back.
    EXPECT_EQ(t.done_rows, (std::vector<size_t>{2, 3, 6, 7, 8, 9}));
}

TEST(FireTally, AnAnswerShorterThanTheCallKeepsTheRestBusy) {
    const Fixture f = batch_of(3, 1);
    const FireTally t = tally_fire(answer(R"({"segments": [{"status": "fired", "baseOffset": 1}]})"), f.batch, f.rows, 0);
    EXPECT_EQ(t.fired, 1);
    EXPECT_EQ(t.busy.segments.size(), 2u);
    EXPECT_EQ(t.done_rows, (std::vector<size_t>{0}));
}

TEST(FireTally, AnEmptyBatchTalliesNothing) {
    const FireTally t = tally_fire(answer(R"({"segments": [{"status": "fired"}]})"), FireBatch{}, {}, 0);
    EXPECT_EQ(t.fired, 0);
    EXPECT_TRUE(t.done_rows.empty());
    EXPECT_TRUE(t.busy.segments.empty());
}
