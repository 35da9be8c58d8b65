// Both ends of the pool's reconnect backoff (pg/pool.hpp reconnect_delay_ms).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "pg/pool.hpp"

using qsw::reconnect_delay_ms;

TEST(ReconnectDelay, DoublesFrom50msAndStaysShortForTheFirst30SecondsOfAnOutage) {
    EXPECT_EQ(reconnect_delay_ms(0, 0, 0.0), 25);
    EXPECT_EQ(reconnect_delay_ms(0, 0, 1.0), 50);
    EXPECT_EQ(reconnect_delay_ms(1, 0, 1.0), 100);
    EXPECT_EQ(reconnect_delay_ms(2, 0, 1.0), 200);
    EXPECT_EQ(reconnect_delay_ms(3, 0, 1.0), 250);   // capped: a failover's new primary is seconds away
    EXPECT_EQ(reconnect_delay_ms(50, 29999, 1.0), 250);
    EXPECT_EQ(reconnect_delay_ms(50, 29999, 0.0), 125);
}

TEST(ReconnectDelay, ALongOutageBacksOffToFiveSeconds) {
    EXPECT_EQ(reconnect_delay_ms(7, 30000, 1.0), 5000);
    EXPECT_EQ(reconnect_delay_ms(7, 30000, 0.0), 2500);
    EXPECT_EQ(reconnect_delay_ms(1000, std::numeric_limits<int64_t>::max(), 1.0), 5000);
    EXPECT_EQ(reconnect_delay_ms(2, 3600000, 1.0), 200);  // few failures yet: still short
}

TEST(ReconnectDelay, HostileInputsStayInBounds) {
    EXPECT_EQ(reconnect_delay_ms(-5, -5, 1.0), 50);
    EXPECT_EQ(reconnect_delay_ms(3, 0, std::nan("")), 125);
    EXPECT_EQ(reconnect_delay_ms(3, 0, 7.0), 125);
    EXPECT_EQ(reconnect_delay_ms(3, 0, -1.0), 125);
}

// A session the server refuses with an answer it repeats (pool.hpp session_fault_step).
using qsw::kSessionFaultCapMs;
using qsw::kSessionFaultQuietMs;
using qsw::session_fault_spacing_ms;
using qsw::session_fault_step;
using qsw::SessionFaultGate;
using qsw::setup_refusal_repeats;

TEST(SessionFaultSpacing, StartsShortAndIsASecondOrMoreFromTheSixthRefusal) {
    EXPECT_EQ(session_fault_spacing_ms(1, 0.0), 50);
    EXPECT_EQ(session_fault_spacing_ms(1, 1.0), 100);
    EXPECT_EQ(session_fault_spacing_ms(5, 1.0), 1600);
    EXPECT_EQ(session_fault_spacing_ms(5, 0.0), 800);   // still under a second with all jitter down
    EXPECT_EQ(session_fault_spacing_ms(6, 0.0), 1600);  // never under a second from here on
    EXPECT_EQ(session_fault_spacing_ms(7, 0.0), 2500);
    EXPECT_EQ(session_fault_spacing_ms(7, 1.0), kSessionFaultCapMs);
    EXPECT_EQ(session_fault_spacing_ms(1000000, 1.0), kSessionFaultCapMs);
}

TEST(SessionFaultSpacing, HostileInputsStayInBounds) {
    EXPECT_EQ(session_fault_spacing_ms(0, 1.0), 100);
    EXPECT_EQ(session_fault_spacing_ms(-7, 1.0), 100);
    EXPECT_EQ(session_fault_spacing_ms(7, std::nan("")), 2500);
    EXPECT_EQ(session_fault_spacing_ms(7, 9.0), 2500);
}

TEST(SessionFaultGate, ConnectionsRefusedTogetherOpenOneAtATime) {
    SessionFaultGate g;
    // Four sessions refused at the same instant: each opens after the one before it.
    int64_t last_open = 0;
    for (int i = 1; i <= 4; ++i) {
        auto s = session_fault_step(g, 1000, 1.0);
        EXPECT_EQ(s.next.faults, i);
        EXPECT_EQ(s.delay_ms, s.next.next_open_ms - 1000);
        EXPECT_EQ(s.next.next_open_ms, (i == 1 ? 1000 : last_open) + session_fault_spacing_ms(i, 1.0));
        last_open = s.next.next_open_ms;
        g = s.next;
    }
    EXPECT_EQ(last_open, 1000 + 100 + 200 + 400 + 800);
}

TEST(SessionFaultGate, ARefusalEveryTurnOpensAtMostOneSessionASecondAfterTheFirstSeconds) {
    // Each session is refused the moment it opens: the worst case, jitter at its lowest.
    SessionFaultGate g;
    int64_t now = 0;
    int opened_after_3s = 0;
    for (int i = 0; i < 200; ++i) {
        auto s = session_fault_step(g, now, 0.0);
        g = s.next;
        now += s.delay_ms;
        if (now > 3000 && now <= 603000) ++opened_after_3s;
    }
    EXPECT_LE(opened_after_3s, 600 / 2 + 1);  // 2.5 s apart at the cap
    EXPECT_GE(opened_after_3s, 600 / 5 - 1);  // and never slower than the cap
}

TEST(SessionFaultGate, AMinuteWithoutRefusalStartsShortAgain) {
    SessionFaultGate g{9, 10000, 15000};
    auto s = session_fault_step(g, 10000 + kSessionFaultQuietMs - 1, 1.0);
    EXPECT_EQ(s.next.faults, 10);
    EXPECT_EQ(s.delay_ms, kSessionFaultCapMs);
    s = session_fault_step(g, 10000 + kSessionFaultQuietMs, 1.0);
    EXPECT_EQ(s.next.faults, 1);
    EXPECT_EQ(s.delay_ms, 100);
}

TEST(SessionFaultGate, AGateFarAheadOrAClockGoneBackNeverParksThePool) {
    SessionFaultGate ahead{3, 1000, 1000 + 3600 * 1000};
    auto s = session_fault_step(ahead, 1000, 1.0);
    EXPECT_EQ(s.delay_ms, 8 * kSessionFaultCapMs + session_fault_spacing_ms(4, 1.0));
    SessionFaultGate later{3, 50000, 52000};
    s = session_fault_step(later, 100, 1.0);  // the clock went back: a fresh start
    EXPECT_EQ(s.next.faults, 1);
    EXPECT_EQ(s.delay_ms, 100);
}

TEST(SetupRefusal, RepeatsUnlessTheServerIsInMotion) {
    EXPECT_TRUE(setup_refusal_repeats("57014"));   // a role's statement_timeout
    EXPECT_TRUE(setup_refusal_repeats("42501"));   // no right to what setup runs
    EXPECT_TRUE(setup_refusal_repeats("53100"));   // disk full
    EXPECT_FALSE(setup_refusal_repeats(""));       // the connection broke: a failover
    EXPECT_FALSE(setup_refusal_repeats("25006"));  // a standby: a failover under way
    EXPECT_FALSE(setup_refusal_repeats("08006"));
    EXPECT_FALSE(setup_refusal_repeats("57P01"));  // shutting down
    EXPECT_FALSE(setup_refusal_repeats("57P03"));  // starting up
    EXPECT_FALSE(setup_refusal_repeats("5701"));   // not a SQLSTATE
}
