// The sweeper's life through the C ABI, against the real database: stop while a
// query is in flight (graceful and past the timeout), stop before start, double
// stop, destroy without stop, wakes racing stop, a database that is down at
// start, and one that stops and comes back while the sweeper runs. Every test
// ends by proving a clean teardown.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include <unistd.h>

#include "db.hpp"
#include "helpers.hpp"
#include "queen_sweeper.h"
#include "sweeper/floor.hpp"

using namespace std::chrono;
using testhelp::stats_of;
using testhelp::wait_for;

namespace {

// Sweepers log in as the queen_sweeper role (least privilege); apply tests pass the superuser.
queen_sweeper *make(const std::string &extra = "", const std::string &ci = testdb::sweeper_conninfo()) {
    nlohmann::json cfg = {{"conninfo", ci}, {"read_env", false}, {"broker_id", "lifecycle"}};
    if (!extra.empty()) cfg.update(nlohmann::json::parse(extra));
    queen_sweeper *sw = nullptr;
    EXPECT_EQ(queen_sweeper_create(cfg.dump().c_str(), &sw), 0) << queen_sweeper_last_error();
    return sw;
}

void expect_clean_teardown(queen_sweeper *sw) {
    auto s = stats_of(sw);
    EXPECT_EQ(s["state"], "stopped");
    EXPECT_EQ(s["loop_close_rc"], 0);
    EXPECT_EQ(s["teardown_clean"], true);
}

}  // namespace

class Lifecycle : public ::testing::Test {
protected:
    void SetUp() override { testdb::ensure_schema(); }
};

TEST_F(Lifecycle, StopBeforeStartDoubleStopAndDestroyWithoutStop) {
    queen_sweeper *sw = make();
    EXPECT_EQ(queen_sweeper_stop(sw, 100), 0);
    EXPECT_EQ(queen_sweeper_stop(sw, 100), 0);
    EXPECT_EQ(queen_sweeper_start(sw), QUEEN_SWEEPER_ESTATE);
    queen_sweeper_destroy(&sw);
    EXPECT_EQ(sw, nullptr);

    sw = make();
    ASSERT_EQ(queen_sweeper_start(sw), 0);
    ASSERT_TRUE(wait_for([&] { return stats_of(sw)["cycles_total"].get<int64_t>() >= 1; }, 10000));
    EXPECT_EQ(queen_sweeper_stop(sw, 5000), 0);
    EXPECT_EQ(queen_sweeper_stop(sw, 5000), 0);
    expect_clean_teardown(sw);
    queen_sweeper_destroy(&sw);

    sw = make();
    ASSERT_EQ(queen_sweeper_start(sw), 0);
    queen_sweeper_destroy(&sw);  // stops first
    EXPECT_EQ(sw, nullptr);
}

TEST_F(Lifecycle, GracefulStopWaitsForTheQueryInFlight) {
    testdb::Conn locker;
    locker.exec("BEGIN");
    locker.exec("LOCK TABLE queen.log_timers IN ACCESS EXCLUSIVE MODE");
    // Its own application_name, as the test below: another test's sweeper run beside it
    // (ctest -j) blocks on the same lock, and must not pass for this one.
    const std::string app = "qs-lifecycle-graceful-" + std::to_string(::getpid());
    queen_sweeper *sw = make("", testdb::sweeper_conninfo() + " application_name=" + app);
    ASSERT_EQ(queen_sweeper_start(sw), 0);
    testdb::Conn watch;
    ASSERT_TRUE(wait_for([&] {
        return watch.count("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + app +
                           "' AND wait_event_type = 'Lock'") > 0;
    }, 10000)) << "the probe never blocked on the lock";
    // Ordering, not timing: the stop may only return after the lock was let go, so
    // `released` must be set whenever it returns (a loaded machine can delay either side).
    std::atomic<bool> released{false};
    std::thread release([&] {
        std::this_thread::sleep_for(milliseconds(500));
        released = true;
        locker.exec("COMMIT");
    });
    EXPECT_EQ(queen_sweeper_stop(sw, 60000), 0) << queen_sweeper_last_error();
    EXPECT_TRUE(released.load()) << "stop did not wait for the query in flight";
    release.join();
    expect_clean_teardown(sw);
    queen_sweeper_destroy(&sw);
}

TEST_F(Lifecycle, StopPastItsTimeoutCancelsTheQueryInFlight) {
    testdb::Conn locker;
    locker.exec("BEGIN");
    locker.exec("LOCK TABLE queen.log_timers IN ACCESS EXCLUSIVE MODE");
    // Its own application_name (the conninfo's wins over the library's fallback), so the
    // sessions counted below are this sweeper's, not another test's run beside it (ctest -j).
    const std::string app = "qs-lifecycle-cancel-" + std::to_string(::getpid());
    queen_sweeper *sw = make("", testdb::sweeper_conninfo() + " application_name=" + app);
    ASSERT_EQ(queen_sweeper_start(sw), 0);
    testdb::Conn watch;
    ASSERT_TRUE(wait_for([&] {
        return watch.count("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + app +
                           "' AND wait_event_type = 'Lock'") > 0;
    }, 10000));
    auto t0 = steady_clock::now();
    EXPECT_EQ(queen_sweeper_stop(sw, 700), QUEEN_SWEEPER_ETIMEDOUT);
    auto took = duration_cast<milliseconds>(steady_clock::now() - t0).count();
    // A generous bound: a stop that ignores its timeout waits for the lock holder, which
    // never lets go here; a loaded sanitizer build only adds seconds.
    EXPECT_LT(took, 700 + 20000) << "stop overran its timeout by far";
    std::printf("stop(700) past its timeout returned after %lld ms\n", static_cast<long long>(took));
    EXPECT_NE(std::string(queen_sweeper_last_error()).find("700 ms"), std::string::npos);
    expect_clean_teardown(sw);
    // The blocked query was cancelled on the server, not left waiting on the lock.
    EXPECT_TRUE(wait_for([&] {
        return watch.count("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + app + "'") == 0;
    }, 5000));
    locker.exec("COMMIT");
    queen_sweeper_destroy(&sw);
}

// A graceful stop hands its claims back without waiting for a walk from the index head
// (issue 36): the walk (made to last 60 s on the server, past its own 30 s deadline, by
// the test seam) is cut short, the claims go back at once, and the stop returns OK well
// inside its 15 s. A stop that waited for the walk first would run out of its 15 s, turn
// hard and leave every claim to its lease: the rows would still carry a claim token.
TEST_F(Lifecycle, GracefulStopHandsClaimsBackWithoutWaitingForAWalkFromTheHead) {
    testdb::Conn db;
    const std::string queue = "lifecycle-stopwalk-" + std::to_string(::getpid());
    db.exec("DELETE FROM queen.log_timers WHERE queue = '" + queue + "'");
    const std::string pid = db.scalar("SELECT partition_id FROM queen.log_provision_v1("
                                      "'00000000-0000-0000-0000-000000000001', '" + queue + "', 'blocked')");
    db.exec("INSERT INTO queen.log_timers (queue, timer_key, partition, deliver_at, txn, message_id, payload) "
            "SELECT '" + queue + "', 't' || g, 'blocked', now() - interval '1 minute', '" + queue +
            "-' || g, gen_random_uuid(), '\\x0102'::bytea FROM generate_series(1, 5) g");
    // The partition held: every fire into it comes back busy and the sweeper keeps its claims.
    testdb::Conn locker;
    locker.exec("BEGIN");
    locker.exec("SELECT id FROM queen.log_partitions WHERE id = " + pid + " FOR UPDATE");
    const std::string app = "qs-lifecycle-stopwalk-" + std::to_string(::getpid());
    qsw::g_test_head_walk_sleep_s.store(60);
    queen_sweeper *sw = make(R"({"sweeper_lease_ms": 60000})", testdb::sweeper_conninfo() + " application_name=" + app);
    ASSERT_EQ(queen_sweeper_start(sw), 0);
    testdb::Conn watch;
    const auto held = [&] {
        return watch.count("SELECT count(*) FROM queen.log_timers WHERE queue = '" + queue +
                           "' AND claim_token IS NOT NULL AND claimed_until > now()");
    };
    EXPECT_TRUE(wait_for([&] { return stats_of(sw)["busy_kept_segments"].get<int64_t>() >= 1 && held() == 5; },
                         15000))
        << "the sweeper never kept its claims on the held partition";
    EXPECT_TRUE(wait_for([&] {
        return watch.count("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + app +
                           "' AND state = 'active' AND query LIKE '%pg_sleep%'") > 0;
    }, 15000)) << "the walk from the head never started";
    const auto t0 = steady_clock::now();
    const int rc = queen_sweeper_stop(sw, 15000);
    const auto took = duration_cast<milliseconds>(steady_clock::now() - t0).count();
    qsw::g_test_head_walk_sleep_s.store(0);
    const long long left = held();
    std::printf("stop with a walk from the head in flight returned %d after %lld ms, %lld claim(s) left\n", rc,
                static_cast<long long>(took), left);
    EXPECT_EQ(rc, 0) << queen_sweeper_last_error();
    EXPECT_EQ(left, 0) << "claims still held after a graceful stop";
    EXPECT_EQ(watch.count("SELECT count(*) FROM queen.log_timers WHERE queue = '" + queue +
                          "' AND claim_token IS NOT NULL"),
              0);
    auto st = stats_of(sw);
    EXPECT_EQ(st["released_on_stop_total"], 5);
    EXPECT_EQ(st["fired_total"], 0);
    // Cut short by the stop: not a failure of the walk.
    EXPECT_EQ(st["floor"]["head_walk_failures_total"], 0);
    expect_clean_teardown(sw);
    // The walk's backend was cancelled, not left sleeping.
    EXPECT_TRUE(wait_for([&] {
        return watch.count("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + app + "'") == 0;
    }, 5000));
    queen_sweeper_destroy(&sw);
    locker.exec("ROLLBACK");
    db.exec("DELETE FROM queen.log_timers WHERE queue = '" + queue + "'");
}

TEST_F(Lifecycle, WakesRacingStopFromSeveralThreads) {
    for (int round = 0; round < 3; ++round) {
        queen_sweeper *sw = make();
        ASSERT_EQ(queen_sweeper_start(sw), 0);
        std::atomic<bool> go{true};
        std::vector<std::thread> ts;
        for (int i = 0; i < 4; ++i)
            ts.emplace_back([&, i] {
                int64_t at = 4102444800000LL - i;
                while (go.load()) queen_sweeper_wake(sw, at--);
            });
        std::this_thread::sleep_for(milliseconds(100 + 50 * round));
        EXPECT_EQ(queen_sweeper_stop(sw, 5000), 0);
        std::this_thread::sleep_for(milliseconds(20));  // wakes on a stopped sweeper
        go = false;
        for (auto &t : ts) t.join();
        auto s = stats_of(sw);
        EXPECT_GT(s["wakes_total"].get<int64_t>(), 1000);
        expect_clean_teardown(sw);
        queen_sweeper_destroy(&sw);
    }
}

TEST_F(Lifecycle, ADatabaseDownAtStartIsNotAStartFailure) {
    queen_sweeper *sw = make("{\"connect_timeout_ms\": 1000}", "host=127.0.0.1 port=1 dbname=x user=x");
    ASSERT_EQ(queen_sweeper_start(sw), 0) << queen_sweeper_last_error();
    ASSERT_TRUE(wait_for([&] { return stats_of(sw)["db_state"] == "down"; }, 10000)) << stats_of(sw).dump();
    auto s = stats_of(sw);
    EXPECT_FALSE(s["db_last_error"].get<std::string>().empty());
    EXPECT_GE(s["cycle_errors_total"].get<int64_t>(), 1);
    EXPECT_EQ(queen_sweeper_stop(sw, 5000), 0);
    expect_clean_teardown(sw);
    queen_sweeper_destroy(&sw);
}

TEST_F(Lifecycle, DisabledStartsNothingAndSaysSo) {
    std::vector<std::string> logs;
    queen_sweeper *sw = make("{\"sweeper\": false}");
    queen_sweeper_set_log_callback(
        sw, [](void *u, int, const char *m) { static_cast<std::vector<std::string> *>(u)->push_back(m); }, &logs);
    ASSERT_EQ(queen_sweeper_start(sw), 0);
    EXPECT_EQ(stats_of(sw)["state"], "disabled");
    ASSERT_EQ(logs.size(), 1u);
    EXPECT_NE(logs[0].find("sweeper=false"), std::string::npos);
    EXPECT_EQ(queen_sweeper_stop(sw, 100), 0);
    queen_sweeper_destroy(&sw);
}

TEST_F(Lifecycle, TheSweeperNeverTakesANonMaintSlot) {
    queen_sweeper *sw = make("{\"sweeper_max_sleep_ms\": 50, \"sweeper_idle_max_sleep_ms\": 50}");
    ASSERT_EQ(queen_sweeper_start(sw), 0);
    ASSERT_TRUE(wait_for([&] { return stats_of(sw)["cycles_total"].get<int64_t>() >= 5; }, 10000));
    ASSERT_EQ(queen_sweeper_stop(sw, 5000), 0);
    auto lanes = stats_of(sw)["pool"]["lanes"];
    EXPECT_EQ(lanes["push"]["calls_total"], 0);
    EXPECT_EQ(lanes["pop"]["calls_total"], 0);
    EXPECT_EQ(lanes["ack"]["calls_total"], 0);
    EXPECT_GE(lanes["maint"]["calls_total"].get<int64_t>(), 5);
    expect_clean_teardown(sw);
    queen_sweeper_destroy(&sw);
}

// A private cluster, so stopping it cannot disturb the other tests.
TEST_F(Lifecycle, TheDatabaseStopsAndComesBackAndTheSweeperReconnectsByItself) {
    char tmpl[] = "/tmp/queen-restart-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    // Stopped and removed however the test ends, a failed assertion included.
    struct ClusterGuard {
        std::string dir;
        ~ClusterGuard() {
            try {
                testdb::run(testdb::pg_script() + " stop " + dir);
            } catch (...) {
            }
        }
    } guard{dir};
    const std::string env = testdb::run(testdb::pg_script() + " start " + dir);
    auto p = env.find("QUEEN_TEST_CONNINFO='");
    ASSERT_NE(p, std::string::npos);
    const std::string ci = env.substr(p + 21, env.find('\'', p + 21) - (p + 21));
    std::vector<std::string> logs;
    queen_sweeper *sw = make("{\"apply_schema\": true, \"sweeper_max_sleep_ms\": 100, "
                             "\"sweeper_idle_max_sleep_ms\": 100, \"sweeper_transient_backoff_ms\": 100}",
                             ci);
    queen_sweeper_set_log_callback(
        sw, [](void *u, int, const char *m) { static_cast<std::vector<std::string> *>(u)->push_back(m); }, &logs);
    ASSERT_EQ(queen_sweeper_start(sw), 0);
    ASSERT_TRUE(wait_for([&] { return stats_of(sw)["db_state"] == "up" && stats_of(sw)["cycles_total"] >= 2; }, 20000));
    const int64_t connects = stats_of(sw)["pool"]["connects_total"];
    testdb::run(testdb::pg_script() + " halt " + dir);
    EXPECT_TRUE(wait_for([&] { return stats_of(sw)["db_state"] == "down"; }, 15000)) << stats_of(sw).dump();
    const int64_t errors_while_down = stats_of(sw)["cycle_errors_total"];
    EXPECT_GE(errors_while_down, 1);
    testdb::run(testdb::pg_script() + " resume " + dir);
    EXPECT_TRUE(wait_for([&] { return stats_of(sw)["db_state"] == "up"; }, 20000)) << stats_of(sw).dump();
    const int64_t cycles = stats_of(sw)["cycles_total"];
    EXPECT_TRUE(wait_for([&] { return stats_of(sw)["cycles_total"].get<int64_t>() >= cycles + 3; }, 10000));
    EXPECT_GT(stats_of(sw)["pool"]["connects_total"].get<int64_t>(), connects);
    EXPECT_EQ(queen_sweeper_stop(sw, 5000), 0);
    expect_clean_teardown(sw);
    queen_sweeper_destroy(&sw);
    bool said_down = false, said_up = false;
    for (auto &l : logs) {
        said_down = said_down || l.find("database unavailable") != std::string::npos;
        said_up = said_up || l.find("database connection up") != std::string::npos;
    }
    EXPECT_TRUE(said_down && said_up) << "the logs did not say what happened";
}
