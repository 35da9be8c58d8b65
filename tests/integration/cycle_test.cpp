// The cycle of docs/design.md, watched from inside against the real database: the order of
// its steps (probe, drain, then the sub-clocks: rollup, then prune; then the sleep, and the
// ephemeral backstop on a timer of its own, outside the cycle), and no connection held, nor
// any transaction open, while a claim is packed. Both watch through test seams of the core:
// the pool's call observer (every call's SQL, in the order the pool is handed them) and the
// packer's hook (called on the loop thread as a pack starts).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "codec/packer.hpp"
#include "db.hpp"
#include "helpers.hpp"
#include "pg/pool.hpp"
#include "queen_sweeper.h"

using namespace std::chrono;
using testhelp::stats_of;
using testhelp::wait_for;

namespace {

queen_sweeper *make(const nlohmann::json &extra, const std::string &ci = testdb::sweeper_conninfo()) {
    nlohmann::json cfg = {{"conninfo", ci}, {"read_env", false}, {"broker_id", "cycle-test"}, {"log_stderr", false}};
    cfg.update(extra);
    queen_sweeper *sw = nullptr;
    EXPECT_EQ(queen_sweeper_create(cfg.dump().c_str(), &sw), 0) << queen_sweeper_last_error();
    return sw;
}

void stop_cleanly(queen_sweeper *&sw) {
    EXPECT_EQ(queen_sweeper_stop(sw, 10000), 0);
    auto st = stats_of(sw);
    EXPECT_EQ(st["loop_close_rc"], 0);
    EXPECT_EQ(st["teardown_clean"], true);
    queen_sweeper_destroy(&sw);
}

// n timers due a minute ago in `queue`, spread over 4 partitions, straight into the table.
void insert_due(testdb::Conn &db, const std::string &queue, int n, int from = 0) {
    db.exec("INSERT INTO queen.log_timers (queue, timer_key, partition, deliver_at, txn, message_id, payload) "
            "SELECT '" + queue + "', 't' || g, 'p' || (g % 4), now() - interval '1 minute', '" + queue +
            "-' || g, gen_random_uuid(), '\\x0102'::bytea FROM generate_series(" + std::to_string(from + 1) + ", " +
            std::to_string(from + n) + ") g");
}

long long left_in(testdb::Conn &db, const std::string &queue) {
    return db.count("SELECT count(*) FROM queen.log_timers WHERE queue = '" + queue + "'");
}

// ---- the call log ------------------------------------------------------------------------

enum class Kind { schema, preface, probe, drain, rollup, tidy, prune, backstop };

struct Event {
    steady_clock::time_point at;
    Kind kind;
    std::string what;
};

std::mutex g_log_mu;
std::vector<Event> g_log;

void note(Kind k, std::string what) {
    std::lock_guard<std::mutex> g(g_log_mu);
    g_log.push_back({steady_clock::now(), k, std::move(what)});
}

void observe_call(const std::string &sql) {
    auto has = [&](const char *s) { return sql.find(s) != std::string::npos; };
    // The walk from the index head runs beside the cycle, on a clock of its own.
    if (has("log_timers_below_floor_v1")) return;
    if (has("schema_version_v1") || has("CREATE ")) note(Kind::schema, "schema");
    else if (has("log_timers_due_v")) note(Kind::probe, "probe");
    else if (has("kv_usage_step_v2")) note(Kind::rollup, "rollup");
    else if (has("log_timers_tenants_tidy_v")) note(Kind::tidy, "tidy");  // with the rollup's allowance
    else if (has("kv_expire_step_v1")) note(Kind::prune, "prune");
    else if (has("inet_server_addr") || has("log_timers_in_doubt_v1") || has("release_claims_v"))
        note(Kind::preface, "recovery");  // the cycle's first step after a loss, before its probe
    else if (has("log_timers_claim")) note(Kind::drain, "claim");
    else if (has("log_timers_fire_v")) note(Kind::drain, "fire");
    else note(Kind::drain, "drain");  // fail, release of stale rows
}

int fake_sweep(void *, int64_t, queen_sweeper_backstop_result *out) {
    note(Kind::backstop, "backstop");
    out->next_expiry_unix_ms = -1;
    return 0;
}

// The order of a cycle's calls, where the cycle starts at its probe: the drain's calls, then
// the rollup, then the tidy of the tenants' ring (on the rollup's allowance), then the prune,
// each step at most once and never back to an earlier one; what a cycle runs before its probe
// (the recovery after a loss) closes the one before. The backstop is no step of the cycle and
// may come anywhere.
int rank(Kind k) {
    switch (k) {
    case Kind::probe: return 1;
    case Kind::drain: return 2;
    case Kind::rollup: return 3;
    case Kind::tidy: return 4;
    case Kind::prune: return 5;
    case Kind::preface: return 6;
    default: return 0;
    }
}

}  // namespace

class Cycle : public ::testing::Test {
protected:
    void SetUp() override { testdb::ensure_schema(); }
    void TearDown() override {
        qsw::g_test_call_observer.store(nullptr);
        qsw::g_test_on_pack.store(nullptr);
    }
};

TEST_F(Cycle, ProbeThenDrainThenRollupThenPruneThenSleepWithTheBackstopOnItsOwnTimer) {
    testdb::Conn db;
    const std::string queue = "cycle-order-" + std::to_string(getpid());
    const std::string ns = "cycle-order-" + std::to_string(getpid());
    db.exec("INSERT INTO queen.kv (namespace, key, value, expires_at) SELECT '" + ns +
            "', 'k' || g, '1', now() - interval '1 second' FROM generate_series(1, 1000) g");
    {
        std::lock_guard<std::mutex> g(g_log_mu);
        g_log.clear();
    }
    qsw::g_test_call_observer.store(&observe_call);
    // An application_name of its own: tests that look for the default one's sessions in
    // pg_stat_activity must not see this sweeper's.
    queen_sweeper *sw = make({{"sweeper_min_sleep_ms", 100}, {"sweeper_max_sleep_ms", 100},
                              {"kv_usage_every_ms", 100}, {"kv_expire_every_ms", 100}, {"kv_expire_batch", 100},
                              {"sweeper_claim_batch", 50}, {"sweeper_idle_max_sleep_ms", 100}},
                             testdb::sweeper_conninfo() + " application_name=qsw-cycle-" + std::to_string(getpid()));
    queen_sweeper_backstop provider{};
    provider.struct_size = sizeof provider;
    provider.sweep = &fake_sweep;
    ASSERT_EQ(queen_sweeper_set_backstop(sw, &provider), 0);
    const auto t0 = steady_clock::now();
    ASSERT_EQ(queen_sweeper_start(sw), 0);
    ASSERT_EQ(queen_sweeper_wait_ready(sw, 30000), 0) << queen_sweeper_last_error();
    // Timers due now, round after round (at least three; more while another test's sweeper
    // on this database drained them first, so that this one's claims and fires are seen).
    auto claims_seen = [] {
        std::lock_guard<std::mutex> g(g_log_mu);
        int n = 0;
        for (auto &e : g_log) n += e.what == "fire";
        return n;
    };
    for (int round = 0; round < 3 || (claims_seen() < 3 && round < 12); ++round) {
        insert_due(db, queue, 150, round * 150);
        ASSERT_TRUE(wait_for([&] { return left_in(db, queue) == 0; }, 30000, 10)) << "round " << round;
        std::this_thread::sleep_for(milliseconds(300));
    }
    std::this_thread::sleep_for(milliseconds(1200));
    const auto st = stats_of(sw);
    stop_cleanly(sw);
    qsw::g_test_call_observer.store(nullptr);
    const double secs = duration<double>(steady_clock::now() - t0).count();

    std::vector<Event> log;
    {
        std::lock_guard<std::mutex> g(g_log_mu);
        log = g_log;
    }
    // Cycles: from each probe to the next.
    std::vector<std::vector<Event>> cycles;
    int passes = 0, passes_inside_a_cycle = 0, schema_after_probe = 0;
    for (size_t i = 0; i < log.size(); ++i) {
        const Event &e = log[i];
        if (e.kind == Kind::backstop) {
            ++passes;
            // Between two calls of one cycle: after its probe, before the next cycle begins.
            if (!cycles.empty() && i + 1 < log.size() && rank(log[i + 1].kind) > 1 && rank(log[i + 1].kind) < 6)
                ++passes_inside_a_cycle;
            continue;
        }
        if (e.kind == Kind::schema) {
            if (!cycles.empty()) ++schema_after_probe;
            continue;
        }
        if (e.kind == Kind::probe) cycles.emplace_back();
        if (cycles.empty()) continue;  // nothing but the schema step comes before the first probe
        cycles.back().push_back(e);
    }
    ASSERT_GE(cycles.size(), 10u);
    int full = 0;
    for (size_t c = 0; c < cycles.size(); ++c) {
        const auto &cy = cycles[c];
        std::string seq;
        for (auto &e : cy) seq += std::string(e.what) + " ";
        int last = 0, rollups = 0, tidies = 0, prunes = 0;
        bool claim = false, fire = false;
        for (size_t i = 0; i < cy.size(); ++i) {
            EXPECT_GE(rank(cy[i].kind), last) << "cycle " << c << " out of order: " << seq;
            last = rank(cy[i].kind);
            rollups += cy[i].kind == Kind::rollup;
            tidies += cy[i].kind == Kind::tidy;
            prunes += cy[i].kind == Kind::prune;  // a pass is up to 8 calls, one after the other
            claim = claim || cy[i].what == "claim";
            fire = fire || cy[i].what == "fire";
        }
        EXPECT_LE(rollups, 1) << seq;
        EXPECT_LE(tidies, 1) << seq;
        EXPECT_LE(prunes, 8) << seq;
        if (claim && fire && rollups == 1 && prunes == 1) ++full;
    }
    EXPECT_GE(full, 1) << "no cycle had probe, claim, fire, rollup and prune";
    EXPECT_EQ(schema_after_probe, 0);
    // The sleep is a sleep: cycles at the 100 ms floor, not back to back.
    EXPECT_LE(static_cast<double>(cycles.size()), secs * 1000 / 100 + 5) << cycles.size() << " cycles in " << secs;
    // The backstop: once a second on its own timer, whatever the cycles do.
    EXPECT_GE(passes, static_cast<int>(secs) - 2) << passes << " passes in " << secs << " s";
    EXPECT_LE(passes, static_cast<int>(secs) + 1) << passes << " passes in " << secs << " s";
    EXPECT_LT(passes * 3, static_cast<int>(cycles.size())) << "the backstop ran with every cycle";
    std::printf("[cycle order] %zu cycles in %.1f s, %d with probe, claim, fire, rollup and prune; %d backstop "
                "passes (%d between two calls of a cycle); fired %lld\n",
                cycles.size(), secs, full, passes, passes_inside_a_cycle, st["fired_total"].get<long long>());
    db.exec("DELETE FROM queen.kv WHERE namespace = '" + ns + "'");
}

// ---- no connection held while packing ------------------------------------------------------

namespace {

std::string g_app;                       // the sweeper's application_name
testdb::Conn *g_watch = nullptr;         // the test's own connection, used from the pack hook
std::mutex g_snap_mu;
std::vector<std::vector<std::pair<std::string, std::string>>> g_snaps;  // per pack: (state, query)

void look_while_packing() {
    std::vector<std::pair<std::string, std::string>> rows;
    PGresult *r = PQexec(g_watch->raw(), ("SELECT coalesce(state, ''), coalesce(query, '') FROM pg_stat_activity "
                                          "WHERE application_name = '" + g_app + "'")
                                             .c_str());
    if (PQresultStatus(r) == PGRES_TUPLES_OK)
        for (int i = 0; i < PQntuples(r); ++i) rows.emplace_back(PQgetvalue(r, i, 0), PQgetvalue(r, i, 1));
    else
        rows.emplace_back("error", PQresultErrorMessage(r));
    PQclear(r);
    std::lock_guard<std::mutex> g(g_snap_mu);
    g_snaps.push_back(std::move(rows));
}

}  // namespace

TEST_F(Cycle, NoConnectionIsHeldAndNoTransactionOpenWhileAClaimIsPacked) {
    testdb::Conn db, watch;
    g_watch = &watch;
    g_app = "qsw-pack-" + std::to_string(getpid());
    const std::string queue = "cycle-pack-" + std::to_string(getpid());
    queen_sweeper *sw = make({{"sweeper_claim_batch", 100}, {"sweeper_claim_batch_max", 100},
                              {"sweeper_max_sleep_ms", 100}, {"pool_size", 4}},
                             testdb::sweeper_conninfo() + " application_name=" + g_app);
    qsw::g_test_on_pack.store(&look_while_packing);
    ASSERT_EQ(queen_sweeper_start(sw), 0);
    ASSERT_EQ(queen_sweeper_wait_ready(sw, 30000), 0) << queen_sweeper_last_error();
    // A short claim first (no backlog: nothing overlaps the pack), then a backlog (the next
    // claim is sent beside the fire, so a claim may be running during a pack).
    // Under ctest -j another test's sweeper may drain some of these first: a round is
    // repeated until this sweeper packed at least once (short) or five times (backlog).
    auto packs = [] {
        std::lock_guard<std::mutex> g(g_snap_mu);
        return g_snaps.size();
    };
    int from = 0;
    for (int round = 0; round < 10 && packs() == 0; ++round, from += 40) {
        insert_due(db, queue, 40, from);
        queen_sweeper_wake(sw, 0);
        ASSERT_TRUE(wait_for([&] { return left_in(db, queue) == 0; }, 30000, 10));
    }
    const size_t short_packs = packs();
    for (int round = 0; round < 5 && packs() < short_packs + 5; ++round, from += 1000) {
        insert_due(db, queue, 1000, from);
        queen_sweeper_wake(sw, 0);
        ASSERT_TRUE(wait_for([&] { return left_in(db, queue) == 0; }, 60000, 10));
    }
    qsw::g_test_on_pack.store(nullptr);
    stop_cleanly(sw);
    g_watch = nullptr;

    std::lock_guard<std::mutex> g(g_snap_mu);
    ASSERT_GE(short_packs, 1u) << "no pack was seen for the short claim";
    ASSERT_GE(g_snaps.size(), short_packs + 5) << "too few packs seen during the backlog";
    int busy_claims = 0, busy_fires = 0;
    for (size_t i = 0; i < g_snaps.size(); ++i) {
        ASSERT_FALSE(g_snaps[i].empty()) << "pack " << i << ": no connection of the sweeper was found";
        for (auto &[state, query] : g_snaps[i]) {
            ASSERT_NE(state, "error") << query;
            // A transaction open across the pack is exactly what must never happen.
            const bool open_transaction = state.rfind("idle in transaction", 0) == 0;
            EXPECT_FALSE(open_transaction) << "pack " << i << ": " << state << ": " << query;
            if (state == "active") {
                // Only in a backlog, never in the short claim: the claim sent beside the fire,
                // or the fire beside which a claim taken ahead is packed (Drain::pack_ahead):
                // a statement of its pinned transaction (BEGIN, the call's set_config, the
                // fire, COMMIT, sent as one pipeline, so the session is never idle inside it).
                const bool claim = query.find("log_timers_claim") != std::string::npos;
                const bool fire = query.find("log_timers_fire") != std::string::npos || query.rfind("BEGIN", 0) == 0 ||
                                  query.rfind("COMMIT", 0) == 0 || query.find("set_config") != std::string::npos;
                EXPECT_TRUE(claim || fire) << "pack " << i << ": " << query;
                EXPECT_GE(i, short_packs) << "a call ran during the pack of a short claim: " << query;
                (claim ? busy_claims : busy_fires)++;
            } else {
                EXPECT_EQ(state, "idle") << "pack " << i << ": " << query;
            }
        }
    }
    std::printf("[no connection held while packing] %zu packs looked at (%zu of the short claim); every sweeper "
                "connection idle, no transaction open; %d overlapping claims and %d fires seen running\n",
                g_snaps.size(), short_packs, busy_claims, busy_fires);
}
