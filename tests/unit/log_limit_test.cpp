// Both ends of the log de-duplication (base/log_limit.hpp): a repeating failure is said at
// once, then once per cause per interval with the count left out.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/log_limit.hpp"

using qsw::kLogRepeatIntervalMs;
using qsw::log_cause;
using qsw::log_gate_flush;
using qsw::log_gate_step;
using qsw::LogGate;
using qsw::LogLimiter;
using qsw::repeated_suffix;

TEST(LogGate, TheFirstOccurrenceIsSaidAtOnce) {
    auto s = log_gate_step(LogGate{}, 5);
    EXPECT_TRUE(s.emit);
    EXPECT_EQ(s.repeated, 0);
    EXPECT_EQ(s.next.window_start_ms, 5);
    EXPECT_EQ(s.next.suppressed, 0);
}

TEST(LogGate, WithinTheIntervalOccurrencesAreCountedNotSaid) {
    LogGate g{1000, 0};
    auto s = log_gate_step(g, 1000);
    EXPECT_FALSE(s.emit);
    EXPECT_EQ(s.next.suppressed, 1);
    s = log_gate_step(s.next, 1000 + kLogRepeatIntervalMs - 1);  // the last instant inside
    EXPECT_FALSE(s.emit);
    EXPECT_EQ(s.next.suppressed, 2);
    EXPECT_EQ(s.next.window_start_ms, 1000);
}

TEST(LogGate, AtTheIntervalsEndTheNextOccurrenceIsSaidWithTheCount) {
    LogGate g{1000, 27};
    auto s = log_gate_step(g, 1000 + kLogRepeatIntervalMs);
    EXPECT_TRUE(s.emit);
    EXPECT_EQ(s.repeated, 27);
    EXPECT_EQ(s.over_ms, kLogRepeatIntervalMs);
    EXPECT_EQ(s.next.window_start_ms, 1000 + kLogRepeatIntervalMs);
    EXPECT_EQ(s.next.suppressed, 0);
}

TEST(LogGate, AClockGoneBackOpensANewIntervalRatherThanSilencingTheCause) {
    auto s = log_gate_step(LogGate{50000, 3}, 100);
    EXPECT_TRUE(s.emit);
    EXPECT_EQ(s.repeated, 3);
    EXPECT_EQ(s.over_ms, 0);
}

TEST(LogGateFlush, SaysTheCountOnceTheIntervalEndsEvenIfTheFaultStopped) {
    EXPECT_FALSE(log_gate_flush(LogGate{}, 99999).emit);                                // never seen
    EXPECT_FALSE(log_gate_flush(LogGate{1000, 0}, 1000 + kLogRepeatIntervalMs).emit);   // nothing left out
    EXPECT_FALSE(log_gate_flush(LogGate{1000, 5}, 1000 + kLogRepeatIntervalMs - 1).emit);  // not yet
    auto s = log_gate_flush(LogGate{1000, 5}, 1000 + kLogRepeatIntervalMs);
    EXPECT_TRUE(s.emit);
    EXPECT_EQ(s.repeated, 5);
    EXPECT_EQ(s.next.suppressed, 0);
    EXPECT_EQ(s.next.window_start_ms, 1000 + kLogRepeatIntervalMs);
}

TEST(LogCause, IsPhaseSqlstateAndTheMessageWithoutDigits) {
    EXPECT_EQ(log_cause("fire", "53100", "could not extend file \"base/16384/2619.3\": No space"),
              "fire|53100|could not extend file \"base//.\": No space");
    EXPECT_EQ(log_cause("fire", "", "fire of 12 timer(s)"), log_cause("fire", "", "fire of 13 timer(s)"));
    EXPECT_NE(log_cause("fire", "53100", "x"), log_cause("claim", "53100", "x"));
    EXPECT_NE(log_cause("fire", "53100", "x"), log_cause("fire", "57014", "x"));
    EXPECT_EQ(log_cause("", "", ""), "||");
}

TEST(RepeatedSuffix, NamesTheCountAndTheSpan) {
    EXPECT_EQ(repeated_suffix(0, 10000), "");
    EXPECT_EQ(repeated_suffix(-1, 10000), "");
    EXPECT_EQ(repeated_suffix(1, 10000), " (repeated 1 time in the last 10s)");
    EXPECT_EQ(repeated_suffix(279, 10001), " (repeated 279 times in the last 11s)");
}

TEST(LogLimiter, ThirtyFailuresASecondForAMinuteMakeSixLinesAndCountTheRest) {
    LogLimiter lim;
    std::vector<std::string> lines;
    int64_t t = 0, said_at_once = 0;
    for (int i = 0; i < 30 * 60; ++i, t += 33) {
        auto l = lim.occur(1, "fire|53100|disk full", "fire of " + std::to_string(i) + " timer(s) failed", t);
        if (l.emit) lines.push_back(l.text), ++said_at_once;
        lim.flush(t, [&](int, const std::string &s) { lines.push_back(s); });
    }
    ASSERT_GE(lines.size(), 6u);
    ASSERT_LE(lines.size(), 7u);
    EXPECT_EQ(lines[0], "fire of 0 timer(s) failed");
    EXPECT_NE(lines[1].find("(repeated "), std::string::npos) << lines[1];
    EXPECT_EQ(lim.suppressed_total(), 30 * 60 - said_at_once);
}

TEST(LogLimiter, CausesAreApartAndAQuietCauseIsForgotten) {
    LogLimiter lim;
    EXPECT_TRUE(lim.occur(1, "a", "a", 0).emit);
    EXPECT_TRUE(lim.occur(1, "b", "b", 0).emit);  // another cause is said at once too
    EXPECT_FALSE(lim.occur(1, "a", "a", 1).emit);
    std::vector<std::pair<int, std::string>> out;
    lim.flush(kLogRepeatIntervalMs, [&](int lvl, const std::string &s) { out.emplace_back(lvl, s); });
    ASSERT_EQ(out.size(), 1u);  // only "a" left something out
    EXPECT_EQ(out[0].first, 1);
    EXPECT_EQ(out[0].second, "a (repeated 1 time in the last 10s)");
    out.clear();
    lim.flush(3 * kLogRepeatIntervalMs, [&](int lvl, const std::string &s) { out.emplace_back(lvl, s); });
    EXPECT_TRUE(out.empty());
    // Forgotten: its next occurrence is a first one again, said at once without a count.
    auto l = lim.occur(1, "a", "a", 3 * kLogRepeatIntervalMs + 1);
    EXPECT_TRUE(l.emit);
    EXPECT_EQ(l.text, "a");
}
