#include <gtest/gtest.h>

#include "ladder.hpp"

using namespace qsw;

TEST(Ladder, NoPressureRunsEverythingWithTheFullBudget) {
    auto s = shedding_ladder(0, 5000, 200);
    EXPECT_TRUE(s.prune);
    EXPECT_TRUE(s.rollup);
    EXPECT_EQ(s.fire_row_budget, 5000);
}

TEST(Ladder, PressureOneShedsThePruneFirst) {
    auto s = shedding_ladder(1, 5000, 200);
    EXPECT_FALSE(s.prune);
    EXPECT_TRUE(s.rollup);
    EXPECT_EQ(s.fire_row_budget, 2500);
}

TEST(Ladder, PressureTwoShedsTheRollupToo) {
    auto s = shedding_ladder(2, 5000, 200);
    EXPECT_FALSE(s.prune);
    EXPECT_FALSE(s.rollup);
    EXPECT_EQ(s.fire_row_budget, 1250);
}

TEST(Ladder, TheFireBudgetNeverFallsBelowOneClaimBatch) {
    EXPECT_EQ(shedding_ladder(5, 5000, 200).fire_row_budget, 200);
    EXPECT_EQ(shedding_ladder(1000000, 5000, 200).fire_row_budget, 200);
    EXPECT_EQ(shedding_ladder(3, 100, 200).fire_row_budget, 100);  // a batch bigger than the cycle
}

TEST(Ladder, NegativePressureIsNoPressure) {
    auto s = shedding_ladder(-3, 5000, 200);
    EXPECT_TRUE(s.prune);
    EXPECT_TRUE(s.rollup);
    EXPECT_EQ(s.fire_row_budget, 5000);
}

TEST(Ladder, ShedPhasesComeBackWhenPressureEnds) {
    EXPECT_FALSE(shedding_ladder(4, 5000, 200).prune);
    auto s = shedding_ladder(0, 5000, 200);
    EXPECT_TRUE(s.prune && s.rollup);
}
