// Issue 8 through the C ABI against real servers: a stop stays bounded while the
// server is frozen (SIGSTOP: a blocking PQcancel once held stop for 20-29 s), and a
// loop that dies of an internal error says so in stats, metrics and the log.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "db.hpp"
#include "helpers.hpp"
#include "queen_sweeper.h"
#include "sweeper/sweeper.hpp"

using namespace std::chrono;
using testhelp::metrics_of;
using testhelp::stats_of;
using testhelp::wait_for;

namespace {

queen_sweeper *make(const nlohmann::json &extra, const std::string &ci) {
    nlohmann::json cfg = {{"conninfo", ci}, {"read_env", false}, {"broker_id", "hardening"},
                          {"log_stderr", false}};
    cfg.update(extra);
    queen_sweeper *sw = nullptr;
    EXPECT_EQ(queen_sweeper_create(cfg.dump().c_str(), &sw), 0) << queen_sweeper_last_error();
    return sw;
}

struct PrivateCluster {
    std::string dir, ci;
    PrivateCluster() {
        char tmpl[] = "/tmp/queen-harden-XXXXXX";
        if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp");
        dir = tmpl;
        const std::string env = testdb::run(testdb::pg_script() + " start " + dir);
        auto p = env.find("QUEEN_TEST_CONNINFO='");
        if (p == std::string::npos) throw std::runtime_error("no conninfo from tests/pg");
        ci = env.substr(p + 21, env.find('\'', p + 21) - (p + 21));
    }
    ~PrivateCluster() {
        thaw();
        try {
            testdb::run(testdb::pg_script() + " stop " + dir);
        } catch (...) {
        }
    }
    // Every process of this cluster (and no other): the postmaster and its children.
    std::string pids() {
        std::ifstream f(dir + "/data/postmaster.pid");
        std::string pm;
        std::getline(f, pm);
        if (pm.empty()) return "";
        std::string kids;
        try {
            kids = testdb::run("pgrep -P " + pm + " | tr '\\n' ' '");
        } catch (...) {
        }
        return pm + " " + kids;
    }
    void freeze() { testdb::run("kill -STOP " + pids()); frozen = true; }
    void thaw() {
        if (!frozen) return;
        try {
            testdb::run("kill -CONT " + pids());
        } catch (...) {
        }
        frozen = false;
    }
    bool frozen = false;
};

}  // namespace

// The server freezes with a call in flight and past its deadline (the cancel goes to a
// frozen postmaster): stop(timeout) still returns within timeout + 1 s.
TEST(Hardening, StopIsBoundedWhileTheServerIsFrozen) {
    PrivateCluster pg;
    for (int64_t timeout_ms : {2000, 300}) {
        queen_sweeper *sw = make({{"apply_schema", true}, {"sweeper_max_sleep_ms", 50},
                                  {"sweeper_idle_max_sleep_ms", 50}, {"stmt_timeout_ms", 400}},
                                 pg.ci);
        ASSERT_EQ(queen_sweeper_start(sw), 0);
        ASSERT_TRUE(wait_for([&] { return stats_of(sw)["cycles_total"].get<int64_t>() >= 2; }, 30000))
            << stats_of(sw).dump();
        pg.freeze();
        // Long enough for calls to hang, pass their 400 ms deadline and send their cancels
        // to the frozen postmaster, and for replacement connects to hang too.
        std::this_thread::sleep_for(milliseconds(1200));
        const auto t0 = steady_clock::now();
        const int rc = queen_sweeper_stop(sw, static_cast<uint32_t>(timeout_ms));
        const auto took = duration_cast<milliseconds>(steady_clock::now() - t0).count();
        pg.thaw();
        std::printf("[hardening] frozen server: stop(%lld) returned %d after %lld ms\n",
                    static_cast<long long>(timeout_ms), rc, static_cast<long long>(took));
        EXPECT_TRUE(rc == 0 || rc == QUEEN_SWEEPER_ETIMEDOUT) << rc;
        // The contract is timeout + 1 s; the slack on top is only for a loaded machine's
        // scheduler. Before the fix this took 20-29 s.
        EXPECT_LT(took, timeout_ms + 1000 + 2000);
        auto st = stats_of(sw);
        EXPECT_EQ(st["state"], "stopped");
        EXPECT_EQ(st["loop_close_rc"], 0);
        EXPECT_EQ(st["teardown_clean"], true);
        queen_sweeper_destroy(&sw);
    }
}

// A cycle that throws is contained: counted (cycle_crashes_total, errors_total of the
// fire, last_error), and the loop goes on: it fires a timer scheduled afterwards.
TEST(Hardening, ACycleThatThrowsIsContainedAndTheLoopGoesOn) {
    testdb::ensure_schema();
    queen_sweeper *sw = make({{"sweeper_max_sleep_ms", 50}, {"sweeper_backoff_min_ms", 50}}, testdb::conninfo());
    qsw::g_test_fail_next_cycle.store(true);
    ASSERT_EQ(queen_sweeper_start(sw), 0);
    ASSERT_TRUE(wait_for([&] { return stats_of(sw)["cycle_crashes_total"] == 1; }, 20000)) << stats_of(sw).dump();
    ASSERT_TRUE(wait_for([&] { return stats_of(sw)["cycles_total"].get<int64_t>() >= 3; }, 20000))
        << stats_of(sw).dump();
    auto st = stats_of(sw);
    EXPECT_EQ(st["state"], "running");
    EXPECT_EQ(st["loop_failures_total"], 0);
    EXPECT_NE(st["last_error"].get<std::string>().find("injected internal error"), std::string::npos)
        << st["last_error"];
    EXPECT_GE(st["cycle_errors_total"].get<int64_t>(), 1);
    EXPECT_NE(metrics_of(sw).find("queen_sweeper_cycle_crashes_total 1"), std::string::npos);
    EXPECT_EQ(queen_sweeper_stop(sw, 5000), 0);
    queen_sweeper_destroy(&sw);
}

// A loop that ends (it cannot run at all: its own libuv failures) is not "running":
// stats, metrics and the log say so.
TEST(Hardening, ALoopThatDiesSaysSo) {
    testdb::ensure_schema();
    struct Heard {
        std::mutex mu;
        std::vector<std::string> lines;
    } heard;
    queen_sweeper *sw = make({{"sweeper_max_sleep_ms", 50}}, testdb::conninfo());
    queen_sweeper_set_log_callback(
        sw,
        [](void *u, int level, const char *m) {
            auto *h = static_cast<Heard *>(u);
            std::lock_guard<std::mutex> g(h->mu);
            if (level == QUEEN_SWEEPER_LOG_ERROR) h->lines.emplace_back(m);
        },
        &heard);
    qsw::g_test_fail_loop.store(true);
    ASSERT_EQ(queen_sweeper_start(sw), 0);
    ASSERT_TRUE(wait_for([&] { return stats_of(sw)["state"] == "failed"; }, 20000)) << stats_of(sw).dump();
    auto st = stats_of(sw);
    EXPECT_NE(st["last_error"].get<std::string>().find("injected loop failure"), std::string::npos)
        << st["last_error"];
    EXPECT_EQ(st["loop_failures_total"], 1);
    const std::string m = metrics_of(sw);
    EXPECT_NE(m.find("loop_failures_total"), std::string::npos);
    {
        std::lock_guard<std::mutex> g(heard.mu);
        bool said = false;
        for (auto &l : heard.lines) said = said || l.find("internal error") != std::string::npos;
        EXPECT_TRUE(said) << "the host's log callback did not hear the loop die";
    }
    EXPECT_EQ(queen_sweeper_stop(sw, 5000), 0);
    st = stats_of(sw);
    EXPECT_EQ(st["state"], "failed");  // still says so after the stop
    EXPECT_EQ(st["loop_close_rc"], 0);
    queen_sweeper_destroy(&sw);
}

namespace {

// What a callback saw when it called back into the library.
struct Reentry {
    queen_sweeper *sw = nullptr;
    std::atomic<int> calls{0};
    std::atomic<int> stop_rc{1}, start_rc{1}, setcb_rc{1}, ready_rc{1};
    std::atomic<long long> worst_ms{0};
    std::atomic<bool> stats_ok{false};
    void probe_all() {
        const auto t0 = steady_clock::now();
        stop_rc = queen_sweeper_stop(sw, 10000);
        start_rc = queen_sweeper_start(sw);
        setcb_rc = queen_sweeper_set_fired_callback(sw, nullptr, nullptr);
        ready_rc = queen_sweeper_wait_ready(sw, 10000);
        queen_sweeper *copy = sw;
        queen_sweeper_destroy(&copy);  // ignored from a callback: copy stays as it was
        if (copy != sw) stop_rc = -999;
        char buf[64];
        stats_ok = queen_sweeper_stats(sw, buf, sizeof buf) > 0;
        queen_sweeper_wake(sw, 0);
        const long long ms = duration_cast<milliseconds>(steady_clock::now() - t0).count();
        if (ms > worst_ms) worst_ms = ms;
        ++calls;
    }
};

}  // namespace

// Lifecycle calls from inside callbacks return ESTATE at once: stop from on_log during
// start once deadlocked, from on_fired or the backstop it blocked for its whole timeout.
TEST(Hardening, LifecycleCallsFromInsideCallbacksReturnAtOnce) {
    testdb::ensure_schema();
    Reentry from_log;
    queen_sweeper *sw = make({{"log_level", "info"}, {"sweeper_max_sleep_ms", 50}}, testdb::conninfo());
    from_log.sw = sw;
    ASSERT_EQ(queen_sweeper_set_log_callback(
                  sw, [](void *u, int, const char *) {
                      auto *r = static_cast<Reentry *>(u);
                      if (r->calls.load() < 3) r->probe_all();
                  },
                  &from_log),
              0);
    Reentry from_backstop;
    from_backstop.sw = sw;
    queen_sweeper_backstop bs{};
    bs.struct_size = sizeof bs;
    bs.ctx = &from_backstop;
    bs.sweep = [](void *ctx, int64_t, queen_sweeper_backstop_result *res) -> int {
        auto *r = static_cast<Reentry *>(ctx);
        if (r->calls.load() < 2) r->probe_all();
        res->next_expiry_unix_ms = -1;
        return 0;
    };
    ASSERT_EQ(queen_sweeper_set_backstop(sw, &bs), 0);
    // start logs on the host thread while holding the lifecycle lock: the log callback's
    // stop must not deadlock on it.
    ASSERT_EQ(queen_sweeper_start(sw), 0);
    ASSERT_TRUE(wait_for([&] { return from_log.calls.load() >= 1 && from_backstop.calls.load() >= 1; }, 20000));
    for (Reentry *r : {&from_log, &from_backstop}) {
        EXPECT_EQ(r->stop_rc.load(), QUEEN_SWEEPER_ESTATE);
        EXPECT_EQ(r->start_rc.load(), QUEEN_SWEEPER_ESTATE);
        EXPECT_EQ(r->setcb_rc.load(), QUEEN_SWEEPER_ESTATE);
        EXPECT_EQ(r->ready_rc.load(), QUEEN_SWEEPER_ESTATE);
        EXPECT_TRUE(r->stats_ok.load());
        std::printf("[hardening] lifecycle calls from a callback took %lld ms in all\n", r->worst_ms.load());
        EXPECT_LT(r->worst_ms.load(), 5000);  // 10 s timeouts were asked for: none was waited
    }
    auto st = stats_of(sw);
    EXPECT_EQ(st["state"], "running");  // the refused stop did not stop it
    EXPECT_EQ(queen_sweeper_stop(sw, 5000), 0);
    queen_sweeper_destroy(&sw);
    EXPECT_EQ(sw, nullptr);
}
