// The engine's rules, one behaviour per test, all on an explicit clock.
#include "ephemeral_test_util.hpp"

using namespace eph_test;

namespace {
constexpr int OK = QUEEN_EPHEMERAL_OK;
constexpr int DONE = QUEEN_EPHEMERAL_ACK_COMPLETED;
constexpr int RETRY = QUEEN_EPHEMERAL_ACK_RETRY;
constexpr int FAILED = QUEEN_EPHEMERAL_ACK_FAILED;
} // namespace

TEST(EphemeralPushPop, PushPopAckCompleted) {
    Engine e;
    int64_t off = -1;
    ASSERT_EQ(push(e, "q", "p", "alpha", 100, &off), OK);
    EXPECT_EQ(off, 0);
    ASSERT_EQ(push(e, "q", "p", "", 101, &off), OK); // empty payloads are messages too
    EXPECT_EQ(off, 1);

    Popped a = pop(e, "q", "p", "g", 200);
    ASSERT_EQ(a.rc, OK) << queen_ephemeral_last_error();
    EXPECT_EQ(a.offset, 0);
    EXPECT_EQ(a.payload, "alpha");
    EXPECT_EQ(a.attempt, 1u);
    EXPECT_EQ(a.pushed, 100);
    EXPECT_EQ(a.lease_expires, 200 + 1000); // the engine's default lease
    EXPECT_NE(a.lease_id, 0u);

    Popped b = pop(e, "q", "p", "g", 200, 50);
    ASSERT_EQ(b.rc, OK);
    EXPECT_EQ(b.offset, 1);
    EXPECT_EQ(b.payload, "");
    EXPECT_EQ(b.lease_expires, 250);
    EXPECT_NE(b.lease_id, a.lease_id);

    EXPECT_EQ(pop(e, "q", "p", "g", 200).rc, QUEEN_EPHEMERAL_EAGAIN);
    EXPECT_EQ(info(e, "q").in_flight, 2u);
    ASSERT_EQ(ack(e, "q", "p", "g", a, DONE, 210), OK);
    ASSERT_EQ(queen_ephemeral_ack(e, "q", "p", "g", -1, b.lease_id, DONE, 210), OK); // by lease id alone
    EXPECT_EQ(info(e, "q").messages, 0u);
    EXPECT_EQ(stat(e, "bytes"), 0u);
    EXPECT_EQ(stat(e, "pushed_total"), 2u);
    EXPECT_EQ(stat(e, "popped_total"), 2u);
    EXPECT_EQ(stat(e, "acked_total"), 2u);
    // Settled is settled.
    EXPECT_EQ(ack(e, "q", "p", "g", a, DONE, 220), QUEEN_EPHEMERAL_ENOENT);
}

TEST(EphemeralPushPop, PartitionsAreSeparateRings) {
    Engine e;
    int64_t off = -1;
    ASSERT_EQ(push(e, "q", "a", "1", 0, &off), OK);
    EXPECT_EQ(off, 0);
    ASSERT_EQ(push(e, "q", "b", "2", 0, &off), OK);
    EXPECT_EQ(off, 0);
    EXPECT_EQ(pop(e, "q", "b", "g", 1).payload, "2");
    EXPECT_EQ(pop(e, "q", "a", "g", 1).payload, "1");
    EXPECT_EQ(info(e, "q").partitions, 2u);
}

TEST(EphemeralGroups, IndependentCursors) {
    Engine e;
    // A group exists from its first pop, even an empty one.
    ASSERT_EQ(pop(e, "q", "p", "A", 0).rc, QUEEN_EPHEMERAL_EAGAIN);
    ASSERT_EQ(pop(e, "q", "p", "B", 0).rc, QUEEN_EPHEMERAL_EAGAIN);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(push(e, "q", "p", "m" + std::to_string(i), i), OK);
    for (int i = 0; i < 3; ++i) {
        Popped a = pop(e, "q", "p", "A", 10);
        ASSERT_EQ(a.rc, OK);
        EXPECT_EQ(a.offset, i);
        ASSERT_EQ(ack(e, "q", "p", "A", a, DONE, 10), OK);
    }
    EXPECT_EQ(pop(e, "q", "p", "A", 10).rc, QUEEN_EPHEMERAL_EAGAIN);
    // B has seen nothing of what A consumed.
    for (int i = 0; i < 3; ++i) {
        Popped b = pop(e, "q", "p", "B", 10);
        ASSERT_EQ(b.rc, OK);
        EXPECT_EQ(b.offset, i);
        EXPECT_EQ(b.payload, "m" + std::to_string(i));
        EXPECT_EQ(b.attempt, 1u);
    }
    EXPECT_EQ(info(e, "q").groups, 2u);
}

TEST(EphemeralGroups, TrimOnlyAfterEveryGroupConsumed) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    ASSERT_EQ(push(e, "q", "p", "y", 0), OK);
    Popped a0 = pop(e, "q", "p", "A", 1);
    Popped b0 = pop(e, "q", "p", "B", 1);
    ASSERT_EQ(ack(e, "q", "p", "A", a0, DONE, 2), OK);
    EXPECT_EQ(info(e, "q").messages, 2u) << "B still needs offset 0";
    ASSERT_EQ(ack(e, "q", "p", "B", b0, DONE, 2), OK);
    EXPECT_EQ(info(e, "q").messages, 1u);
    EXPECT_EQ(info(e, "q").bytes, 1u);

    Popped a1 = pop(e, "q", "p", "A", 3);
    ASSERT_EQ(ack(e, "q", "p", "A", a1, DONE, 3), OK);
    EXPECT_EQ(info(e, "q").messages, 1u) << "B still needs offset 1";
    // A group that arrives late starts at the oldest message still held.
    Popped c = pop(e, "q", "p", "C", 4);
    EXPECT_EQ(c.offset, 1);
    ASSERT_EQ(ack(e, "q", "p", "C", c, DONE, 4), OK);
    Popped b1 = pop(e, "q", "p", "B", 4);
    ASSERT_EQ(ack(e, "q", "p", "B", b1, DONE, 4), OK);
    EXPECT_EQ(info(e, "q").messages, 0u);
    EXPECT_EQ(stat(e, "messages"), 0u);
}

TEST(EphemeralGroups, NoGroupYetHoldsMessages) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    EXPECT_EQ(sweep(e, 50000).ttl_dropped, 0u);
    EXPECT_EQ(info(e, "q").messages, 1u);
    EXPECT_EQ(pop(e, "q", "p", "first", 50001).payload, "x");
}

TEST(EphemeralGroups, GroupOfOnePartitionHoldsBackTheOthers) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p1", "a", 0), OK);
    ASSERT_EQ(push(e, "q", "p2", "b", 0), OK);
    Popped a = pop(e, "q", "p1", "A", 1); // A now exists for the whole queue
    Popped b = pop(e, "q", "p2", "B", 1);
    ASSERT_EQ(ack(e, "q", "p2", "B", b, DONE, 2), OK);
    EXPECT_EQ(info(e, "q").messages, 2u) << "A has not consumed p2 yet";
    Popped a2 = pop(e, "q", "p2", "A", 3);
    EXPECT_EQ(a2.offset, 0);
    ASSERT_EQ(ack(e, "q", "p2", "A", a2, DONE, 3), OK);
    EXPECT_EQ(info(e, "q").messages, 1u);
    (void)a;
}

TEST(EphemeralLease, ExpiryRedeliversWithNextAttempt) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    Popped first = pop(e, "q", "p", "g", 0, 1000);
    ASSERT_EQ(first.rc, OK);
    EXPECT_EQ(pop(e, "q", "p", "g", 999).rc, QUEEN_EPHEMERAL_EAGAIN);
    Popped again = pop(e, "q", "p", "g", 1000); // the lease lapses at its instant
    ASSERT_EQ(again.rc, OK);
    EXPECT_EQ(again.offset, first.offset);
    EXPECT_EQ(again.attempt, 2u);
    EXPECT_EQ(again.payload, "x");
    EXPECT_NE(again.lease_id, first.lease_id);
    EXPECT_EQ(stat(e, "redelivered_total"), 1u);
}

TEST(EphemeralLease, RedeliveryComesBeforeNewMessages) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p", "old", 0), OK);
    ASSERT_EQ(push(e, "q", "p", "new", 0), OK);
    Popped old = pop(e, "q", "p", "g", 0, 10);
    ASSERT_EQ(old.offset, 0);
    Popped redelivered = pop(e, "q", "p", "g", 10);
    EXPECT_EQ(redelivered.offset, 0);
    EXPECT_EQ(redelivered.attempt, 2u);
    EXPECT_EQ(pop(e, "q", "p", "g", 10).offset, 1);
}

TEST(EphemeralLease, RetryLimitExhausts) {
    Engine e([](queen_ephemeral_config &c) { c.max_retries = 2; });
    ASSERT_EQ(push(e, "q", "p", "poison", 0), OK);
    int64_t now = 0;
    for (uint32_t attempt = 1; attempt <= 3; ++attempt) {
        Popped m = pop(e, "q", "p", "g", now, 100);
        ASSERT_EQ(m.rc, OK) << "attempt " << attempt;
        EXPECT_EQ(m.attempt, attempt);
        now += 100;
    }
    // The third lease lapses past max_retries: dropped for the group, not redelivered.
    EXPECT_EQ(pop(e, "q", "p", "g", now).rc, QUEEN_EPHEMERAL_EAGAIN);
    EXPECT_EQ(stat(e, "exhausted_total"), 1u);
    EXPECT_EQ(stat(e, "redelivered_total"), 2u);
    EXPECT_EQ(info(e, "q").messages, 0u) << "its only group is done with it";
}

TEST(EphemeralAck, RetryMakesItVisibleAtOnce) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    Popped m = pop(e, "q", "p", "g", 0);
    ASSERT_EQ(ack(e, "q", "p", "g", m, RETRY, 5), OK);
    Popped again = pop(e, "q", "p", "g", 5);
    ASSERT_EQ(again.rc, OK);
    EXPECT_EQ(again.offset, 0);
    EXPECT_EQ(again.attempt, 2u);
    EXPECT_EQ(stat(e, "retried_total"), 1u);
    EXPECT_EQ(stat(e, "redelivered_total"), 0u);
}

TEST(EphemeralAck, RetryPastTheLimitExhausts) {
    Engine e([](queen_ephemeral_config &c) { c.max_retries = 0; });
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    Popped m = pop(e, "q", "p", "g", 0);
    ASSERT_EQ(ack(e, "q", "p", "g", m, RETRY, 1), OK);
    EXPECT_EQ(pop(e, "q", "p", "g", 1).rc, QUEEN_EPHEMERAL_EAGAIN);
    EXPECT_EQ(stat(e, "exhausted_total"), 1u);
    EXPECT_EQ(info(e, "q").messages, 0u);
}

TEST(EphemeralAck, FailedDropsForThatGroupOnly) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    ASSERT_EQ(push(e, "q", "p", "y", 0), OK);
    Popped a = pop(e, "q", "p", "A", 0);
    Popped b = pop(e, "q", "p", "B", 0);
    ASSERT_EQ(ack(e, "q", "p", "A", a, FAILED, 1), OK);
    EXPECT_EQ(pop(e, "q", "p", "A", 1).offset, 1) << "failed is not redelivered";
    ASSERT_EQ(ack(e, "q", "p", "B", b, RETRY, 1), OK);
    Popped b2 = pop(e, "q", "p", "B", 1);
    EXPECT_EQ(b2.offset, 0) << "B keeps its own copy";
    EXPECT_EQ(stat(e, "failed_total"), 1u);
}

TEST(EphemeralAck, SupersededLeaseIsStale) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    Popped first = pop(e, "q", "p", "g", 0, 10);
    Popped second = pop(e, "q", "p", "g", 10, 10);
    ASSERT_EQ(second.attempt, 2u);
    EXPECT_EQ(ack(e, "q", "p", "g", first, DONE, 11), QUEEN_EPHEMERAL_ESTALE);
    EXPECT_NE(std::string(queen_ephemeral_last_error()).find("superseded"), std::string::npos);
    EXPECT_EQ(queen_ephemeral_ack(e, "q", "p", "g", -1, first.lease_id, DONE, 11), QUEEN_EPHEMERAL_ENOENT);
    EXPECT_EQ(ack(e, "q", "p", "g", second, DONE, 11), OK);
    EXPECT_EQ(stat(e, "acked_total"), 1u);
}

TEST(EphemeralAck, LapsedLeaseHonouredUntilRedelivered) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    Popped m = pop(e, "q", "p", "g", 0, 10);
    EXPECT_EQ(sweep(e, 20).redelivered, 1u);
    // Visible again but not yet handed out: the slow consumer's ack still counts.
    EXPECT_EQ(ack(e, "q", "p", "g", m, DONE, 21), OK);
    EXPECT_EQ(pop(e, "q", "p", "g", 22).rc, QUEEN_EPHEMERAL_EAGAIN);
}

TEST(EphemeralAck, ByOffsetAlone) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    ASSERT_EQ(pop(e, "q", "p", "g", 0).rc, OK);
    EXPECT_EQ(queen_ephemeral_ack(e, "q", "p", "g", 0, 0, DONE, 1), OK);
    EXPECT_EQ(info(e, "q").messages, 0u);
}

TEST(EphemeralAck, UnknownTargetsAreNotFound) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    ASSERT_EQ(pop(e, "q", "p", "g", 0).rc, OK);
    EXPECT_EQ(queen_ephemeral_ack(e, "nope", "p", "g", 0, 0, DONE, 1), QUEEN_EPHEMERAL_ENOENT);
    EXPECT_NE(std::string(queen_ephemeral_last_error()).find("'nope'"), std::string::npos);
    EXPECT_EQ(queen_ephemeral_ack(e, "q", "nope", "g", 0, 0, DONE, 1), QUEEN_EPHEMERAL_ENOENT);
    EXPECT_EQ(queen_ephemeral_ack(e, "q", "p", "nope", 0, 0, DONE, 1), QUEEN_EPHEMERAL_ENOENT);
    EXPECT_EQ(queen_ephemeral_ack(e, "q", "p", "g", 7, 0, DONE, 1), QUEEN_EPHEMERAL_ENOENT);
    EXPECT_EQ(queen_ephemeral_ack(e, "q", "p", "g", -1, 999999, DONE, 1), QUEEN_EPHEMERAL_ENOENT);
}

TEST(EphemeralTtl, HeadDropOnTouch) {
    Engine e([](queen_ephemeral_config &c) { c.ttl_ms = 1000; });
    ASSERT_EQ(push(e, "q", "p", "old", 0), OK);
    ASSERT_EQ(push(e, "q", "p", "mid", 500), OK);
    ASSERT_EQ(push(e, "q", "p", "new", 1000), OK); // the push itself drops the expired head
    EXPECT_EQ(stat(e, "ttl_dropped_total"), 1u);
    EXPECT_EQ(info(e, "q").messages, 2u);
    Popped m = pop(e, "q", "p", "g", 1000);
    EXPECT_EQ(m.offset, 1);
    EXPECT_EQ(m.payload, "mid");
}

TEST(EphemeralTtl, ExpiredMessageIsDroppedEvenWhileLeased) {
    Engine e([](queen_ephemeral_config &c) { c.ttl_ms = 100; });
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    Popped m = pop(e, "q", "p", "g", 0, 5000);
    EXPECT_EQ(sweep(e, 100).ttl_dropped, 1u);
    EXPECT_EQ(info(e, "q").in_flight, 0u);
    EXPECT_EQ(ack(e, "q", "p", "g", m, DONE, 101), QUEEN_EPHEMERAL_ENOENT);
    EXPECT_EQ(stat(e, "bytes"), 0u);
}

TEST(EphemeralTtl, DeclaredQueueOverridesTheDefault) {
    Engine e([](queen_ephemeral_config &c) { c.ttl_ms = 0; });
    queen_ephemeral_queue_options o;
    queen_ephemeral_queue_options_init(&o);
    o.ttl_ms = 50;
    o.lease_ms = 7;
    ASSERT_EQ(queen_ephemeral_declare(e, "short", &o), OK) << queen_ephemeral_last_error();
    ASSERT_EQ(push(e, "short", "p", "x", 0), OK);
    ASSERT_EQ(push(e, "other", "p", "x", 0), OK);
    queen_ephemeral_sweep_result r = sweep(e, 50);
    EXPECT_EQ(r.ttl_dropped, 1u);
    EXPECT_EQ(info(e, "other").messages, 1u);
    ASSERT_EQ(push(e, "short", "p", "y", 60), OK);
    EXPECT_EQ(pop(e, "short", "p", "g", 60).lease_expires, 67);
}

TEST(EphemeralGc, IdleImplicitQueueIsCollected) {
    Engine e([](queen_ephemeral_config &c) { c.idle_gc_ms = 1000; });
    EXPECT_EQ(pop(e, "implicit", "p", "g", 0).rc, QUEEN_EPHEMERAL_EAGAIN); // a pop creates it
    EXPECT_EQ(stat(e, "queues"), 1u);
    EXPECT_EQ(sweep(e, 999).queues_collected, 0u);
    EXPECT_EQ(sweep(e, 1000).queues_collected, 1u);
    int rc = 0;
    info(e, "implicit", &rc);
    EXPECT_EQ(rc, QUEEN_EPHEMERAL_ENOENT);
    EXPECT_EQ(stat(e, "queues"), 0u);
    EXPECT_EQ(stat(e, "collected_total"), 1u);
}

TEST(EphemeralGc, ConsumedQueueIsCollectedAfterItsLastTouch) {
    Engine e([](queen_ephemeral_config &c) { c.idle_gc_ms = 1000; });
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    Popped m = pop(e, "q", "p", "g", 500);
    ASSERT_EQ(ack(e, "q", "p", "g", m, DONE, 800), OK);
    EXPECT_EQ(sweep(e, 1700).queues_collected, 0u) << "the ack at 800 was a touch";
    EXPECT_EQ(sweep(e, 1800).queues_collected, 1u);
}

TEST(EphemeralGc, QueueStillHoldingMessagesIsKept) {
    Engine e([](queen_ephemeral_config &c) { c.idle_gc_ms = 1000; });
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    EXPECT_EQ(sweep(e, 100000).queues_collected, 0u);
    EXPECT_EQ(info(e, "q").messages, 1u);
}

TEST(EphemeralGc, DeclaredQueueIsKept) {
    Engine e([](queen_ephemeral_config &c) { c.idle_gc_ms = 1000; });
    ASSERT_EQ(queen_ephemeral_declare(e, "kept", nullptr), OK);
    EXPECT_EQ(pop(e, "kept", "p", "g", 0).rc, QUEEN_EPHEMERAL_EAGAIN);
    EXPECT_EQ(sweep(e, 10000000).queues_collected, 0u);
    EXPECT_EQ(info(e, "kept").declared, 1);
    EXPECT_EQ(stat(e, "declared_queues"), 1u);
}

TEST(EphemeralGc, DeclaringAnImplicitQueueKeepsItsContent) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    ASSERT_EQ(queen_ephemeral_declare(e, "q", nullptr), OK);
    EXPECT_EQ(info(e, "q").declared, 1);
    EXPECT_EQ(pop(e, "q", "p", "g", 1).payload, "x");
}

TEST(EphemeralGc, TouchAfterIdleStartsAFreshQueue) {
    Engine e([](queen_ephemeral_config &c) { c.idle_gc_ms = 1000; });
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    Popped m = pop(e, "q", "p", "g", 0);
    ASSERT_EQ(ack(e, "q", "p", "g", m, DONE, 0), OK);
    // No sweep ran, but the outcome is the one a sweep would have produced;
    // only the offsets go on where the collected ring left them.
    int64_t off = -1;
    ASSERT_EQ(push(e, "q", "p", "y", 5000, &off), OK);
    EXPECT_EQ(off, 1);
    EXPECT_EQ(stat(e, "collected_total"), 1u);
    EXPECT_EQ(info(e, "q").groups, 0u);
}

// A late ack after the queue it named was collected (issue 18). A consumer
// takes offset 0 and stalls past its lease; another consumer of the same group
// gets it again and completes it, so the queue is empty and, once idle,
// collected. The producer then pushes again and a third consumer takes the new
// message. The stalled consumer finally acks offset 0 by offset alone (lease id
// 0): that must not name the new message, whatever the outcome, whichever path
// collected the queue, and the new message is delivered exactly once.
enum class Collection { OnTouch, BySweep };

static void late_ack_after_collection(Collection path, int outcome) {
    Engine e([](queen_ephemeral_config &c) { c.idle_gc_ms = 1000; });
    ASSERT_EQ(push(e, "q", "p", "first", 0), OK);
    Popped stalled = pop(e, "q", "p", "g", 0, 100);
    ASSERT_EQ(stalled.rc, OK);
    ASSERT_EQ(stalled.offset, 0);
    Popped again = pop(e, "q", "p", "g", 100);
    ASSERT_EQ(again.attempt, 2u);
    ASSERT_EQ(ack(e, "q", "p", "g", again, DONE, 100), OK);
    ASSERT_EQ(info(e, "q").messages, 0u);

    if (path == Collection::BySweep) {
        ASSERT_EQ(sweep(e, 1100).queues_collected, 1u);
        int rc = 0;
        info(e, "q", &rc);
        ASSERT_EQ(rc, QUEEN_EPHEMERAL_ENOENT);
    }
    // On touch: no sweep ran, so this push collects the idle queue in place.
    int64_t off = -1;
    ASSERT_EQ(push(e, "q", "p", "second", 1200, &off), OK);
    EXPECT_EQ(stat(e, "collected_total"), 1u);
    EXPECT_GT(off, stalled.offset) << "an offset is never reused within its partition";
    Popped fresh = pop(e, "q", "p", "g", 1300);
    ASSERT_EQ(fresh.rc, OK);
    ASSERT_EQ(fresh.payload, "second");
    EXPECT_EQ(fresh.offset, off);
    EXPECT_EQ(fresh.attempt, 1u);

    // The stalled consumer's ack, with its old lease and then by offset alone.
    EXPECT_EQ(ack(e, "q", "p", "g", stalled, outcome, 1400), QUEEN_EPHEMERAL_ENOENT);
    EXPECT_EQ(queen_ephemeral_ack(e, "q", "p", "g", stalled.offset, 0, outcome, 1400),
              QUEEN_EPHEMERAL_ENOENT);
    EXPECT_EQ(info(e, "q").in_flight, 1u) << "the new delivery is still open";
    EXPECT_EQ(pop(e, "q", "p", "g", 1500).rc, QUEEN_EPHEMERAL_EAGAIN)
        << "not delivered a second time while its consumer works on it";

    // Its own consumer settles it, once, and the ring trims it.
    EXPECT_EQ(ack(e, "q", "p", "g", fresh, DONE, 1600), OK) << queen_ephemeral_last_error();
    EXPECT_EQ(info(e, "q").messages, 0u);
    EXPECT_EQ(pop(e, "q", "p", "g", 1700).rc, QUEEN_EPHEMERAL_EAGAIN);
    EXPECT_EQ(stat(e, "popped_total"), 3u);
    EXPECT_EQ(stat(e, "acked_total"), 2u);
    EXPECT_EQ(stat(e, "retried_total"), 0u);
    EXPECT_EQ(stat(e, "failed_total"), 0u);
    EXPECT_EQ(sweep(e, 2700).queues_collected, 1u) << "and the queue is collected again";
}

TEST(EphemeralLateAck, CompletedAfterCollectionOnTouch) {
    late_ack_after_collection(Collection::OnTouch, DONE);
}
TEST(EphemeralLateAck, CompletedAfterCollectionBySweep) {
    late_ack_after_collection(Collection::BySweep, DONE);
}
TEST(EphemeralLateAck, RetryAfterCollectionOnTouch) {
    late_ack_after_collection(Collection::OnTouch, RETRY);
}
TEST(EphemeralLateAck, RetryAfterCollectionBySweep) {
    late_ack_after_collection(Collection::BySweep, RETRY);
}
TEST(EphemeralLateAck, FailedAfterCollectionOnTouch) {
    late_ack_after_collection(Collection::OnTouch, FAILED);
}
TEST(EphemeralLateAck, FailedAfterCollectionBySweep) {
    late_ack_after_collection(Collection::BySweep, FAILED);
}

// The same late ack before anyone took the new message: refused, and the new
// message is still delivered (not skipped) to the next pop.
TEST(EphemeralLateAck, BeforeTheNewMessageIsTaken) {
    for (Collection path : {Collection::OnTouch, Collection::BySweep}) {
        Engine e([](queen_ephemeral_config &c) {
            c.idle_gc_ms = 1000;
            c.max_retries = 0; // the stalled lease is exhausted: the queue empties by itself
        });
        ASSERT_EQ(push(e, "q", "p", "first", 0), OK);
        Popped stalled = pop(e, "q", "p", "g", 0, 100);
        ASSERT_EQ(stalled.rc, OK);
        if (path == Collection::BySweep) {
            ASSERT_EQ(sweep(e, 1100).queues_collected, 1u);
        }
        int64_t off = -1;
        ASSERT_EQ(push(e, "q", "p", "second", 1200, &off), OK);
        EXPECT_NE(off, stalled.offset);
        // Collection forgot the group; a pop of another partition makes it known
        // again, so the ack below gets as far as looking at the offset.
        ASSERT_EQ(pop(e, "q", "p2", "g", 1250).rc, QUEEN_EPHEMERAL_EAGAIN);
        EXPECT_EQ(queen_ephemeral_ack(e, "q", "p", "g", stalled.offset, 0, DONE, 1300),
                  QUEEN_EPHEMERAL_ENOENT);
        Popped fresh = pop(e, "q", "p", "g", 1400);
        ASSERT_EQ(fresh.rc, OK) << "the new message is not skipped";
        EXPECT_EQ(fresh.payload, "second");
        EXPECT_EQ(fresh.attempt, 1u);
        EXPECT_EQ(ack(e, "q", "p", "g", fresh, DONE, 1500), OK);
        EXPECT_EQ(info(e, "q").messages, 0u);
    }
}

TEST(EphemeralGc, ZeroIdleGcNeverCollects) {
    Engine e([](queen_ephemeral_config &c) { c.idle_gc_ms = 0; });
    EXPECT_EQ(pop(e, "q", "p", "g", 0).rc, QUEEN_EPHEMERAL_EAGAIN);
    EXPECT_EQ(sweep(e, int64_t{1} << 50).queues_collected, 0u);
}

TEST(EphemeralMaintenance, RunsOnTouchOfThatQueueOnly) {
    Engine e;
    ASSERT_EQ(push(e, "a", "p", "x", 0), OK);
    ASSERT_EQ(push(e, "b", "p", "x", 0), OK);
    ASSERT_EQ(pop(e, "a", "p", "g", 0, 10).rc, OK);
    ASSERT_EQ(pop(e, "b", "p", "g", 0, 10).rc, OK);
    ASSERT_EQ(push(e, "a", "p", "y", 50), OK); // touches a, not b
    EXPECT_EQ(info(e, "a").in_flight, 0u);
    EXPECT_EQ(info(e, "b").in_flight, 1u);
    EXPECT_EQ(stat(e, "redelivered_total"), 1u);
    // An ack is a touch too: b's lapsed lease is handled before the ack looks.
    EXPECT_EQ(queen_ephemeral_ack(e, "b", "p", "g", 5, 0, DONE, 60), QUEEN_EPHEMERAL_ENOENT);
    EXPECT_EQ(info(e, "b").in_flight, 0u);
    EXPECT_EQ(stat(e, "redelivered_total"), 2u);
}

TEST(EphemeralSweep, CountsAndNextExpiry) {
    Engine e([](queen_ephemeral_config &c) {
        c.max_retries = 1;
        c.idle_gc_ms = 10000;
    });
    queen_ephemeral_queue_options ttl;
    queen_ephemeral_queue_options_init(&ttl);
    ttl.ttl_ms = 300;
    ASSERT_EQ(queen_ephemeral_declare(e, "ttl", &ttl), OK);

    // lease: one lease that lapses (redelivered), one at its last attempt (exhausted).
    ASSERT_EQ(push(e, "lease", "p", "r", 0), OK);
    ASSERT_EQ(push(e, "lease", "p", "x", 0), OK);
    ASSERT_EQ(pop(e, "lease", "p", "g", 0, 100).offset, 0);
    ASSERT_EQ(pop(e, "lease", "p", "g", 0, 100).offset, 1);
    // Both lapse; the second is taken again and lapses on its last attempt.
    Popped x = pop(e, "lease", "p", "g", 100, 50);
    ASSERT_EQ(x.attempt, 2u);
    ASSERT_EQ(x.offset, 0);
    // ttl: two messages, one older than the ttl at the sweep.
    ASSERT_EQ(push(e, "ttl", "p", "old", 0), OK);
    ASSERT_EQ(push(e, "ttl", "p", "young", 200), OK);
    // idle: an implicit queue untouched since 0.
    ASSERT_EQ(pop(e, "idle", "p", "g", 0).rc, QUEEN_EPHEMERAL_EAGAIN);
    // live: a lease still armed at the sweep.
    ASSERT_EQ(push(e, "live", "p", "x", 9000), OK);
    ASSERT_EQ(pop(e, "live", "p", "g", 9000, 5000).rc, OK);

    queen_ephemeral_sweep_result r = sweep(e, 10000);
    EXPECT_EQ(r.exhausted, 1u);   // offset 0 of "lease", at attempt 2 with max_retries 1
    EXPECT_EQ(r.redelivered, 0u); // offset 1 was already redelivered by the pop at 100
    EXPECT_EQ(r.ttl_dropped, 2u); // both ttl messages are past 300 ms at 10000
    EXPECT_EQ(r.queues_collected, 1u);
    EXPECT_EQ(r.next_expiry_unix_ms, 14000);

    // Nothing armed: -1.
    Engine quiet;
    EXPECT_EQ(sweep(quiet, 5).next_expiry_unix_ms, -1);
}

TEST(EphemeralSweep, ReportsRedeliveriesAndTtlInstants) {
    Engine e([](queen_ephemeral_config &c) { c.ttl_ms = 1000; });
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    ASSERT_EQ(push(e, "q", "p", "y", 400), OK);
    ASSERT_EQ(pop(e, "q", "p", "g", 0, 100).rc, OK);
    EXPECT_EQ(sweep(e, 50).next_expiry_unix_ms, 100); // the lease comes first
    queen_ephemeral_sweep_result r = sweep(e, 100);
    EXPECT_EQ(r.redelivered, 1u);
    EXPECT_EQ(r.next_expiry_unix_ms, 1000); // then the head's ttl
    r = sweep(e, 1000);
    EXPECT_EQ(r.ttl_dropped, 1u);
    EXPECT_EQ(r.next_expiry_unix_ms, 1400);
}
