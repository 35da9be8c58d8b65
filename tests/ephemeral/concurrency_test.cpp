// Many host threads pushing, popping and acking at once with a sweeper thread
// running the backstop: nothing lost, nothing completed twice, counts add up.
#include "ephemeral_test_util.hpp"

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

using namespace eph_test;

namespace {

constexpr int kProducers = 4;
constexpr int kPerProducer = 2500;
constexpr int kPartitions = 4;
constexpr int kConsumersPerGroup = 3;
const char *const kGroups[] = {"alpha", "beta"};
constexpr uint32_t kLongLease = 1u << 30; // never lapses on the test's clock

struct GroupLedger {
    std::mutex mu;
    std::set<std::pair<int, int64_t>> completed; // (partition, offset)
    uint64_t duplicates = 0;
    std::atomic<uint64_t> count{0};
};

} // namespace

TEST(EphemeralConcurrency, ManyThreadsNoLossNoDuplicates) {
    Engine e([](queen_ephemeral_config &c) {
        c.max_retries = 1000000; // nothing may be exhausted: every message must complete
        c.idle_gc_ms = 0;
    });
    constexpr uint64_t total = uint64_t{kProducers} * kPerProducer;
    std::atomic<int64_t> clock{0}; // the shared logical clock, advanced by the sweeper
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> push_failures{0}, ack_failures{0};
    std::mutex payload_mu;
    std::map<std::pair<int, int64_t>, std::string> payload_at; // what each offset carries
    uint64_t payload_mismatch = 0;
    GroupLedger ledger[2];

    // Both groups exist before the first push; a group that arrived later would
    // rightly start at whatever the other had not yet consumed.
    for (const char *g : kGroups)
        for (int part = 0; part < kPartitions; ++part)
            ASSERT_EQ(pop(e, "jobs", ("p" + std::to_string(part)).c_str(), g, 0).rc, QUEEN_EPHEMERAL_EAGAIN);

    std::vector<std::thread> threads;
    for (int p = 0; p < kProducers; ++p) {
        threads.emplace_back([&, p] {
            for (int i = 0; i < kPerProducer; ++i) {
                const int part = (p + i) % kPartitions;
                const std::string partition = "p" + std::to_string(part);
                const std::string body = std::to_string(p) + ":" + std::to_string(i);
                if (push(e, "jobs", partition.c_str(), body, clock.load()) != QUEEN_EPHEMERAL_OK)
                    push_failures.fetch_add(1);
            }
        });
    }
    for (int g = 0; g < 2; ++g) {
        for (int c = 0; c < kConsumersPerGroup; ++c) {
            threads.emplace_back([&, g, c] {
                std::mt19937 rng(static_cast<unsigned>(g * 97 + c));
                const char *group = kGroups[g];
                int part = c;
                while (ledger[g].count.load() < total && !stop.load()) {
                    part = (part + 1) % kPartitions;
                    const std::string partition = "p" + std::to_string(part);
                    const unsigned roll = rng() % 10;
                    // Decide before the pop: an abandoned delivery gets a lease that
                    // lapses at once; the others a lease the clock never reaches, so
                    // each pop ends in exactly one of completed, retry or lapse.
                    const bool abandon = roll == 0;
                    Popped m = pop(e, "jobs", partition.c_str(), group, clock.load(), abandon ? 1 : kLongLease);
                    if (m.rc == QUEEN_EPHEMERAL_EAGAIN) {
                        std::this_thread::yield();
                        continue;
                    }
                    ASSERT_EQ(m.rc, QUEEN_EPHEMERAL_OK) << queen_ephemeral_last_error();
                    {
                        std::lock_guard lk(payload_mu);
                        auto [it, fresh] = payload_at.emplace(std::make_pair(part, m.offset), m.payload);
                        if (!fresh && it->second != m.payload) ++payload_mismatch;
                    }
                    if (abandon) continue;
                    const int outcome = roll == 1 ? QUEEN_EPHEMERAL_ACK_RETRY : QUEEN_EPHEMERAL_ACK_COMPLETED;
                    if (ack(e, "jobs", partition.c_str(), group, m, outcome, clock.load()) != QUEEN_EPHEMERAL_OK) {
                        ack_failures.fetch_add(1);
                        continue;
                    }
                    if (outcome == QUEEN_EPHEMERAL_ACK_COMPLETED) {
                        std::lock_guard lk(ledger[g].mu);
                        if (!ledger[g].completed.emplace(part, m.offset).second) ++ledger[g].duplicates;
                        ledger[g].count.fetch_add(1);
                    }
                }
            });
        }
    }
    std::atomic<uint64_t> sweeps{0};
    std::thread sweeper([&] {
        while (!stop.load()) {
            const int64_t now = clock.fetch_add(1) + 1;
            queen_ephemeral_sweep_result r{};
            r.struct_size = sizeof r;
            if (queen_ephemeral_sweep(e, now, &r) == QUEEN_EPHEMERAL_OK) sweeps.fetch_add(1);
            (void)stats(e);
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
    });

    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while ((ledger[0].count.load() < total || ledger[1].count.load() < total) &&
           std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stop = true;
    for (auto &t : threads) t.join();
    sweeper.join();

    EXPECT_EQ(push_failures.load(), 0u);
    EXPECT_EQ(ack_failures.load(), 0u);
    EXPECT_EQ(payload_mismatch, 0u);
    EXPECT_GT(sweeps.load(), 0u);
    for (int g = 0; g < 2; ++g) {
        EXPECT_EQ(ledger[g].duplicates, 0u) << kGroups[g];
        EXPECT_EQ(ledger[g].completed.size(), total) << kGroups[g];
    }
    // Every partition's offsets are exactly 0..n-1 and every one was completed by both groups.
    std::map<int, int64_t> per_partition;
    for (const auto &[part, off] : ledger[0].completed) per_partition[part] = std::max(per_partition[part], off + 1);
    int64_t sum = 0;
    for (const auto &[part, n] : per_partition) sum += n;
    EXPECT_EQ(static_cast<uint64_t>(sum), total);
    EXPECT_EQ(ledger[0].completed, ledger[1].completed);

    // The books balance: each pop ended in one completed ack, one retry or one lapse.
    const uint64_t popped = stat(e, "popped_total");
    const uint64_t acked = stat(e, "acked_total");
    const uint64_t retried = stat(e, "retried_total");
    uint64_t redelivered = stat(e, "redelivered_total");
    // Abandoned leases still outstanding lapse with one final sweep.
    redelivered += sweep(e, clock.load() + 2).redelivered;
    EXPECT_EQ(stat(e, "pushed_total"), total);
    EXPECT_EQ(acked, 2 * total);
    EXPECT_EQ(popped, acked + retried + redelivered);
    EXPECT_GT(retried, 0u) << "the retry path was exercised";
    EXPECT_GT(redelivered, 0u) << "the lapse path was exercised";
    EXPECT_EQ(stat(e, "exhausted_total"), 0u);
    EXPECT_EQ(stat(e, "messages"), 0u) << "both groups consumed everything: all trimmed";
    EXPECT_EQ(stat(e, "bytes"), 0u);
    EXPECT_EQ(stat(e, "in_flight"), 0u);
}

TEST(EphemeralConcurrency, CollectionRacesWithTouches) {
    // A sweep collecting idle queues while other threads touch them: a touch
    // never writes into a collected queue, nothing is lost or leaked, and a
    // queue collected and created again never hands out an offset it handed
    // out before (each thread's pushes to one queue see offsets only grow).
    Engine e([](queen_ephemeral_config &c) { c.idle_gc_ms = 1; });
    std::atomic<int64_t> clock{0};
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> completed{0}, pushed{0}, sweeps{0}, reused{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            std::map<std::string, int64_t> last; // per queue: the last offset this thread was given
            // At least 3000 rounds, and on until the sweeper has really run alongside.
            for (int i = 0; i < 3000 || sweeps.load() < 200; ++i) {
                const std::string q = "q" + std::to_string((t + i) % 8);
                const int64_t now = clock.load();
                int64_t off = -1;
                if (push(e, q.c_str(), "p", "x", now, &off) == QUEEN_EPHEMERAL_OK) {
                    pushed.fetch_add(1);
                    auto [it, first] = last.emplace(q, off);
                    if (!first) {
                        if (off <= it->second) reused.fetch_add(1);
                        it->second = off;
                    }
                }
                Popped m = pop(e, q.c_str(), "p", "g", now, kLongLease);
                if (m.rc == QUEEN_EPHEMERAL_OK &&
                    ack(e, q.c_str(), "p", "g", m, QUEEN_EPHEMERAL_ACK_COMPLETED, now) == QUEEN_EPHEMERAL_OK)
                    completed.fetch_add(1);
            }
        });
    }
    std::thread sweeper([&] {
        while (!stop.load()) {
            (void)queen_ephemeral_sweep(e, clock.fetch_add(1) + 1, nullptr);
            sweeps.fetch_add(1);
        }
    });
    for (auto &t : threads) t.join();
    stop = true;
    sweeper.join();
    EXPECT_GE(pushed.load(), 12000u);
    EXPECT_EQ(reused.load(), 0u) << "an offset came back after its queue was collected";
    // Each thread pops its own queue right after pushing, and a queue holding a
    // message is never collected, so every push is completed by some pop.
    EXPECT_EQ(completed.load() + stat(e, "messages"), pushed.load());
    // Once everything is consumed, every queue is idle and empty: all collected.
    EXPECT_EQ(stat(e, "messages"), 0u);
    (void)sweep(e, clock.load() + 10);
    EXPECT_EQ(stat(e, "queues"), 0u);
    EXPECT_GT(stat(e, "collected_total"), 0u);
}
