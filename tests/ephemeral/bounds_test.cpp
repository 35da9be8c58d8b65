// Byte and length bounds, per queue and for the whole engine, under both
// overflow policies.
#include "ephemeral_test_util.hpp"

using namespace eph_test;

namespace {
constexpr int OK = QUEEN_EPHEMERAL_OK;
constexpr int FULL = QUEEN_EPHEMERAL_EFULL;

bool last_error_names(const char *what) {
    return std::string(queen_ephemeral_last_error()).find(what) != std::string::npos;
}
} // namespace

TEST(EphemeralBounds, QueueMessagesReject) {
    Engine e([](queen_ephemeral_config &c) { c.queue_max_messages = 2; });
    ASSERT_EQ(push(e, "q", "p", "a", 0), OK);
    ASSERT_EQ(push(e, "q", "p2", "b", 0), OK); // the bound is per queue, over its partitions
    EXPECT_EQ(push(e, "q", "p", "c", 0), FULL);
    EXPECT_TRUE(last_error_names("queue_max_messages (2)")) << queen_ephemeral_last_error();
    EXPECT_TRUE(last_error_names("'q'"));
    EXPECT_EQ(push(e, "other", "p", "c", 0), OK) << "another queue has its own bound";
    EXPECT_EQ(stat(e, "rejected_total"), 1u);
    EXPECT_EQ(info(e, "q").messages, 2u);
}

TEST(EphemeralBounds, QueueBytesReject) {
    Engine e([](queen_ephemeral_config &c) { c.queue_max_bytes = 10; });
    ASSERT_EQ(push(e, "q", "p", "123456", 0), OK);
    EXPECT_EQ(push(e, "q", "p", "12345", 0), FULL);
    EXPECT_TRUE(last_error_names("queue_max_bytes (10)")) << queen_ephemeral_last_error();
    EXPECT_EQ(push(e, "q", "p", "1234", 0), OK);
    EXPECT_EQ(info(e, "q").bytes, 10u);
}

TEST(EphemeralBounds, AckFreesRoom) {
    Engine e([](queen_ephemeral_config &c) { c.queue_max_messages = 1; });
    ASSERT_EQ(push(e, "q", "p", "a", 0), OK);
    EXPECT_EQ(push(e, "q", "p", "b", 0), FULL);
    Popped m = pop(e, "q", "p", "g", 1);
    EXPECT_EQ(push(e, "q", "p", "b", 1), FULL) << "delivered but unacked still counts";
    ASSERT_EQ(ack(e, "q", "p", "g", m, QUEEN_EPHEMERAL_ACK_COMPLETED, 2), OK);
    EXPECT_EQ(push(e, "q", "p", "b", 2), OK);
}

TEST(EphemeralBounds, QueueDropOldest) {
    Engine e([](queen_ephemeral_config &c) {
        c.queue_max_messages = 2;
        c.overflow = QUEEN_EPHEMERAL_OVERFLOW_DROP_OLDEST;
    });
    ASSERT_EQ(push(e, "q", "p1", "first", 0), OK);
    ASSERT_EQ(push(e, "q", "p2", "second", 1), OK);
    ASSERT_EQ(push(e, "q", "p2", "third", 2), OK); // evicts the oldest of the queue, in p1
    EXPECT_EQ(stat(e, "overflow_dropped_total"), 1u);
    EXPECT_EQ(stat(e, "rejected_total"), 0u);
    EXPECT_EQ(pop(e, "q", "p1", "g", 3).rc, QUEEN_EPHEMERAL_EAGAIN);
    EXPECT_EQ(pop(e, "q", "p2", "g", 3).payload, "second");
    EXPECT_EQ(info(e, "q").messages, 2u);
}

TEST(EphemeralBounds, DropOldestCancelsLeasesOnWhatItDrops) {
    Engine e([](queen_ephemeral_config &c) {
        c.queue_max_bytes = 4;
        c.overflow = QUEEN_EPHEMERAL_OVERFLOW_DROP_OLDEST;
    });
    ASSERT_EQ(push(e, "q", "p", "ab", 0), OK);
    Popped m = pop(e, "q", "p", "g", 0);
    ASSERT_EQ(push(e, "q", "p", "cde", 1), OK);
    EXPECT_EQ(info(e, "q").in_flight, 0u);
    EXPECT_EQ(ack(e, "q", "p", "g", m, QUEEN_EPHEMERAL_ACK_COMPLETED, 2), QUEEN_EPHEMERAL_ENOENT);
    EXPECT_EQ(pop(e, "q", "p", "g", 2).payload, "cde");
}

TEST(EphemeralBounds, PayloadLargerThanTheBoundIsRejectedWithoutEviction) {
    Engine e([](queen_ephemeral_config &c) {
        c.queue_max_bytes = 4;
        c.overflow = QUEEN_EPHEMERAL_OVERFLOW_DROP_OLDEST;
    });
    ASSERT_EQ(push(e, "q", "p", "ab", 0), OK);
    EXPECT_EQ(push(e, "q", "p", "12345", 0), FULL);
    EXPECT_TRUE(last_error_names("queue_max_bytes (4)")) << queen_ephemeral_last_error();
    EXPECT_EQ(info(e, "q").messages, 1u) << "nothing was evicted for a push that could never fit";
}

TEST(EphemeralBounds, EngineMessagesReject) {
    Engine e([](queen_ephemeral_config &c) { c.max_messages = 3; });
    ASSERT_EQ(push(e, "a", "p", "1", 0), OK);
    ASSERT_EQ(push(e, "b", "p", "2", 0), OK);
    ASSERT_EQ(push(e, "c", "p", "3", 0), OK);
    EXPECT_EQ(push(e, "d", "p", "4", 0), FULL);
    EXPECT_TRUE(last_error_names("engine max_messages (3)")) << queen_ephemeral_last_error();
    EXPECT_EQ(stat(e, "messages"), 3u);
}

TEST(EphemeralBounds, EngineBytesReject) {
    Engine e([](queen_ephemeral_config &c) { c.max_bytes = 8; });
    ASSERT_EQ(push(e, "a", "p", "12345", 0), OK);
    EXPECT_EQ(push(e, "b", "p", "1234", 0), FULL);
    EXPECT_TRUE(last_error_names("engine max_bytes (8)")) << queen_ephemeral_last_error();
    EXPECT_EQ(push(e, "b", "p", "123", 0), OK);
    EXPECT_EQ(stat(e, "bytes"), 8u);
}

TEST(EphemeralBounds, EngineDropOldestEvictsOnlyThePushingQueue) {
    Engine e([](queen_ephemeral_config &c) {
        c.max_bytes = 10;
        c.overflow = QUEEN_EPHEMERAL_OVERFLOW_DROP_OLDEST;
    });
    ASSERT_EQ(push(e, "a", "p", "1111", 0), OK);
    ASSERT_EQ(push(e, "a", "p", "2222", 1), OK);
    // b holds nothing to give up, and never takes a's messages.
    EXPECT_EQ(push(e, "b", "p", "3333", 2), FULL);
    EXPECT_TRUE(last_error_names("engine max_bytes (10)")) << queen_ephemeral_last_error();
    EXPECT_EQ(info(e, "a").messages, 2u);
    // a pays for its own room.
    ASSERT_EQ(push(e, "a", "p", "4444", 3), OK);
    EXPECT_EQ(stat(e, "overflow_dropped_total"), 1u);
    EXPECT_EQ(pop(e, "a", "p", "g", 4).payload, "2222");
    EXPECT_EQ(stat(e, "bytes"), 8u);
}

TEST(EphemeralBounds, DeclaredQueueOverridesTheDefaults) {
    Engine e([](queen_ephemeral_config &c) { c.queue_max_messages = 1; });
    queen_ephemeral_queue_options o;
    queen_ephemeral_queue_options_init(&o);
    o.max_messages = 0; // unbounded for this one
    ASSERT_EQ(queen_ephemeral_declare(e, "big", &o), OK);
    for (int i = 0; i < 5; ++i) ASSERT_EQ(push(e, "big", "p", "x", 0), OK);
    ASSERT_EQ(push(e, "small", "p", "x", 0), OK);
    EXPECT_EQ(push(e, "small", "p", "x", 0), FULL);
    // Re-declaring replaces the options; the bound applies from the next push.
    o.max_messages = 2;
    o.overflow = QUEEN_EPHEMERAL_OVERFLOW_DROP_OLDEST;
    ASSERT_EQ(queen_ephemeral_declare(e, "big", &o), OK);
    ASSERT_EQ(push(e, "big", "p", "y", 1), OK);
    EXPECT_EQ(info(e, "big").messages, 2u);
    EXPECT_EQ(stat(e, "overflow_dropped_total"), 4u);
}

TEST(EphemeralBounds, MaxQueuesAndMaxGroups) {
    Engine e([](queen_ephemeral_config &c) {
        c.max_queues = 2;
        c.max_groups = 1;
    });
    ASSERT_EQ(push(e, "a", "p", "x", 0), OK);
    ASSERT_EQ(push(e, "b", "p", "x", 0), OK);
    EXPECT_EQ(push(e, "c", "p", "x", 0), FULL);
    EXPECT_TRUE(last_error_names("max_queues (2)")) << queen_ephemeral_last_error();
    EXPECT_EQ(pop(e, "c", "p", "g", 0).rc, FULL);
    ASSERT_EQ(pop(e, "a", "p", "g1", 0).rc, OK);
    EXPECT_EQ(pop(e, "a", "p", "g2", 0).rc, FULL);
    EXPECT_TRUE(last_error_names("max_groups (1)")) << queen_ephemeral_last_error();
}
