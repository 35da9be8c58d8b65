// The C boundary: argument checks that name the argument, the snprintf
// contract of stats, the provider struct for libqueen_sweeper.so, and the
// waker's rules (only an earlier instant rings; never after detach).
#include "ephemeral_test_util.hpp"
#include "queen_sweeper.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

using namespace eph_test;

namespace {
constexpr int OK = QUEEN_EPHEMERAL_OK;
constexpr int INVAL = QUEEN_EPHEMERAL_EINVAL;

::testing::AssertionResult names(const char *what) {
    const std::string err = queen_ephemeral_last_error();
    if (err.find(what) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "last error \"" << err << "\" does not name " << what;
}

struct WakeLog {
    std::mutex mu;
    std::vector<int64_t> instants;
    static void fn(void *ctx, int64_t at) {
        auto *self = static_cast<WakeLog *>(ctx);
        std::lock_guard lk(self->mu);
        self->instants.push_back(at);
    }
    std::vector<int64_t> take() {
        std::lock_guard lk(mu);
        return std::exchange(instants, {});
    }
};
} // namespace

TEST(EphemeralAbi, VersionAndDefaults) {
    EXPECT_EQ(queen_ephemeral_abi_version(), (1u << 16) | 0u);
    EXPECT_STREQ(queen_ephemeral_version(), "1.0.0");
    queen_ephemeral_config c;
    queen_ephemeral_config_init(&c);
    EXPECT_EQ(c.struct_size, sizeof c);
    EXPECT_EQ(c.overflow, QUEEN_EPHEMERAL_OVERFLOW_REJECT);
    EXPECT_GT(c.lease_ms, 0u);
    EXPECT_GT(c.max_bytes, 0u) << "the default engine is bounded";
    queen_ephemeral *e = nullptr;
    ASSERT_EQ(queen_ephemeral_create(nullptr, &e), OK) << "NULL config means the defaults";
    queen_ephemeral_destroy(&e);
    EXPECT_EQ(e, nullptr);
}

TEST(EphemeralAbi, DestroyIsNullSafe) {
    queen_ephemeral_destroy(nullptr);
    queen_ephemeral *e = nullptr;
    queen_ephemeral_destroy(&e);
    EXPECT_EQ(e, nullptr);
    queen_ephemeral_message_free(nullptr);
}

TEST(EphemeralAbi, DestroyFreesWhatIsHeld) {
    // Messages, leases and groups left behind are freed (the ASan build proves it).
    queen_ephemeral *e = nullptr;
    ASSERT_EQ(queen_ephemeral_create(nullptr, &e), OK);
    ASSERT_EQ(push(e, "q", "p", "held", 0), OK);
    ASSERT_EQ(push(e, "q", "p", "leased", 0), OK);
    ASSERT_EQ(pop(e, "q", "p", "g", 0).rc, OK);
    queen_ephemeral_destroy(&e);
    EXPECT_EQ(e, nullptr);
}

TEST(EphemeralAbi, CreateRejectsBadConfigByName) {
    queen_ephemeral *e = reinterpret_cast<queen_ephemeral *>(0x1);
    EXPECT_EQ(queen_ephemeral_create(nullptr, nullptr), INVAL);
    EXPECT_TRUE(names("out"));

    queen_ephemeral_config c = config();
    c.lease_ms = 0;
    EXPECT_EQ(queen_ephemeral_create(&c, &e), INVAL);
    EXPECT_EQ(e, nullptr) << "out is cleared on failure";
    EXPECT_TRUE(names("lease_ms"));

    c = config();
    c.overflow = 7;
    EXPECT_EQ(queen_ephemeral_create(&c, &e), INVAL);
    EXPECT_TRUE(names("overflow"));

    c = config();
    c.max_payload_bytes = 0;
    EXPECT_EQ(queen_ephemeral_create(&c, &e), INVAL);
    EXPECT_TRUE(names("max_payload_bytes"));

    c = config();
    c.struct_size = sizeof(size_t);
    EXPECT_EQ(queen_ephemeral_create(&c, &e), INVAL);
    EXPECT_TRUE(names("struct_size"));
}

TEST(EphemeralAbi, BadArgumentsNameTheArgument) {
    Engine e([](queen_ephemeral_config &c) { c.max_payload_bytes = 16; });
    const std::string long_name(QUEEN_EPHEMERAL_MAX_NAME + 1, 'n');
    const char payload[32] = {0};

    EXPECT_EQ(queen_ephemeral_push(nullptr, "q", "p", payload, 1, 0, nullptr), INVAL);
    EXPECT_TRUE(names("e is NULL"));
    EXPECT_EQ(queen_ephemeral_push(e, nullptr, "p", payload, 1, 0, nullptr), INVAL);
    EXPECT_TRUE(names("queue is NULL"));
    EXPECT_EQ(queen_ephemeral_push(e, "", "p", payload, 1, 0, nullptr), INVAL);
    EXPECT_TRUE(names("queue is empty"));
    EXPECT_EQ(queen_ephemeral_push(e, long_name.c_str(), "p", payload, 1, 0, nullptr), INVAL);
    EXPECT_TRUE(names("queue is longer than 255 bytes"));
    EXPECT_EQ(queen_ephemeral_push(e, "q", nullptr, payload, 1, 0, nullptr), INVAL);
    EXPECT_TRUE(names("partition is NULL"));
    EXPECT_EQ(queen_ephemeral_push(e, "q", "p", nullptr, 1, 0, nullptr), INVAL);
    EXPECT_TRUE(names("payload is NULL"));
    EXPECT_EQ(queen_ephemeral_push(e, "q", "p", payload, 17, 0, nullptr), INVAL);
    EXPECT_TRUE(names("len 17 is above max_payload_bytes (16)"));
    EXPECT_EQ(queen_ephemeral_push(e, "q", "p", payload, 1, -5, nullptr), INVAL);
    EXPECT_TRUE(names("now_unix_ms"));
    EXPECT_EQ(queen_ephemeral_push(e, "q", "p", nullptr, 0, 0, nullptr), OK) << "NULL with len 0 is fine";
    EXPECT_EQ(stat(e, "pushed_total"), 1u) << "nothing before it was half-applied";

    queen_ephemeral_message m{};
    m.struct_size = sizeof m;
    EXPECT_EQ(queen_ephemeral_pop(e, "q", "p", nullptr, 0, 0, &m), INVAL);
    EXPECT_TRUE(names("group is NULL"));
    EXPECT_EQ(queen_ephemeral_pop(e, "q", "p", "", 0, 0, &m), INVAL);
    EXPECT_TRUE(names("group is empty"));
    EXPECT_EQ(queen_ephemeral_pop(e, "q", "p", "g", 0, 0, nullptr), INVAL);
    EXPECT_TRUE(names("out is NULL"));
    m.struct_size = 8;
    EXPECT_EQ(queen_ephemeral_pop(e, "q", "p", "g", 0, 0, &m), INVAL);
    EXPECT_TRUE(names("out->struct_size"));

    EXPECT_EQ(queen_ephemeral_ack(e, "q", "p", "g", -1, 0, QUEEN_EPHEMERAL_ACK_COMPLETED, 0), INVAL);
    EXPECT_TRUE(names("lease_id"));
    EXPECT_EQ(queen_ephemeral_ack(e, "q", "p", "g", -2, 0, QUEEN_EPHEMERAL_ACK_COMPLETED, 0), INVAL);
    EXPECT_TRUE(names("offset"));
    EXPECT_EQ(queen_ephemeral_ack(e, "q", "p", "g", 0, 0, 9, 0), INVAL);
    EXPECT_TRUE(names("outcome 9"));

    queen_ephemeral_sweep_result r{};
    r.struct_size = 4;
    EXPECT_EQ(queen_ephemeral_sweep(e, 0, &r), INVAL);
    EXPECT_TRUE(names("out->struct_size"));
    EXPECT_EQ(queen_ephemeral_sweep(nullptr, 0, nullptr), INVAL);
    EXPECT_EQ(queen_ephemeral_sweep(e, 0, nullptr), OK) << "the result is optional";

    queen_ephemeral_queue_options o;
    queen_ephemeral_queue_options_init(&o);
    o.lease_ms = 0;
    EXPECT_EQ(queen_ephemeral_declare(e, "d", &o), INVAL);
    EXPECT_TRUE(names("opts.lease_ms"));
    queen_ephemeral_queue_options_init(&o);
    o.overflow = 3;
    EXPECT_EQ(queen_ephemeral_declare(e, "d", &o), INVAL);
    EXPECT_TRUE(names("opts.overflow"));
    queen_ephemeral_queue_options_init(&o);
    o.ttl_ms = -7;
    EXPECT_EQ(queen_ephemeral_declare(e, "d", &o), INVAL);
    EXPECT_TRUE(names("opts.ttl_ms"));
    int rc = 0;
    info(e, "d", &rc);
    EXPECT_EQ(rc, QUEEN_EPHEMERAL_ENOENT) << "a refused declare creates nothing";

    EXPECT_EQ(queen_ephemeral_attach_waker(nullptr, nullptr, nullptr), INVAL);
    EXPECT_EQ(queen_ephemeral_queue_info(e, "q", nullptr), INVAL);
    EXPECT_EQ(queen_ephemeral_backstop(e, nullptr, sizeof(queen_sweeper_backstop)), INVAL);
    EXPECT_TRUE(names("out_provider"));
}

TEST(EphemeralAbi, LastErrorIsPerThread) {
    EXPECT_EQ(queen_ephemeral_push(nullptr, "q", "p", nullptr, 0, 0, nullptr), INVAL);
    std::string other;
    std::thread([&] { other = queen_ephemeral_last_error(); }).join();
    EXPECT_EQ(other, "");
    EXPECT_TRUE(names("e is NULL"));
}

TEST(EphemeralAbi, StatsHasSnprintfSemantics) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p", "abc", 0), OK);
    const int64_t n = queen_ephemeral_stats(e, nullptr, 0);
    ASSERT_GT(n, 0);
    std::string full = stats(e);
    EXPECT_EQ(static_cast<int64_t>(full.size()), n);
    EXPECT_EQ(full.front(), '{');
    EXPECT_EQ(full.back(), '}');
    for (const char *key : {"\"queues\":1", "\"messages\":1", "\"bytes\":3", "\"pushed_total\":1",
                            "popped_total", "acked_total", "redelivered_total", "exhausted_total",
                            "ttl_dropped_total", "collected_total", "rejected_total"})
        EXPECT_NE(full.find(key), std::string::npos) << key << " in " << full;

    char small[8];
    std::memset(small, 'x', sizeof small);
    EXPECT_EQ(queen_ephemeral_stats(e, small, sizeof small), n);
    EXPECT_EQ(std::string(small), full.substr(0, 7)) << "a terminated prefix";
    EXPECT_EQ(queen_ephemeral_stats(e, nullptr, 5), INVAL);
    EXPECT_EQ(queen_ephemeral_stats(nullptr, small, sizeof small), INVAL);
}

TEST(EphemeralAbi, MessageFreeIsIdempotent) {
    Engine e;
    ASSERT_EQ(push(e, "q", "p", "payload", 0), OK);
    queen_ephemeral_message m{};
    m.struct_size = sizeof m;
    ASSERT_EQ(queen_ephemeral_pop(e, "q", "p", "g", 0, 0, &m), OK);
    ASSERT_NE(m.payload, nullptr);
    EXPECT_EQ(std::string(reinterpret_cast<char *>(m.payload), m.payload_len), "payload");
    queen_ephemeral_message_free(&m);
    EXPECT_EQ(m.payload, nullptr);
    EXPECT_EQ(m.payload_len, 0u);
    queen_ephemeral_message_free(&m);
}

TEST(EphemeralBackstop, ProviderIsFilledAndCallable) {
    Engine e([](queen_ephemeral_config &c) { c.idle_gc_ms = 100; });
    queen_sweeper_backstop p;
    std::memset(&p, 0xab, sizeof p);
    EXPECT_EQ(queen_ephemeral_backstop(e, &p, sizeof p - 1), INVAL);
    EXPECT_TRUE(names("out_size"));
    ASSERT_EQ(queen_ephemeral_backstop(e, &p, sizeof p), OK);
    EXPECT_EQ(p.struct_size, sizeof p);
    EXPECT_EQ(p.ctx, static_cast<void *>(e.get()));
    ASSERT_NE(p.sweep, nullptr);
    ASSERT_NE(p.attach_waker, nullptr);

    WakeLog log;
    p.attach_waker(p.ctx, &WakeLog::fn, &log);
    ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    ASSERT_EQ(pop(e, "q", "p", "g", 0, 50).rc, OK);
    EXPECT_EQ(log.take(), std::vector<int64_t>{50});
    ASSERT_EQ(pop(e, "idle", "p", "g", 0).rc, QUEEN_EPHEMERAL_EAGAIN);

    queen_sweeper_backstop_result r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    ASSERT_EQ(p.sweep(p.ctx, 100, &r), OK);
    EXPECT_EQ(r.redelivered, 1u);
    EXPECT_EQ(r.exhausted, 0u);
    EXPECT_EQ(r.ttl_dropped, 0u);
    EXPECT_EQ(r.queues_collected, 1u); // "idle"; "q" still holds its message
    EXPECT_EQ(r.next_expiry_unix_ms, -1);

    r.struct_size = 3;
    EXPECT_EQ(p.sweep(p.ctx, 100, &r), INVAL);

    p.attach_waker(p.ctx, nullptr, nullptr);
    ASSERT_EQ(pop(e, "q", "p", "g", 200, 10).rc, OK);
    EXPECT_TRUE(log.take().empty()) << "detached";
}

TEST(EphemeralWaker, OnlyAnEarlierInstantRings) {
    Engine e([](queen_ephemeral_config &c) { c.ttl_ms = 10000; });
    WakeLog log;
    ASSERT_EQ(queen_ephemeral_attach_waker(e, &WakeLog::fn, &log), OK);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(push(e, "q", "p", "x", 0), OK);
    EXPECT_EQ(log.take(), std::vector<int64_t>{10000}) << "one ttl instant, rung once";
    ASSERT_EQ(pop(e, "q", "p", "g", 0, 5000).rc, OK); // earlier: rings
    ASSERT_EQ(pop(e, "q", "p", "g", 0, 7000).rc, OK); // later: silent
    ASSERT_EQ(pop(e, "q", "p", "g", 0, 5000).rc, OK); // equal: silent
    ASSERT_EQ(pop(e, "q", "p", "g", 0, 100).rc, OK);  // earlier: rings
    EXPECT_EQ(log.take(), (std::vector<int64_t>{5000, 100}));

    // A sweep takes over what was announced and promises its own next expiry;
    // after it, only instants earlier than that ring.
    queen_ephemeral_sweep_result r = sweep(e, 100);
    EXPECT_EQ(r.redelivered, 1u);
    EXPECT_EQ(r.next_expiry_unix_ms, 5000);
    ASSERT_EQ(push(e, "q", "p", "y", 100), OK);          // ttl 10100: silent
    ASSERT_EQ(pop(e, "q", "p", "g", 100, 6000).rc, OK); // 6100: silent
    ASSERT_EQ(pop(e, "q", "p", "g", 100, 1000).rc, OK); // 1100: rings
    EXPECT_EQ(log.take(), std::vector<int64_t>{1100});
    ASSERT_EQ(queen_ephemeral_attach_waker(e, nullptr, nullptr), OK);
}

TEST(EphemeralWaker, NeverCalledAfterDetach) {
    Engine e([](queen_ephemeral_config &c) { c.max_retries = 1000000; });
    static std::atomic<bool> detached{false};
    static std::atomic<uint64_t> calls{0};
    static std::atomic<uint64_t> late{0};
    detached = false;
    calls = 0;
    late = 0;
    auto wake = [](void *, int64_t) {
        calls.fetch_add(1);
        if (detached.load()) late.fetch_add(1);
    };
    ASSERT_EQ(queen_ephemeral_attach_waker(e, wake, nullptr), OK);
    for (int i = 0; i < 64; ++i) ASSERT_EQ(push(e, "q", "p", "x", 0), OK);

    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            const std::string part = "p";
            int64_t now = 0;
            while (!stop.load()) {
                Popped m = pop(e, "q", part.c_str(), ("g" + std::to_string(t)).c_str(), now, 1);
                if (m.rc == OK) {
                    ASSERT_EQ(ack(e, "q", "p", ("g" + std::to_string(t)).c_str(), m, QUEEN_EPHEMERAL_ACK_RETRY, now), OK);
                }
                ++now;
            }
        });
    }
    // Sweeps keep resetting the promise so pops keep ringing.
    threads.emplace_back([&] {
        int64_t now = 0;
        while (!stop.load()) (void)queen_ephemeral_sweep(e, now++, nullptr);
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (calls.load() < 200 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    EXPECT_GE(calls.load(), 200u) << "the waker was exercised";
    ASSERT_EQ(queen_ephemeral_attach_waker(e, nullptr, nullptr), OK);
    detached = true; // set after detach returned: any call from now on is a bug
    const uint64_t at_detach = calls.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    stop = true;
    for (auto &t : threads) t.join();
    EXPECT_EQ(late.load(), 0u);
    EXPECT_EQ(calls.load(), at_detach);
}
