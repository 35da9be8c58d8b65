// Both ends of the rollup's wait after another broker's pass served the interval
// (sweeper/rollup.hpp, rollup_wait_after_skip).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "sweeper/rollup.hpp"

using namespace qsw;

TEST(RollupGate, APassRanElsewhereWaitsOutWhatIsLeftOfTheInterval) {
    EXPECT_EQ(rollup_wait_after_skip(300000, 0), 300000);        // it ran just now
    EXPECT_EQ(rollup_wait_after_skip(300000, 120000), 180000);
    EXPECT_EQ(rollup_wait_after_skip(300000, 299500), kRollupMinWaitMs);  // never sooner than 1 s
    EXPECT_EQ(rollup_wait_after_skip(300000, 300000), kRollupMinWaitMs);
    EXPECT_EQ(rollup_wait_after_skip(300000, std::numeric_limits<int64_t>::max()), kRollupMinWaitMs);
}

TEST(RollupGate, APassRunningElsewhereWaitsAWholeInterval) {
    EXPECT_EQ(rollup_wait_after_skip(30000, -1), 30000);
    EXPECT_EQ(rollup_wait_after_skip(30000, std::numeric_limits<int64_t>::min()), 30000);
}

TEST(RollupGate, ExtremeIntervalsStayInBounds) {
    EXPECT_EQ(rollup_wait_after_skip(0, -1), 1);                 // an interval under 1 ms counts as 1
    EXPECT_EQ(rollup_wait_after_skip(-5, 0), 1);
    EXPECT_EQ(rollup_wait_after_skip(100, 60), 100);             // a gate under 1 s: its own interval
    EXPECT_EQ(rollup_wait_after_skip(100, 20), 100);
    EXPECT_EQ(rollup_wait_after_skip(std::numeric_limits<int64_t>::max(), 0), std::numeric_limits<int64_t>::max());
}
