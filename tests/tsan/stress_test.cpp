// Many host threads against running sweepers, as a broker does it: while two sweepers fire
// a few thousand timers from a real PostgreSQL, eight host threads call wake, stats and
// metrics without pause, two more push to and pop from the ephemeral engine the sweepers
// use as their backstop, and the sweepers are stopped while all of that continues. Built
// in every configuration; its point is the ThreadSanitizer build (QUEEN_SWEEPER_TSAN) and
// the ASan/LSan build, where a race, a use-after-free or a leak on these paths fails it.
//
// Asserts: every timer reaches the log exactly once (counted from the log itself, since
// any other sweeper on the same database may fire some of them), both stops are clean,
// and the host threads saw well-formed stats and metrics throughout.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "db.hpp"
#include "queen_ephemeral.h"
#include "queen_sweeper.h"

using namespace std::chrono;

namespace {

// A tenant of its own: the log rows counted below are this test's only.
const char *const kTenant = "00000000-0000-0000-0000-00000000f7e5";

int env_int(const char *name, int fallback) {
    const char *v = std::getenv(name);
    return v && *v ? std::atoi(v) : fallback;
}

// The roles tests/pg creates: sweepers run as the sweeper role and timers are scheduled as
// the broker role, as in production; the superuser only sets up and counts.
std::string role_conninfo(const char *var) {
    const char *v = std::getenv(var);
    return v && *v ? std::string(v) : testdb::conninfo();
}

int64_t unix_ms() {
    return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::string read_text(int64_t (*fn)(queen_sweeper *, char *, size_t), queen_sweeper *sw) {
    std::string s(2048, '\0');
    for (;;) {
        const int64_t n = fn(sw, s.data(), s.size());
        if (n < 0) return {};
        if (static_cast<size_t>(n) < s.size()) {
            s.resize(static_cast<size_t>(n));
            return s;
        }
        s.assign(static_cast<size_t>(n) + 1024, '\0');
    }
}

nlohmann::json stats(queen_sweeper *sw) {
    return nlohmann::json::parse(read_text(queen_sweeper_stats, sw));
}

template <class F> bool wait_for(F f, seconds limit) {
    const auto end = steady_clock::now() + limit;
    while (steady_clock::now() < end) {
        if (f()) return true;
        std::this_thread::sleep_for(milliseconds(50));
    }
    return f();
}

struct FiredCount {
    std::atomic<int64_t> timers{0};
    std::atomic<int64_t> calls{0};
};

void on_fired(void *user, const char *, const char *, const char *, uint32_t count, int64_t) {
    auto *f = static_cast<FiredCount *>(user);
    f->timers.fetch_add(count, std::memory_order_relaxed);
    f->calls.fetch_add(1, std::memory_order_relaxed);
}

void on_log(void *, int, const char *) {}

// Schedules `n` timers for kTenant over `queues` queues of four partitions, due across
// the next `spread_ms`; returns once every op came back "scheduled".
void schedule(testdb::Conn &db, const std::string &prefix, int n, int queues, int spread_ms) {
    std::mt19937 rng(20261130);
    for (int base = 0; base < n; base += 200) {
        nlohmann::json ops = nlohmann::json::array();
        for (int i = base; i < std::min(n, base + 200); ++i) {
            ops.push_back({{"op", "schedule"},
                           {"queue", prefix + "-q" + std::to_string(i % queues)},
                           {"partition", "p" + std::to_string(i % 4)},
                           {"timerKey", "k" + std::to_string(i)},
                           {"txn", prefix + "-txn-" + std::to_string(i)},
                           {"delayMs", static_cast<int>(rng() % static_cast<unsigned>(spread_ms))},
                           {"payload", "cGF5bG9hZA=="}});
        }
        const std::string res = db.scalar("SELECT queen.log_timers_apply_v1('" + ops.dump() +
                                          "'::jsonb, '" + kTenant + "'::uuid, NULL, now())");
        const auto statuses = nlohmann::json::parse(res);
        ASSERT_EQ(statuses.size(), ops.size()) << res;
        for (const auto &s : statuses) ASSERT_EQ(s.value("status", ""), "scheduled") << s.dump();
    }
}

}  // namespace

TEST(ThreadStress, HostThreadsHammerWakeStatsMetricsWhileTimersFireAndSweepersStop) {
    testdb::ensure_schema();
    const int n = env_int("QUEEN_STRESS_TIMERS", 3000);
    const std::string prefix = "stress-" + std::to_string(unix_ms());
    testdb::Conn db;
    testdb::Conn broker(role_conninfo("QUEEN_TEST_BROKER_CONNINFO"));

    queen_ephemeral *engine = nullptr;
    ASSERT_EQ(queen_ephemeral_create(nullptr, &engine), QUEEN_EPHEMERAL_OK);
    queen_sweeper_backstop provider{};
    ASSERT_EQ(queen_ephemeral_backstop(engine, &provider, sizeof provider), QUEEN_EPHEMERAL_OK);

    FiredCount fired[2];
    queen_sweeper *sw[2] = {nullptr, nullptr};
    for (int k = 0; k < 2; ++k) {
        nlohmann::json cfg = {{"conninfo", role_conninfo("QUEEN_TEST_SWEEPER_CONNINFO")}, {"read_env", false},
                              {"broker_id", prefix + "-b" + std::to_string(k)},
                              {"sweeper_min_sleep_ms", 5}, {"sweeper_max_sleep_ms", 200},
                              {"sweeper_claim_batch", 50}, {"log_level", "debug"}};
        ASSERT_EQ(queen_sweeper_create(cfg.dump().c_str(), &sw[k]), 0) << queen_sweeper_last_error();
        ASSERT_EQ(queen_sweeper_set_log_callback(sw[k], on_log, nullptr), 0);
        ASSERT_EQ(queen_sweeper_set_fired_callback(sw[k], on_fired, &fired[k]), 0);
        // The engine backs one sweeper only: a provider is driven by one loop.
        if (k == 0) {
            ASSERT_EQ(queen_sweeper_set_backstop(sw[k], &provider), 0);
        }
    }

    std::atomic<bool> done{false};
    std::atomic<int64_t> calls{0}, bad_stats{0}, bad_metrics{0};
    std::vector<std::thread> hosts;
    for (int t = 0; t < 8; ++t) {
        hosts.emplace_back([&, t] {
            std::mt19937_64 rng(static_cast<uint64_t>(t) * 7919 + 1);
            while (!done.load(std::memory_order_relaxed)) {
                queen_sweeper *s = sw[rng() % 2];
                switch (rng() % 4) {
                case 0:
                case 1: {
                    // Instants around now, some already past, some far ahead.
                    const int64_t jitter = static_cast<int64_t>(rng() % 20000) - 5000;
                    queen_sweeper_wake(s, unix_ms() + jitter);
                    break;
                }
                case 2: {
                    const std::string text = read_text(queen_sweeper_stats, s);
                    if (!nlohmann::json::accept(text)) bad_stats.fetch_add(1);
                    break;
                }
                case 3: {
                    const std::string text = read_text(queen_sweeper_metrics, s);
                    if (text.find("# TYPE") == std::string::npos) bad_metrics.fetch_add(1);
                    break;
                }
                }
                calls.fetch_add(1, std::memory_order_relaxed);
                if (t % 2 == 0) std::this_thread::yield();
            }
        });
    }
    std::atomic<int64_t> popped{0};
    for (int t = 0; t < 2; ++t) {
        hosts.emplace_back([&, t] {
            const std::string part = "p" + std::to_string(t);
            std::string payload(64, 'x');
            queen_ephemeral_message m{};
            m.struct_size = sizeof m;
            while (!done.load(std::memory_order_relaxed)) {
                queen_ephemeral_push(engine, "stress", part.c_str(), payload.data(), payload.size(),
                                     unix_ms(), nullptr);
                // A short lease that is sometimes left to lapse: the backstop's sweep, on the
                // sweeper's loop thread, redelivers it while this thread pops again.
                if (queen_ephemeral_pop(engine, "stress", part.c_str(), "g", 20, unix_ms(), &m) ==
                    QUEEN_EPHEMERAL_OK) {
                    popped.fetch_add(1, std::memory_order_relaxed);
                    if (m.offset % 3 != 0)
                        queen_ephemeral_ack(engine, "stress", part.c_str(), "g", m.offset,
                                            m.lease_id, QUEEN_EPHEMERAL_ACK_COMPLETED, unix_ms());
                    queen_ephemeral_message_free(&m);
                }
                std::this_thread::sleep_for(microseconds(200));
            }
        });
    }

    for (int k = 0; k < 2; ++k) ASSERT_EQ(queen_sweeper_start(sw[k]), 0) << queen_sweeper_last_error();
    ASSERT_NO_FATAL_FAILURE(schedule(broker, prefix, n, 6, 3000));

    const std::string in_log = "SELECT coalesce(sum(s.count), 0) FROM queen.log_segments s"
                               " JOIN queen.log_partitions p ON p.id = s.partition_id"
                               " JOIN queen.queues q ON q.id = p.queue_id"
                               " WHERE q.tenant_id = '" + std::string(kTenant) +
                               "' AND q.name LIKE '" + prefix + "-%'";
    // Generous: a sanitizer build on a loaded two-core machine is many times slower.
    const bool drained = wait_for([&] { return db.count(in_log) >= n; }, seconds(600));

    // Stop both while the host threads keep calling: wake, stats and metrics race the stop.
    EXPECT_EQ(queen_sweeper_stop(sw[0], 30000), 0) << queen_sweeper_last_error();
    std::this_thread::sleep_for(milliseconds(200));
    EXPECT_EQ(queen_sweeper_stop(sw[1], 30000), 0) << queen_sweeper_last_error();
    std::this_thread::sleep_for(milliseconds(200));
    done = true;
    for (auto &h : hosts) h.join();

    ASSERT_TRUE(drained) << "timers in the log: " << db.count(in_log) << " of " << n;
    // n frames in the log, none left in log_timers, none dead-lettered: each of the n timers
    // left the table into the log, so a duplicate would have to leave another one missing.
    const std::string ours_where = " WHERE tenant_id = '" + std::string(kTenant) +
                                   "' AND queue LIKE '" + prefix + "-%'";
    EXPECT_EQ(db.count(in_log), n) << "a timer reached the log more than once";
    EXPECT_EQ(db.count("SELECT count(*) FROM queen.log_timers" + ours_where), 0);
    EXPECT_EQ(db.count("SELECT count(*) FROM queen.log_dlq" + ours_where), 0);
    EXPECT_EQ(bad_stats.load(), 0);
    EXPECT_EQ(bad_metrics.load(), 0);
    EXPECT_GT(popped.load(), 0);

    int64_t ours = 0;
    for (int k = 0; k < 2; ++k) {
        const auto s = stats(sw[k]);
        EXPECT_EQ(s["state"], "stopped");
        EXPECT_EQ(s["teardown_clean"], true);
        ours += s["fired_total"].get<int64_t>();
    }
    const int64_t cb = fired[0].timers.load() + fired[1].timers.load();
    EXPECT_EQ(cb, ours) << "on_fired counts and fired_total disagree";
    std::printf("thread stress: %d timers scheduled, %lld fired by these two sweepers "
                "(fired_total), %lld host calls, %lld ephemeral pops\n",
                n, static_cast<long long>(ours), static_cast<long long>(calls.load()),
                static_cast<long long>(popped.load()));
    for (int k = 0; k < 2; ++k) queen_sweeper_destroy(&sw[k]);
    queen_ephemeral_destroy(&engine);
}
