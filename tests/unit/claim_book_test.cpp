// The claim book: row_next at both ends (every state x every event), and the book applying
// it: entries keyed with their token, refusals counted and said, figures by state.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "sweeper/claim_book.hpp"

using namespace qsw;

namespace {

constexpr RowState kStates[] = {RowState::claimed, RowState::firing, RowState::kept, RowState::parked};
constexpr RowEvent kEvents[] = {RowEvent::sent, RowEvent::busy, RowEvent::call_failed, RowEvent::answer_lost,
                                RowEvent::settled};

ClaimedTimer row(const std::string &key, const std::string &token = "tok-1") {
    ClaimedTimer t;
    t.tenant = "00000000-0000-0000-0000-0000000000a1";
    t.queue = "q";
    t.timer_key = key;
    t.claim_token = token;
    return t;
}

int64_t in(const ClaimBook &b, RowState s) { return b.figures().by_state[static_cast<size_t>(s)]; }

}  // namespace

// The whole table: what each state does with each event. Written out, not derived, so a
// change to row_next shows here as a change of the contract.
TEST(RowNext, TheWholeTable) {
    struct Want {
        RowState from;
        RowEvent e;
        bool legal, leaves;
        RowState next;
    };
    const Want table[] = {
        {RowState::claimed, RowEvent::sent, true, false, RowState::firing},
        {RowState::claimed, RowEvent::busy, false, false, RowState::claimed},
        {RowState::claimed, RowEvent::call_failed, false, false, RowState::claimed},
        {RowState::claimed, RowEvent::answer_lost, true, false, RowState::parked},
        {RowState::claimed, RowEvent::settled, true, true, RowState::claimed},
        {RowState::firing, RowEvent::sent, false, false, RowState::firing},
        {RowState::firing, RowEvent::busy, true, false, RowState::kept},
        {RowState::firing, RowEvent::call_failed, true, false, RowState::claimed},
        {RowState::firing, RowEvent::answer_lost, true, false, RowState::parked},
        {RowState::firing, RowEvent::settled, true, true, RowState::firing},
        {RowState::kept, RowEvent::sent, true, false, RowState::firing},
        {RowState::kept, RowEvent::busy, false, false, RowState::kept},
        {RowState::kept, RowEvent::call_failed, false, false, RowState::kept},
        {RowState::kept, RowEvent::answer_lost, false, false, RowState::kept},
        {RowState::kept, RowEvent::settled, true, true, RowState::kept},
        {RowState::parked, RowEvent::sent, false, false, RowState::parked},
        {RowState::parked, RowEvent::busy, false, false, RowState::parked},
        {RowState::parked, RowEvent::call_failed, false, false, RowState::parked},
        {RowState::parked, RowEvent::answer_lost, false, false, RowState::parked},
        {RowState::parked, RowEvent::settled, true, true, RowState::parked},
    };
    ASSERT_EQ(std::size(table), std::size(kStates) * std::size(kEvents));
    for (const Want &w : table) {
        const RowMove m = row_next(w.from, w.e);
        SCOPED_TRACE(std::string(row_state_name(w.from)) + " + " + row_event_name(w.e));
        EXPECT_EQ(m.legal, w.legal);
        EXPECT_EQ(m.leaves, w.leaves);
        if (m.legal && !m.leaves) {
            EXPECT_EQ(m.next, w.next);
        }
    }
}

// The two ends: every state may settle (a stop, a deadline, the recovery), and nothing but a
// settlement takes a parked row anywhere (its fire may have committed: never sent again).
TEST(RowNext, EveryStateSettlesAndAParkedRowOnlySettles) {
    for (RowState s : kStates) {
        EXPECT_TRUE(row_next(s, RowEvent::settled).leaves) << row_state_name(s);
        if (s != RowState::parked) continue;
        for (RowEvent e : kEvents) {
            if (e == RowEvent::settled) continue;
            EXPECT_FALSE(row_next(s, e).legal) << row_event_name(e);
        }
    }
    // A row is in at most one call: sent while firing is refused.
    EXPECT_FALSE(row_next(RowState::firing, RowEvent::sent).legal);
}

TEST(ClaimBook, ARowsLifeFromClaimToFire) {
    ClaimBook b;
    const ClaimedTimer t = row("k1");
    b.enter(t);
    EXPECT_EQ(b.state_of(t), RowState::claimed);
    EXPECT_TRUE(b.move(t, RowEvent::sent));
    EXPECT_TRUE(b.move(t, RowEvent::busy));
    EXPECT_EQ(b.state_of(t), RowState::kept);
    EXPECT_EQ(in(b, RowState::kept), 1);
    EXPECT_TRUE(b.move(t, RowEvent::sent));
    EXPECT_EQ(in(b, RowState::firing), 1);
    EXPECT_EQ(in(b, RowState::kept), 0);
    EXPECT_TRUE(b.move(t, RowEvent::settled));
    EXPECT_FALSE(b.holds(t));
    EXPECT_TRUE(b.empty());
    for (RowState s : kStates) EXPECT_EQ(in(b, s), 0) << row_state_name(s);
    EXPECT_EQ(b.figures().refused_moves_total, 0);
    EXPECT_EQ(b.take_refusal(), "");
}

TEST(ClaimBook, ASecondSettlementIsRefusedCountedAndSaid) {
    ClaimBook b;
    const ClaimedTimer t = row("k1");
    b.enter(t);
    EXPECT_TRUE(b.move(t, RowEvent::settled));
    EXPECT_FALSE(b.move(t, RowEvent::settled));
    EXPECT_EQ(b.figures().refused_moves_total, 1);
    EXPECT_NE(b.take_refusal().find("not in the claim book"), std::string::npos);
    EXPECT_EQ(b.take_refusal(), "");  // said once
}

TEST(ClaimBook, ARefusedMoveLeavesTheRowAsItWas) {
    ClaimBook b;
    const ClaimedTimer t = row("k1");
    b.enter(t);
    ASSERT_TRUE(b.move(t, RowEvent::sent));
    EXPECT_FALSE(b.move(t, RowEvent::sent));  // in one call at a time
    EXPECT_EQ(b.state_of(t), RowState::firing);
    ASSERT_TRUE(b.move(t, RowEvent::answer_lost));
    EXPECT_FALSE(b.move(t, RowEvent::sent));  // a parked row is never sent again
    EXPECT_EQ(b.state_of(t), RowState::parked);
    EXPECT_EQ(in(b, RowState::parked), 1);
    EXPECT_EQ(b.figures().refused_moves_total, 2);
    EXPECT_NE(b.take_refusal().find("a parked row was sent"), std::string::npos);
}

// The same timer claimed again under another claim (its first claim's lease lapsed while
// parked) is another entry: settling one leaves the other.
TEST(ClaimBook, TheSameTimerUnderTwoClaimsIsTwoEntries) {
    ClaimBook b;
    const ClaimedTimer first = row("k1", "tok-1"), again = row("k1", "tok-2");
    b.enter(first);
    ASSERT_TRUE(b.move(first, RowEvent::answer_lost));
    b.enter(again);
    EXPECT_EQ(b.size(), 2u);
    EXPECT_TRUE(b.move(first, RowEvent::settled));
    EXPECT_EQ(b.state_of(again), RowState::claimed);
    EXPECT_EQ(b.figures().refused_moves_total, 0);
    // Entering the same claim's row twice is refused and changes nothing.
    b.enter(again);
    EXPECT_EQ(b.figures().refused_moves_total, 1);
    EXPECT_EQ(in(b, RowState::claimed), 1);
}

// Rows whose names concatenate alike are distinct (NUL cannot be in a text value), empty
// names included, and come back whole, however long.
TEST(ClaimBook, NamesThatConcatenateAlikeAreDistinct) {
    auto r = [](std::string tenant, std::string queue, std::string key, std::string token) {
        ClaimedTimer t;
        t.tenant = std::move(tenant);
        t.queue = std::move(queue);
        t.timer_key = std::move(key);
        t.claim_token = std::move(token);
        return t;
    };
    ClaimBook b;
    // Without a separator these would all be "abct".
    b.enter(r("ab", "c", "", "t"));
    b.enter(r("a", "bc", "", "t"));
    b.enter(r("a", "b", "c", "t"));
    b.enter(r("a", "b", "", "ct"));
    b.enter(r("", "", "", ""));
    EXPECT_EQ(b.size(), 5u);
    EXPECT_EQ(b.figures().refused_moves_total, 0);
    EXPECT_TRUE(b.move(r("a", "bc", "", "t"), RowEvent::settled));
    EXPECT_FALSE(b.holds(r("a", "bc", "", "t")));
    EXPECT_TRUE(b.holds(r("ab", "c", "", "t")));
    EXPECT_FALSE(b.holds(r("a", "b", "c", "other token")));  // a row is its claim's: by token too
    const std::string long_name(300, 'x');  // past every small-string buffer
    for (int i = 0; i < 5000; ++i)
        b.enter(r(long_name, "queue-" + std::to_string(i % 7), "key-" + std::to_string(i), "tok-" + std::to_string(i)));
    size_t whole = 0;
    b.for_each([&](std::string_view tenant, std::string_view queue, std::string_view key, std::string_view tok) {
        if (tenant != long_name) return;
        const std::string i(key.substr(4));
        EXPECT_EQ(queue, "queue-" + std::to_string(std::stoi(i) % 7));
        EXPECT_EQ(tok, "tok-" + i);
        ++whole;
    });
    EXPECT_EQ(whole, 5000u);
    EXPECT_EQ(in(b, RowState::claimed), 5004);
    b.settle_all();
    EXPECT_TRUE(b.empty());
    EXPECT_EQ(in(b, RowState::claimed), 0);
}
