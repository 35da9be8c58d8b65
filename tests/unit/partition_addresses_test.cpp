// Both ends of the partitions' row addresses the drain keeps from its fires
// (sweeper/partition_addresses.hpp): found, replaced, forgotten, and bounded in bytes.
#include <gtest/gtest.h>

#include <string>

#include "sweeper/partition_addresses.hpp"

using namespace qsw;

TEST(PartitionAddresses, LearntFoundReplacedAndForgotten) {
    PartitionAddresses a;
    EXPECT_TRUE(a.find("t", "q", "p").empty());
    a.learn("t", "q", "p", "(1,2)");
    EXPECT_EQ(a.find("t", "q", "p"), "(1,2)");
    a.learn("t", "q", "p", "(3,4)");
    EXPECT_EQ(a.find("t", "q", "p"), "(3,4)");
    EXPECT_EQ(a.size(), 1u);
    a.learn("t", "q", "p", "");
    EXPECT_TRUE(a.find("t", "q", "p").empty());
    EXPECT_EQ(a.size(), 0u);
    EXPECT_EQ(a.bytes(), 0u);
    a.learn("t", "q", "never", "");  // forgetting what was never learnt
    EXPECT_EQ(a.size(), 0u);
}

TEST(PartitionAddresses, NamesThatRunIntoEachOtherStayApart) {
    // tenant, queue and partition are kept apart: ("t", "qp", "") is not ("t", "q", "p").
    PartitionAddresses a;
    a.learn("t", "q", "p", "(1,1)");
    a.learn("t", "qp", "", "(2,2)");
    a.learn("tq", "", "p", "(3,3)");
    EXPECT_EQ(a.find("t", "q", "p"), "(1,1)");
    EXPECT_EQ(a.find("t", "qp", ""), "(2,2)");
    EXPECT_EQ(a.find("tq", "", "p"), "(3,3)");
    EXPECT_EQ(a.size(), 3u);
}

TEST(PartitionAddresses, PastTheBoundEverythingIsForgottenAtOnce) {
    PartitionAddresses a(1000);  // a few entries
    int learnt = 0;
    while (a.resets() == 0) a.learn("tenant", "queue", "p" + std::to_string(learnt++), "(10,10)");
    EXPECT_LE(a.bytes(), 1000u);
    EXPECT_EQ(a.size(), 1u);  // only the one learnt after the reset
    EXPECT_EQ(a.find("tenant", "queue", "p" + std::to_string(learnt - 1)), "(10,10)");
    EXPECT_TRUE(a.find("tenant", "queue", "p0").empty());
    EXPECT_GT(learnt, 3);
    // Replacing an address in place never counts twice.
    for (int i = 0; i < 100; ++i) a.learn("tenant", "queue", "p" + std::to_string(learnt - 1), "(" + std::to_string(i) + ",1)");
    EXPECT_EQ(a.resets(), 1);
    // An entry larger than the bound is never kept, and forgets nothing.
    a.learn("tenant", std::string(2000, 'q'), "p", "(1,1)");
    EXPECT_TRUE(a.find("tenant", std::string(2000, 'q'), "p").empty());
    EXPECT_EQ(a.size(), 1u);
}
