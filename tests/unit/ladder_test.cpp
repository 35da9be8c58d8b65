#include <gtest/gtest.h>

#include "sweeper/ladder.hpp"

using namespace qsw;

TEST(Ladder, NoPressureRunsEverythingWithTheFullBudget) {
    auto s = shedding_ladder(0, 0, 5000, 200);
    EXPECT_TRUE(s.prune);
    EXPECT_TRUE(s.rollup);
    EXPECT_EQ(s.fire_row_budget, 5000);
}

TEST(Ladder, PressureOneShedsThePruneFirst) {
    auto s = shedding_ladder(1, 0, 5000, 200);
    EXPECT_FALSE(s.prune);
    EXPECT_TRUE(s.rollup);
    EXPECT_EQ(s.fire_row_budget, 5000);  // a backlog drained in good time keeps its budget
}

TEST(Ladder, PressureTwoShedsTheRollupToo) {
    auto s = shedding_ladder(2, 0, 5000, 200);
    EXPECT_FALSE(s.prune);
    EXPECT_FALSE(s.rollup);
}

TEST(Ladder, ASlowDatabaseHalvesTheFireBudgetPerStep) {
    EXPECT_EQ(shedding_ladder(1, 1, 5000, 200).fire_row_budget, 2500);
    EXPECT_EQ(shedding_ladder(2, 2, 5000, 200).fire_row_budget, 1250);
    EXPECT_EQ(shedding_ladder(3, 3, 5000, 200).fire_row_budget, 625);
}

TEST(Ladder, TheFireBudgetNeverFallsBelowOneClaimBatch) {
    EXPECT_EQ(shedding_ladder(5, 5, 5000, 200).fire_row_budget, 200);
    EXPECT_EQ(shedding_ladder(1000000, 1000000, 5000, 200).fire_row_budget, 200);
    EXPECT_EQ(shedding_ladder(3, 3, 100, 200).fire_row_budget, 100);  // a batch bigger than the cycle
}

TEST(Ladder, NegativePressureIsNoPressure) {
    auto s = shedding_ladder(-3, -3, 5000, 200);
    EXPECT_TRUE(s.prune);
    EXPECT_TRUE(s.rollup);
    EXPECT_EQ(s.fire_row_budget, 5000);
}

TEST(Ladder, ShedPhasesComeBackWhenPressureEnds) {
    EXPECT_FALSE(shedding_ladder(4, 4, 5000, 200).prune);
    auto s = shedding_ladder(0, 0, 5000, 200);
    EXPECT_TRUE(s.prune && s.rollup);
}
