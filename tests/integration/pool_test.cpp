// The pool and its admission lanes against the real database: more concurrent
// calls than connections and than slots, failing calls, calls past their
// deadline and a connection killed mid-call, in every pool/slot shape we can
// force; nothing deadlocks, every call completes, and no call ever waits for a
// connection without holding its slot.
#include <gtest/gtest.h>
#include <uv.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "db.hpp"
#include "pg/pool.hpp"

using namespace qsw;

namespace {

struct Outcome {
    int ok = 0, failed = 0, deadline = 0, syntax = 0, terminated = 0;
    std::vector<int> order;
};

struct Harness {
    uv_loop_t loop{};
    Logger log;
    std::unique_ptr<Pool> pool;
    uv_timer_t watchdog{};
    bool timed_out = false;

    Harness(int pool_size, std::array<int, kLaneCount> slots, int64_t stmt_timeout_ms = 5000) {
        EXPECT_EQ(uv_loop_init(&loop), 0);
        PoolOptions o;
        o.conninfo = testdb::conninfo();
        o.pool_size = pool_size;
        o.lane_slots = slots;
        o.stmt_timeout_ms = stmt_timeout_ms;
        pool = std::make_unique<Pool>(&loop, o, log);
        uv_timer_init(&loop, &watchdog);
        watchdog.data = this;
    }
    // Runs until `finished` says so; the watchdog turns a deadlock into a failure.
    void run_until_done(int64_t limit_ms) {
        uv_timer_start(&watchdog, [](uv_timer_t *t) {
            auto *h = static_cast<Harness *>(t->data);
            h->timed_out = true;
            uv_stop(t->loop);
        }, static_cast<uint64_t>(limit_ms), 0);
        uv_run(&loop, UV_RUN_DEFAULT);
    }
    void finish() {
        uv_timer_stop(&watchdog);
        pool->shutdown("test done");
        pool->drain_posted();
        pool->close_handles();
        uv_close(reinterpret_cast<uv_handle_t *>(&watchdog), nullptr);
    }
    ~Harness() {
        uv_run(&loop, UV_RUN_DEFAULT);
        EXPECT_EQ(uv_loop_close(&loop), 0) << "a handle was left open";
    }
};

Query sql(const std::string &text, int64_t timeout_ms = 5000) {
    Query q;
    q.sql = text;
    q.timeout_ms = timeout_ms;
    return q;
}

}  // namespace

TEST(Pool, MoreCallsThanConnectionsAndSlotsAllCompleteInEveryShape) {
    for (int pool_size : {1, 2, 3}) {
        for (int maint : {1, 2, 5}) {
            SCOPED_TRACE("pool_size=" + std::to_string(pool_size) + " maint_slots=" + std::to_string(maint));
            Harness h(pool_size, {1, 2, 1, maint});
            h.pool->start();
            const int n = 48;
            int done = 0;
            Outcome out;
            bool invariant_ok = true;
            for (int i = 0; i < n; ++i) {
                const Lane lane = static_cast<Lane>(i % kLaneCount);
                Query q;
                switch (i % 4) {
                case 0: q = sql("SELECT 1"); break;
                case 1: q = sql("SELECT pg_sleep(0.005)"); break;
                case 2: q = sql("SELEC broken"); break;
                default: q = sql("SELECT pg_sleep(0.002), " + std::to_string(i)); break;
                }
                h.pool->call(lane, std::move(q), [&, i](PgResult r) {
                    ++done;
                    out.order.push_back(i);
                    if (r.ok) ++out.ok;
                    else {
                        ++out.failed;
                        if (r.sqlstate == "42601") ++out.syntax;
                    }
                    // Every call waiting for a connection holds a slot.
                    PoolFigures f = h.pool->figures();
                    int held = 0;
                    for (int l = 0; l < kLaneCount; ++l) {
                        held += f.slots_in_use[l];
                        if (f.slots_in_use[l] > f.slots[l]) invariant_ok = false;
                    }
                    if (f.waiting_for_connection > held) invariant_ok = false;
                    if (done == n) h.finish();
                });
            }
            h.run_until_done(30000);
            EXPECT_FALSE(h.timed_out) << "deadlock: " << done << " of " << n << " calls completed";
            EXPECT_EQ(done, n);
            EXPECT_EQ(out.syntax, n / 4);
            EXPECT_EQ(out.ok, n - n / 4);
            EXPECT_TRUE(invariant_ok) << "a call waited for a connection without a slot, or a lane overflowed";
        }
    }
}

TEST(Pool, AdmissionIsFirstComeFirstServedWithinALane) {
    Harness h(1, {1, 1, 1, 1});
    h.pool->start();
    std::vector<int> order;
    for (int i = 0; i < 6; ++i) {
        h.pool->call(Lane::maint, sql("SELECT pg_sleep(0.01)"), [&, i](PgResult r) {
            EXPECT_TRUE(r.ok) << r.message;
            order.push_back(i);
            if (order.size() == 6) h.finish();
        });
    }
    h.run_until_done(20000);
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST(Pool, ACallPastItsDeadlineIsCancelledOnTheServerAndItsConnectionReplaced) {
    Harness h(1, {1, 1, 1, 2}, 5000);
    h.pool->start();
    PgResult slow, after;
    int done = 0;
    int pid_before = 0;
    h.pool->call(Lane::maint, sql("SELECT pg_backend_pid()"), [&](PgResult r) {
        ASSERT_TRUE(r.ok) << r.message;
        pid_before = std::stoi(r.get(0, 0));
        h.pool->call(Lane::maint, sql("SELECT pg_sleep(30)", 300), [&](PgResult r2) {
            slow = r2;
            ++done;
            h.pool->call(Lane::maint, sql("SELECT pg_backend_pid()"), [&](PgResult r3) {
                after = r3;
                ++done;
                h.finish();
            });
        });
    });
    h.run_until_done(20000);
    ASSERT_EQ(done, 2);
    EXPECT_FALSE(slow.ok);
    EXPECT_NE(slow.message.find("deadline"), std::string::npos) << slow.message;
    ASSERT_TRUE(after.ok) << after.message;
    EXPECT_NE(std::stoi(after.get(0, 0)), pid_before) << "a timed-out connection was reused";
    EXPECT_EQ(h.pool->figures().deadline_cancels_total, 1);
    // The server-side query is gone: cancelled, not left running for 30 s.
    testdb::Conn c;
    bool gone = false;
    for (int i = 0; i < 50 && !gone; ++i) {
        gone = c.count("SELECT count(*) FROM pg_stat_activity WHERE pid = " + std::to_string(pid_before) +
                       " AND state = 'active'") == 0;
        if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_TRUE(gone) << "the backend still runs the cancelled query";
}

// Every call runs in BEGIN ... COMMIT with the session pinned. A call that fails inside its
// block leaves the block aborted (a Sync does not end it): the session is rolled back and
// handed out again, not replaced; and a call that succeeds sends nothing after its COMMIT
// (until schema 31's release a ROLLBACK followed every call in the same round trip, and the
// server logged "there is no transaction in progress" once per call).
TEST(Pool, AFailedPinnedCallIsRolledBackOnItsSessionAndASuccessfulOneLogsNothing) {
    Harness h(1, {1, 1, 1, 2});
    h.pool->start();
    int pid_before = 0, pid_after = 0, done = 0;
    PgResult failed;
    std::function<void(int)> ok_calls = [&](int left) {
        if (left == 0) {
            h.pool->call(Lane::maint, sql("SELECT 1/0"), [&](PgResult r) {
                failed = r;
                h.pool->call(Lane::maint, sql("SELECT pg_backend_pid()"), [&](PgResult r2) {
                    EXPECT_TRUE(r2.ok) << r2.message;
                    if (r2.ok) pid_after = std::stoi(r2.get(0, 0));
                    h.finish();
                });
            });
            return;
        }
        h.pool->call(Lane::maint, sql("SELECT pg_backend_pid()"), [&, left](PgResult r) {
            EXPECT_TRUE(r.ok) << r.message;
            if (r.ok) pid_before = std::stoi(r.get(0, 0));
            ++done;
            ok_calls(left - 1);
        });
    };
    ok_calls(20);
    h.run_until_done(20000);
    ASSERT_FALSE(h.timed_out);
    EXPECT_EQ(done, 20);
    EXPECT_FALSE(failed.ok);
    EXPECT_EQ(failed.sqlstate, "22012") << failed.message;
    EXPECT_EQ(pid_after, pid_before) << "the session of a failed call was replaced instead of rolled back";
    EXPECT_EQ(h.pool->figures().connects_total, 1);
    // The server's own log (tests/pg: log_min_messages = warning) holds no warning of this
    // backend's: nothing was sent outside a transaction.
    const char *dir = std::getenv("QUEEN_TEST_PGDIR");
    if (!dir || !*dir) GTEST_SKIP() << "QUEEN_TEST_PGDIR unset: the server's log is not ours to read";
    std::ifstream log(std::string(dir) + "/server.log");
    if (!log) GTEST_SKIP() << "no server.log in QUEEN_TEST_PGDIR";
    const std::string mine = "[" + std::to_string(pid_before) + "] WARNING:  there is no transaction in progress";
    int warnings = 0;
    for (std::string line; std::getline(log, line);)
        if (line.find(mine) != std::string::npos) ++warnings;
    EXPECT_EQ(warnings, 0) << "the server logged calls sent outside a transaction";
}

TEST(Pool, AConnectionKilledMidCallFailsThatCallAndThePoolCarriesOn) {
    Harness h(2, {1, 1, 1, 2});
    h.pool->start();
    PgResult killed;
    int ok_after = 0;
    std::atomic<int> victim{0};
    h.pool->call(Lane::maint, sql("SELECT pg_backend_pid()"), [&](PgResult r) {
        ASSERT_TRUE(r.ok);
        victim = std::stoi(r.get(0, 0));
        h.pool->call(Lane::maint, sql("SELECT pg_sleep(10)", 15000), [&](PgResult r2) {
            killed = r2;
            int left = 5;
            for (int i = 0; i < 5; ++i)
                h.pool->call(Lane::maint, sql("SELECT 1"), [&, left](PgResult r3) mutable {
                    if (r3.ok) ++ok_after;
                    if (--left == 0) {}
                    if (ok_after + (r3.ok ? 0 : 1) >= 0 && ok_after == 5) h.finish();
                });
        });
    });
    std::thread killer([&] {
        while (victim.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        testdb::Conn c;
        c.exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'queen-sweeper' "
               "AND state = 'active' AND query LIKE 'SELECT pg_sleep(10)%'");
    });
    h.run_until_done(30000);
    killer.join();
    EXPECT_FALSE(h.timed_out);
    EXPECT_FALSE(killed.ok);
    EXPECT_EQ(ok_after, 5);
    EXPECT_GE(h.pool->figures().disconnects_total, 1);
}

TEST(Pool, ALaneWithoutSlotsRefusesAtOnce) {
    Harness h(1, {0, 1, 1, 1});
    h.pool->start();
    PgResult r;
    h.pool->call(Lane::push, sql("SELECT 1"), [&](PgResult x) {
        r = x;
        h.finish();
    });
    h.run_until_done(10000);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.message.find("lane push has no admission slots"), std::string::npos) << r.message;
}

TEST(Pool, ADatabaseThatIsDownFailsCallsFastAndSaysSo) {
    uv_loop_t loop;
    ASSERT_EQ(uv_loop_init(&loop), 0);
    Logger log;
    PoolOptions o;
    o.conninfo = "host=127.0.0.1 port=1 user=nobody dbname=none connect_timeout=2";
    o.pool_size = 2;
    o.lane_slots = {1, 1, 1, 2};
    {
        Pool pool(&loop, o, log);
        pool.start();
        PgResult r;
        bool done = false;
        uv_timer_t t;
        uv_timer_init(&loop, &t);
        t.data = &pool;
        // Give the first connect attempts time to be refused, then call.
        struct Ctx {
            Pool *pool;
            PgResult *r;
            bool *done;
            uv_timer_t *t;
        } ctx{&pool, &r, &done, &t};
        t.data = &ctx;
        uv_timer_start(&t, [](uv_timer_t *tt) {
            auto *c = static_cast<Ctx *>(tt->data);
            c->pool->call(Lane::maint, sql("SELECT 1"), [c](PgResult x) {
                *c->r = x;
                *c->done = true;
                c->pool->shutdown("test done");
                c->pool->drain_posted();
                c->pool->close_handles();
                uv_close(reinterpret_cast<uv_handle_t *>(c->t), nullptr);
            });
        }, 500, 0);
        uv_run(&loop, UV_RUN_DEFAULT);
        EXPECT_TRUE(done);
        EXPECT_FALSE(r.ok);
        EXPECT_NE(r.message.find("database unavailable"), std::string::npos) << r.message;
        EXPECT_EQ(pool.figures().db_state, "closed");
    }
    EXPECT_EQ(uv_loop_close(&loop), 0);
}
