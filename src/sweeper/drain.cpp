// B. DRAIN (see drain.hpp): claim, pack and fire, each claim's rows borne by it alone.
#include "sweeper/drain.hpp"

#include <set>
#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <tuple>

#include "codec/codec.hpp"
#include "pg/classify.hpp"
#include "pg/sql_args.hpp"
#include "pg/statements.hpp"
#include "sweeper/awaitables.hpp"
#include "sweeper/handback.hpp"

namespace qsw {

std::atomic<int> g_test_fault_pack{0};
std::atomic<int> g_test_fault_claim{0};
std::atomic<int> g_test_fault_claim_ahead{0};
std::atomic<int> g_test_fault_fire_answer{0};

namespace {

void injected(std::atomic<int> &fault, const char *where) {
    int n = fault.load();
    while (n > 0 && !fault.compare_exchange_weak(n, n - 1)) {
    }
    if (n > 0) throw std::runtime_error(std::string("injected internal error while ") + where + " (test seam)");
}

// A random (version 4) uuid, the id a claim is sent with. From the kernel's generator: ids
// of different brokers and processes must never meet, and a claim's id is what its rows'
// claim_token is. Falls back to a per-process generator only if getrandom(2) fails.
std::string new_claim_id() {
    uint8_t b[16];
    size_t got = 0;
    while (got < sizeof b) {
        const ssize_t n = getrandom(b + got, sizeof b - got, 0);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
    }
    if (got < sizeof b) {
        static thread_local std::mt19937_64 gen{
            std::random_device{}() ^ static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
        for (size_t i = 0; i < sizeof b; i += 8) {
            const uint64_t v = gen();
            std::memcpy(b + i, &v, 8);
        }
    }
    b[6] = static_cast<uint8_t>((b[6] & 0x0f) | 0x40);
    b[8] = static_cast<uint8_t>((b[8] & 0x3f) | 0x80);
    static const char *hex = "0123456789abcdef";
    std::string out;
    out.reserve(36);
    for (int i = 0; i < 16; ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
        out += hex[b[i] >> 4];
        out += hex[b[i] & 15];
    }
    return out;
}

std::vector<size_t> rows_of(const FireBatch &batch) {
    std::vector<size_t> all;
    for (const PackedSegment &seg : batch.segments) all.insert(all.end(), seg.rows.begin(), seg.rows.end());
    return all;
}

}  // namespace

// ---- The pass --------------------------------------------------------------------------

Task<Drain::Result> Drain::run(const std::vector<int16_t> &shards, int64_t row_budget, bool phase_due) {
    if (batch_ < ctx_.cfg.sweeper_claim_batch) set_batch(ctx_.cfg.sweeper_claim_batch);
    if (kept_due()) {
        const std::optional<PgResult> refused = co_await retry_kept();
        if (refused) {
            Result failed;
            failed.failed = true;
            ctx_.cycle_failed("fire", *refused);
            co_return failed;
        }
    }
    Pass p;
    p.rows_left = row_budget;
    p.shed = row_budget < ctx_.cfg.sweeper_cycle_max_rows;
    p.phase_due = phase_due;
    p.deadline = ctx_.now() + static_cast<uint64_t>(ctx_.cfg.sweeper_lease_ms / 2);
    std::vector<Task<void>> workers;
    for (int64_t i = 0; i < std::max<int64_t>(ctx_.cfg.sweeper_parallelism, 1); ++i)
        workers.push_back(worker(shards, p));
    co_await run_all(std::move(workers));
    Result &acc = p.acc;
    // Held back before claiming anything: what the claim would have found (nothing), so the
    // cycle sleeps as after an empty claim, at most until the hold-back ends.
    if (p.held_back && acc.claimed == 0 && acc.moved == 0 && !acc.failed) acc.empty_claim = true;
    acc.out_of_time = !acc.failed && !acc.empty_claim && ctx_.now() >= p.deadline;
    acc.capped = !acc.failed && !acc.empty_claim && (p.rows_left <= 0 || acc.out_of_time);
    co_return acc;
}

// Reserves the next claim's rows from the pass's budget (shared by parallel workers), or 0
// when the pass is over: a stop, a failure, the budget or the half-lease spent.
int64_t Drain::reserve(Pass &p, bool &whole) {
    if (ctx_.stopping.load() || p.acc.failed || p.rows_left <= 0 || ctx_.now() >= p.deadline) return 0;
    if (holding_back()) {
        p.held_back = true;
        ++fig_.claims_held_back_total;
        return 0;
    }
    const int64_t want = std::min(batch_, p.rows_left);
    p.rows_left -= want;
    whole = want == batch_;
    return want;
}

// One worker: claim, then pack and fire each claim in turn. Through a backlog the next
// claim is sent beside the current fire, on a second maintenance-lane connection (one
// fire at a time, fires in claim order, on_fired after each commit); while other brokers
// are in the way it is sent after the fire instead (claim_ahead).
//
// A pass that spends its row budget through a healthy backlog sends the claim beside its
// last fire all the same, for the next cycle (carry_claim): that cycle's first worker fires
// it first, already packed, instead of beginning with a claim and its packing while no fire
// runs.
Task<void> Drain::worker(const std::vector<int16_t> &shards, Pass &p) {
    bool whole = false;
    int64_t want = 0;
    Claim cur;
    if (carried_) {
        // Taken beside the last pass's last fire: this pass's first, from its budget.
        cur = std::move(*carried_);
        carried_.reset();
        p.rows_left -= cur.want;
    } else {
        want = reserve(p, whole);
        if (want == 0) co_return;
        co_await claim_into(shards, want, whole, false, cur);
    }
    for (;;) {
        if (!cur.ok) {
            p.rows_left += cur.want;
            p.acc.failed = true;
            if (is_answer_lost(cur.error)) recovery_.note_lost("claim", cur.error);
            ctx_.cycle_failed("claim", cur.error);
            co_return;
        }
        if (!cur.undecodable.empty()) {
            // Not the timers' fault: fire_claim hands it back and ends the drain.
            p.rows_left += cur.want;
            co_await fire_claim(cur, p);
            co_return;
        }
        const int64_t got = static_cast<int64_t>(cur.rows->size());
        p.rows_left += cur.want - got;
        if (got == 0) {
            if (!cur.left_out.empty()) {
                // Nothing due outside the held partitions: not sent again until something
                // changes (hold_back_claim).
                around_ = AroundKept{true, ctx_.now(), std::move(cur.left_out), false};
                ++fig_.claims_around_held_empty_total;
            }
            if (p.acc.claimed == 0) {
                p.acc.empty_claim = true;
                ++fig_.empty_claims_total;
            }
            if (cur.want > 0) set_batch(ctx_.cfg.sweeper_claim_batch);  // the backlog is over
            co_return;
        }
        p.acc.claimed += got;
        const int64_t contended_before = fire_contention();
        const bool full = got == cur.want && cur.undecodable.empty();
        int64_t ahead = 0;
        bool ahead_whole = false;
        const bool go_ahead = claim_ahead(full, contended_recently(), ctx_.stopping.load());
        if (go_ahead) ahead = reserve(p, ahead_whole);
        CarryInput ci;
        ci.ahead = go_ahead;
        ci.budget_spent = p.rows_left <= 0;
        ci.out_of_time = ctx_.now() >= p.deadline;
        ci.failed = p.acc.failed;
        ci.shed = p.shed;
        ci.holding_back = holding_back();
        ci.carrying = carried_.has_value() || p.carrying;
        ci.phase_due = p.phase_due;
        // The claim for the next cycle, not from this pass's budget: what that pass's first
        // claim would ask for (a batch, within the cycle's row budget), so a cycle never fires
        // more rows than sweeper_cycle_max_rows.
        const bool carry = ahead == 0 && carry_claim(ci);
        if (carry) {
            p.carrying = true;
            ahead = std::min(batch_, ctx_.cfg.sweeper_cycle_max_rows);
            ahead_whole = ahead == batch_;
        }
        Claim next;
        bool ok = true;
        if (ahead > 0) {
            ++fig_.claims_ahead_total;
            std::vector<Task<void>> both;
            both.push_back([](Drain *d, Claim &c, Pass &pp, bool &res) -> Task<void> {
                res = co_await d->fire_claim(c, pp);
            }(this, cur, p, ok));
            both.push_back([](Drain *d, const std::vector<int16_t> &sh, int64_t n, bool w, Claim &c) -> Task<void> {
                co_await d->claim_into(sh, n, w, true, c);
                d->pack_ahead(c);
            }(this, shards, ahead, ahead_whole, next));
            co_await run_all(std::move(both));
        } else {
            ok = co_await fire_claim(cur, p);
        }
        if (!ok) {
            // The drain ends here. A claim already taken ahead goes back at once, unless a
            // stop is under way (the stop hands every held row back together).
            if (ahead > 0) {
                if (!carry) p.rows_left += ahead - static_cast<int64_t>(next.rows->size());
                if (next.ok && !ctx_.stopping.load()) co_await hand_back_claim(*next.rows, "the drain ended");
                if (!next.ok && is_answer_lost(next.error)) recovery_.note_lost("claim", next.error);
            }
            p.carrying = false;
            co_return;
        }
        p.acc.moved += got;
        after_claim(cur, contended_before);
        if (carry) {
            p.carrying = false;
            co_await carry_over(std::move(next), p);
            co_return;
        }
        if (ahead == 0) {
            if (!full) co_return;  // nothing more is due for us
            // In turn: the next claim now that this fire is done (the budget is read now).
            want = reserve(p, whole);
            if (want == 0) co_return;
            co_await claim_into(shards, want, whole, false, next);
        }
        cur = std::move(next);
    }
}

// The claim sent beside the pass's last fire, now that the fire is done: held for the next
// pass when it took rows; otherwise it ends here as any claim would (a failure counted, an
// unreadable answer handed back, an empty one the end of the backlog).
Task<void> Drain::carry_over(Claim next, Pass &p) {
    if (!next.ok) {
        if (is_answer_lost(next.error)) recovery_.note_lost("claim", next.error);
        p.acc.failed = true;
        ctx_.cycle_failed("claim", next.error);
        co_return;
    }
    if (!next.undecodable.empty()) {
        co_await fire_claim(next, p);  // hands it back, ends the drain failed
        co_return;
    }
    if (next.rows->empty()) {
        set_batch(ctx_.cfg.sweeper_claim_batch);  // the backlog is over
        co_return;
    }
    ++fig_.claims_carried_total;
    carried_ = std::move(next);
}

Task<void> Drain::hand_back_carried(const char *why) {
    if (!carried_) co_return;
    Claim c = std::move(*carried_);
    carried_.reset();
    co_await hand_back_claim(*c.rows, why);
}

// The batch after a claim was fired (next_claim_batch), and the contention hold: a claim
// whose fires met another broker (busy or stale segments) makes the next claims wait for
// their fires for a second.
void Drain::after_claim(Claim &c, int64_t contended_before) {
    const bool contended = fire_contention() != contended_before;
    if (contended) {
        contended_until_ = ctx_.now() + kContendedHoldMs;
        ++fig_.contended_claims_total;
    }
    BatchInput in;
    in.batch = batch_;
    in.base = ctx_.cfg.sweeper_claim_batch;
    in.ceiling = ctx_.cfg.sweeper_claim_batch_max;
    in.lease_ms = ctx_.cfg.sweeper_lease_ms;
    in.byte_budget = ctx_.cfg.sweeper_claim_max_bytes;
    in.whole = c.whole;
    in.full = static_cast<int64_t>(c.rows->size()) == c.want;
    in.elapsed_ms = static_cast<int64_t>(ctx_.now() - c.sent);
    in.claimed_bytes = c.bytes;
    set_batch(next_claim_batch(in));
}

int64_t Drain::fire_contention() const {
    return fig_.fire_busy_total + fig_.stale_total;
}

void Drain::set_batch(int64_t rows) {
    const bool changed = rows != batch_;
    batch_ = rows;
    fig_.claim_batch = rows;
    if (changed) ctx_.publish_pool();  // the batch a host reads is the one the next claim asks for
}

void Drain::reset_batch() { set_batch(ctx_.cfg.sweeper_claim_batch); }

// ---- The claim -------------------------------------------------------------------------

// One claim call: its id made here, its rows decoded (every column checked) and each held
// in the claim book at once, so a stop or a lost fire hands it back whether or not it was packed.
// Never throws: an internal error is the claim's error, its rows handed back.
Task<void> Drain::claim_into(const std::vector<int16_t> &shards, int64_t want, bool whole, bool ahead,
                             Claim &out) {
    out = Claim{};
    out.want = want;
    out.whole = whole;
    out.sent = ctx_.now();
    out.fire_by = fire_deadline(out.sent, ctx_.cfg.sweeper_lease_ms);
    out.id = new_claim_id();
    // The partitions whose segments are kept (someone holds them): left out of this claim.
    out.left_out = kept_partitions();
    out.floor = floor_.ticket();
    out.backlog = floor_.take_ring();
    ClaimArgs args;
    args.shards = shards;
    args.lease_ms = ctx_.cfg.sweeper_lease_ms;
    args.max_rows = want;
    args.rows_per_tenant = ctx_.cfg.sweeper_fire_rate_per_tenant;
    args.max_bytes = ctx_.cfg.sweeper_claim_max_bytes;
    args.claim_id = out.id;
    for (const PartitionKey &k : out.left_out) {
        args.skip_tenants.push_back(k[0]);
        args.skip_queues.push_back(k[1]);
        args.skip_partitions.push_back(k[2]);
    }
    args.floor_ms = out.floor.floor_ms;
    args.backlog = out.backlog;  // no tenant of our own: the claim names them from the ring
    Query q = claim_query(args);
    q.timeout_ms = std::min<int64_t>(ctx_.cfg.stmt_timeout_ms, ctx_.cfg.sweeper_lease_ms / 2);
    PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
    if (out.backlog) floor_.note_ring_claim_ms(r.elapsed_us / 1000);
    if (r.elapsed_us > 0) {  // 0: never sent (no connection)
        fig_.claim_calls.observe(r.elapsed_us);
    }
    if (!r.ok) {
        // Sent and unanswered: it may have committed. Remembered by id, handed back later.
        if (is_answer_lost(r) && !is_never_sent(r) && !is_read_only(r)) recovery_.remember_lost_claim(out.id, out.sent, out.floor.floor_ms);
        out.error = std::move(r);
        co_return;
    }
    try {
        injected(ahead ? g_test_fault_claim_ahead : g_test_fault_claim,
                 ahead ? "decoding the claim taken ahead" : "decoding a claim");
        decode_claim(r, out);
    } catch (const std::exception &e) {
        // The claim committed and its rows are ours, perhaps none entered in the book: the
        // claim as a whole goes back by its id on the next cycle (as one whose answer was lost).
        out.ok = true;
        out.undecodable = std::string("claim (") + e.what() + ")";
        recovery_.remember_lost_claim(out.id, out.sent, out.floor.floor_ms);
    }
    ++fig_.claims_total;
    fig_.claimed_total += static_cast<int64_t>(out.rows->size());
    fig_.claimed_bytes_total += out.bytes;
    ctx_.publish_pool();  // a claim is in the snapshot as soon as it is taken
}

// The answer read (read_claim_answer, pure), each row entered in the claim book, and the
// floor and the backlog noted. A column that did not decode sends the whole claim back: the
// rows read by the fire's hand-back, token-matched, and the claim by its id on the next cycle
// (as one whose answer was lost), which covers rows whose names did not read.
void Drain::decode_claim(const PgResult &r, Claim &out) {
    ClaimAnswer a = read_claim_answer(r, ctx_.now());
    out.ok = true;
    *out.rows = std::move(a.rows);
    out.bytes = a.bytes;
    for (const ClaimedTimer &t : *out.rows) book_.enter(t);
    if (!a.undecodable.empty()) {
        out.undecodable = std::move(a.undecodable);
        recovery_.remember_lost_claim(out.id, out.sent, out.floor.floor_ms);
    }
    const int64_t got = static_cast<int64_t>(out.rows->size());
    floor_.note_answer(out.floor, a.floor_ms, std::nullopt);
    std::set<std::string> tenants;
    for (const ClaimedTimer &t : *out.rows) tenants.insert(t.tenant);
    floor_.note_claim_backlog(out.backlog, got, out.want, static_cast<int64_t>(tenants.size()));
}

// ---- Packing and firing one claim --------------------------------------------------------

// A claim taken ahead, packed while the fire before it is on the server: the packing (the
// frames, their hashes, zstd per segment: about 8 us a segment) is then off the path from
// one fire to the next. With a segment per timer (10,000 partitions) it was a fifth of that
// path: one sweeper 0.63 -> 0.70 of the ceiling (tests/bench/results/2026-12-07-per-segment.md).
// Anything it throws leaves the claim to be packed by its fire, where a failure is contained
// (fire_claim). A worker holds two packed claims at most (the one firing, the one taken
// ahead), each inside its own inflation budget: the sweeper's memory bound counts two per
// worker (docs/design.md, "Memory is bounded in bytes").
void Drain::pack_ahead(Claim &c) noexcept {
    if (!c.ok || !c.undecodable.empty() || c.rows->empty()) return;
    try {
        c.packed = pack(*c.rows);
        ++fig_.claims_packed_ahead_total;
    } catch (...) {
        // c.packed stays empty: its fire packs it.
    }
}

// Rows packed into fire batches under this sweeper's byte cap per fire.
PackResult Drain::pack(const std::vector<ClaimedTimer> &rows) const {
    return pack_timers(rows, static_cast<size_t>(ctx_.cfg.sweeper_max_fire_bytes));
}

// Contains whatever goes wrong with one claim: an exception anywhere in packing or firing
// it hands its rows back at once (token-matched, no attempt spent), is counted against the
// fire (errors_total{phase="fire"}, cycle_errors_total, last_error), and ends this drain;
// the cycle backs off and the loop goes on. False: the drain ends.
Task<bool> Drain::fire_claim(Claim &c, Pass &p) {
    Settled<bool> done = co_await settle(fire_claim_unguarded(c, p));
    if (!done.error) {
        // Rows shared with kept segments outlive the claim: what the claim settled gives its
        // payload back at once, what is kept keeps its own for its later tries and replays.
        // Unshared, the rows go with the claim.
        if (c.rows.use_count() > 1)
            for (ClaimedTimer &t : *c.rows)
                if (!book_.holds(t)) std::string().swap(t.payload);
        co_return *done.value;
    }
    const std::string internal = describe(done.error);
    if (!ctx_.hard_stop.load()) co_await hand_back_claim(*c.rows, "an internal error");
    PgResult bad;
    bad.origin = Origin::internal;
    bad.message = "internal error while packing or firing a claim of " + std::to_string(c.rows->size()) +
                  " timer(s): " + internal + "; its claims were handed back";
    p.acc.failed = true;
    ctx_.log.error(bad.message);
    ctx_.cycle_failed("fire", bad);
    co_return false;
}

Task<bool> Drain::fire_claim_unguarded(Claim &c, Pass &p) {
    std::vector<ClaimedTimer> &rows = *c.rows;
    if (!c.undecodable.empty()) {
        // Not the timers' fault: the whole claim goes back (no attempt spent), the cycle backs off.
        co_await hand_back_claim(rows, "an unreadable answer");
        PgResult bad;
        bad.origin = Origin::internal;
        bad.message = "the claim's answer has an unreadable " + c.undecodable + " column; the claim was handed back";
        ctx_.log.error(bad.message);
        p.acc.failed = true;
        ctx_.cycle_failed("claim", bad);
        co_return false;
    }
    injected(g_test_fault_pack, "packing a claim");
    PackResult packed = c.packed ? std::move(*c.packed) : pack(rows);
    c.packed.reset();
    co_await settle_unframed(c, packed);
    std::optional<PgResult> refused;
    for (auto &batch : packed.batches) {
        // A requested stop finishes the transaction in flight and fires nothing more: the
        // rest of the claim stays held and is handed back with everything else at once.
        if (ctx_.stopping.load()) co_return false;
        CallPlan plan;
        plan.fire_by = c.fire_by;
        size_t busy = 0;
        for (const PackedSegment &seg : batch.segments)
            busy += busy_partitions_.recent(seg.tenant, seg.queue, seg.partition, ctx_.now()) ? 1 : 0;
        if (fire_waits_first(batch.segments.size(), busy)) {  // as the retry of a busy answer would
            const BusyRetry br = busy_retry(0);
            plan.wait = br.wait;
            plan.lock_wait_ms = br.lock_wait_ms;
            plan.tries = 1;
            ++fig_.fires_waiting_first_total;
        }
        FireEnd end = co_await fire_batch(c.rows, batch, plan);
        if (end.refused) refused = std::move(end.refused);
        if (end.ends_drain) break;
    }
    if (!refused) co_return true;
    // A fire refused for a reason no timer owns: the rest of this claim goes back too.
    const PgResult &why = *refused;
    co_await hand_back_claim(rows, "a refused fire");
    ctx_.log.limited(QUEEN_SWEEPER_LOG_ERROR, log_cause("fire-refused", why.sqlstate, why.message),
                     "fire refused (" + std::string(is_internal(why) ? "internal" : "configuration") +
                         (why.sqlstate.empty() ? "" : ", SQLSTATE " + why.sqlstate) + "): " + why.message +
                         "; no timer spends an attempt on it, the claims were handed back, the fire backs off",
                     static_cast<int64_t>(ctx_.now()));
    p.acc.failed = true;
    ctx_.cycle_failed("fire", why);
    co_return false;
}

// Rows the packer could not frame fail as permanent, each with its own reason; rows over
// the call's inflation budget go back untouched, taken first next time.
Task<void> Drain::settle_unframed(Claim &c, const PackResult &packed) {
    if (!packed.rejected.empty()) {
        fig_.rejected_total += static_cast<int64_t>(packed.rejected.size());
        ctx_.log.warn(std::to_string(packed.rejected.size()) + " claimed timer(s) cannot be framed (" +
                      packed.rejected.front().second + (packed.rejected.size() > 1 ? ", ..." : "") +
                      "); failing them as permanent, each with its own reason");
        std::map<std::string, std::vector<size_t>> by_reason;
        for (auto &[idx, reason] : packed.rejected) by_reason[reason].push_back(idx);
        for (auto &[reason, idxs] : by_reason) co_await fail_rows(c.rows, idxs, "cannot be framed: " + reason, "permanent");
    }
    if (!packed.deferred.empty()) {
        co_await hand_back(*c.rows, packed.deferred, static_cast<int64_t>(packed.deferred.size()), "inflation budget");
        fig_.inflate_deferred_total += static_cast<int64_t>(packed.deferred.size());
    }
}

// One fire call for one batch, within its claim's deadline: rows that cannot be fired in
// time go back instead (due again at once), never fired after their lease.
Task<Drain::FireEnd> Drain::fire_batch(const ClaimRows &owner, FireBatch &batch, const CallPlan &plan) {
    std::vector<ClaimedTimer> &rows = *owner;
    const CallBudget budget = call_budget(ctx_.now(), plan.fire_by, ctx_.cfg.stmt_timeout_ms);
    if (!budget.go) {
        const std::vector<size_t> all = rows_of(batch);
        co_await hand_back(rows, all, static_cast<int64_t>(all.size()), "its claim's deadline");
        fig_.late_handed_back_total += static_cast<int64_t>(all.size());
        co_return FireEnd{};
    }
    // The arrays are written straight from the rows (one literal each, no copy per row).
    TextArrayLiteral seg_tenants, seg_queues, seg_parts, keys, tokens, tids, part_tids;
    FireArgs args;
    bool every_tid = true;
    for (size_t s = 0; s < batch.segments.size(); ++s) {
        const PackedSegment &seg = batch.segments[s];
        seg_tenants.add(seg.tenant);
        seg_queues.add(seg.queue);
        seg_parts.add(seg.partition);
        const std::string_view at = addresses_.find(seg.tenant, seg.queue, seg.partition);
        if (at.empty()) part_tids.add_null();
        else part_tids.add(at);
        args.counts.push_back(seg.count);
        args.hashes.emplace_back(seg.hashes);
        args.blobs.emplace_back(seg.blob);
        for (size_t idx : seg.rows) {
            const ClaimedTimer &t = rows[idx];
            keys.add(t.timer_key);
            tokens.add(t.claim_token);
            every_tid = every_tid && !t.row_tid.empty();
            if (every_tid) tids.add(t.row_tid);
            args.key_segments.push_back(static_cast<int64_t>(s + 1));
        }
    }
    args.seg_tenants = std::move(seg_tenants).finish();
    args.seg_queues = std::move(seg_queues).finish();
    args.seg_partitions = std::move(seg_parts).finish();
    args.keys = std::move(keys).finish();
    args.tokens = std::move(tokens).finish();
    args.wait = plan.wait;
    if (every_tid) args.tids = std::move(tids).finish();
    args.seg_partition_tids = std::move(part_tids).finish();
    move_rows(rows, batch, RowEvent::sent);
    Query q = fire_query(std::move(args));
    q.lock_timeout_ms = plan.wait ? plan.lock_wait_ms : 0;
    q.timeout_ms = budget.timeout_ms;
    PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
    // An answer publishes its figures itself (publish_fire, before on_fired).
    if (r.ok && r.rows() == 1) co_return co_await on_fire_answer(owner, batch, r, plan);
    if (r.ok) {
        r.ok = false;
        r.origin = Origin::internal;
        r.message = "the fire returned no row";
    }
    FireEnd end = co_await on_fire_failure(owner, batch, std::move(r), plan);
    ctx_.publish_pool();  // what the failure did (kept, failed, handed back) in the snapshot
    co_return end;
}

// The figures of one fire, then its announcements: after the commit, never before (a host
// can wake its parked consumers now).
void Drain::publish_fire(const std::vector<ClaimedTimer> &rows, const FireBatch &batch, const FireTally &t) {
    auto &f = fig_;
    f.fired_total += t.fired;
    f.fired_segments_total += t.fired_segs;
    f.stale_total += t.stale;
    f.duplicate_total += t.dup;
    f.released_total += t.released;
    ++f.fire_txns_total;
    f.fire_bytes_total += static_cast<int64_t>(batch.bytes - t.busy.bytes);
    f.fire_busy_total += static_cast<int64_t>(t.busy.segments.size());
    f.fire_provision_busy_total += t.provision_busy;
    for (auto l : t.lags) f.fire_lag.add(l);
    f.fire_lag_max_ms = std::max(f.fire_lag_max_ms, t.lag_max);
    recovery_.note_fired(t.fired);
    ctx_.publish_pool();  // the figures are in the snapshot before the host hears of the fire
    for (auto &[s, base] : t.fired_notes) {
        const PackedSegment &seg = batch.segments[s];
        ctx_.announce(seg.tenant, seg.queue, seg.partition, seg.count, base);
        recovery_.remember_fired(rows, seg, base);
    }
}

// A fire answered: fired segments are gone from the table and announced, stale ones
// (rows another broker took) are forgotten and what we still hold of them handed back,
// busy ones (a partition someone holds) are kept to be tried again later (tally_fire).
Task<Drain::FireEnd> Drain::on_fire_answer(const ClaimRows &owner, FireBatch &batch, const PgResult &r,
                                            const CallPlan &plan) {
    std::vector<ClaimedTimer> &rows = *owner;
    FireAnswer answer;
    try {
        injected(g_test_fault_fire_answer, "reading a fire's answer");
        answer = parse_fire_answer(r.get(0, 0));
    } catch (const std::exception &e) {  // the test seam, or no memory for the answer
        answer = FireAnswer{};
        answer.unreadable = e.what();
    }
    if (!answer.readable) {
        // The fire committed and what it did is unknown: resolved from the log like a fire
        // whose answer was lost (announced if its segments are there, handed back if not).
        PgResult bad;
        bad.origin = Origin::internal;
        bad.message = "fire answer unreadable: " + answer.unreadable +
                      "; resolved from the log on the next cycle, as a fire whose answer was lost";
        ctx_.log.error(bad.message);
        recovery_.park_fire(owner, batch, true);
        co_return FireEnd{false, std::move(bad)};
    }
    // Where each appended segment's partition row is now, for our next fire of it; a
    // partition this fire did not write keeps what we knew (another writer may have moved
    // it: the server finds that out).
    if (!answer.partition_tids.empty())
        for (size_t s = 0; s < batch.segments.size(); ++s)
            if (s < answer.partition_tids.size() && !answer.partition_tids[s].empty())
                addresses_.learn(batch.segments[s].tenant, batch.segments[s].queue, batch.segments[s].partition,
                                 answer.partition_tids[s]);
    FireTally t = tally_fire(answer, batch, rows, static_cast<int64_t>(ctx_.now()));
    for (size_t idx : t.done_rows) book_.move(rows[idx], RowEvent::settled);
    publish_fire(rows, batch, t);
    // A row the fire could not lock is not necessarily lost to us: another broker's claim
    // may have held it for an instant (SKIP LOCKED) while our token is still on it. A
    // segment whose missed rows are all still ours comes back busy and is kept (below,
    // schema version 10); a stale one (some row not ours) may still have such rows: hand
    // them back now, token-matched, instead of leaving them to the lease.
    if (t.stale_unheld > 0 && !ctx_.hard_stop.load())
        co_await hand_back(rows, t.stale_rows, t.stale_unheld, "stale rows");
    else
        for (size_t idx : t.stale_rows) book_.move(rows[idx], RowEvent::settled);
    if (t.busy.segments.empty()) co_return FireEnd{};
    for (const PackedSegment &seg : t.busy.segments)
        busy_partitions_.note(seg.tenant, seg.queue, seg.partition, ctx_.now());
    move_rows(rows, t.busy, RowEvent::busy);  // kept, or tried again at once (sent again)
    if (plan.tries == 0 && !ctx_.stopping.load()) {
        // Try 0: at once, waiting a little for the partition (busy_retry(0)).
        const BusyRetry br = busy_retry(0);
        CallPlan again = plan;
        again.wait = br.wait;
        again.lock_wait_ms = br.lock_wait_ms;
        again.tries = 1;
        FireEnd end = co_await fire_batch(owner, t.busy, again);
        end.ends_drain = false;  // this claim's other batches are still fired; a refusal is passed on
        co_return end;
    }
    keep(owner, std::move(t.busy), plan, std::max<int64_t>(plan.tries, 1));
    co_return FireEnd{};
}

Task<Drain::FireEnd> Drain::on_fire_failure(const ClaimRows &owner, FireBatch &batch, PgResult r,
                                            const CallPlan &plan) {
    std::vector<ClaimedTimer> &rows = *owner;
    const ErrorClass cls = classify(r);
    // A lock wait that ran out is a partition still held (busy), not a failed fire.
    if (!is_lock_timeout(r)) {
        auto &f = fig_;
        if (cls == ErrorClass::transient) ++f.fire_failures_transient;
        else if (cls == ErrorClass::config) ++f.fire_failures_config;
        else ++f.fire_failures_permanent;
    }
    if (ctx_.hard_stop.load()) co_return FireEnd{true, std::nullopt};
    const std::vector<size_t> all = rows_of(batch);
    FailedFireInput in;
    in.answer_lost = is_answer_lost(r);
    in.config = cls == ErrorClass::config;
    in.internal = is_internal(r);
    in.lock_timeout = is_lock_timeout(r);
    in.transient = cls == ErrorClass::transient;
    in.isolating = plan.isolating;
    in.isolate_enabled = ctx_.cfg.sweeper_isolate_on_permanent;
    in.timers = static_cast<int64_t>(all.size());
    const FailedFire what = failed_fire(in);
    if (what != FailedFire::busy && what != FailedFire::hand_back) {
        ctx_.note_error("fire", r);
        // A fire that fails for a reason that repeats (a full tablespace) fails every call:
        // said at once, then once per cause per interval with its count (base/log_limit.hpp).
        ctx_.log.limited(QUEEN_SWEEPER_LOG_WARN, log_cause("fire", r.sqlstate, r.message),
                         "fire of " + std::to_string(all.size()) + " timer(s) in " +
                             std::to_string(batch.segments.size()) + " segment(s) failed (" + error_class_name(cls) +
                             (r.sqlstate.empty() ? "" : ", SQLSTATE " + r.sqlstate) + "): " + r.message,
                         static_cast<int64_t>(ctx_.now()));
    }
    switch (what) {
    case FailedFire::park:
        // The connection took the answer with it. Sent, the fire may have committed (even on
        // a standby that is primary now): resolved from the log once connected again; its
        // claims stay ours meanwhile, no attempt spent.
        recovery_.note_lost("fire", r);
        recovery_.park_fire(owner, batch, !is_read_only(r) && !is_never_sent(r));
        co_return FireEnd{};
    case FailedFire::busy:
        move_rows(rows, batch, RowEvent::busy);
        keep(owner, std::move(batch), plan, std::max<int64_t>(plan.tries, 1));
        co_return FireEnd{};
    case FailedFire::hand_back:
        // A privilege or schema mistake (class 42) or our own error is never one timer's
        // fault: replaying them one by one would spend every timer's attempts and
        // dead-letter them all. Back, token-matched, and the drain ends with a backoff.
        co_await hand_back(rows, all, static_cast<int64_t>(all.size()), "a refused fire");
        co_return FireEnd{true, std::move(r)};
    case FailedFire::isolate: {
        move_rows(rows, batch, RowEvent::call_failed);  // out of any call, each sent again alone
        FireEnd end = co_await isolate(owner, batch, plan);
        end.ends_drain = false;  // the claim's other batches are still fired; a refusal is passed on
        co_return end;
    }
    case FailedFire::fail:
        break;
    }
    if (plan.isolating && cls != ErrorClass::transient) {
        fig_.poisoned_total += static_cast<int64_t>(all.size());
    }
    co_await fail_rows(owner, all, r.message, error_class_name(cls));
    co_return FireEnd{};
}

// Replays a permanently failed batch one timer per call: the poisoned one fails alone and
// the others are delivered, instead of the whole batch waiting on it. Each call keeps the
// claim's deadline; what is past it goes back.
Task<Drain::FireEnd> Drain::isolate(const ClaimRows &owner, FireBatch &batch, const CallPlan &plan) {
    CallPlan one_plan = plan;
    one_plan.isolating = true;
    one_plan.wait = false;
    FireEnd out;
    for (size_t idx : rows_of(batch)) {
        if (ctx_.stopping.load()) co_return out;  // the rest is handed back at stop
        // The row itself, with its own payload, whether this batch is a first try or kept.
        const ClaimRows one = std::make_shared<std::vector<ClaimedTimer>>(1, (*owner)[idx]);
        PackResult p = pack(*one);
        for (auto &b : p.batches) {
            FireEnd end = co_await fire_batch(one, b, one_plan);
            if (end.refused) out.refused = std::move(end.refused);
            if (end.ends_drain) {
                out.ends_drain = true;
                co_return out;
            }
        }
    }
    co_return out;
}

// ---- Failing, handing back, keeping ------------------------------------------------------

// A failure, and the move to the DLQ of what it exhausts, in one call (log_timers_fail_v2).
Task<void> Drain::fail_rows(const ClaimRows &owner, const std::vector<size_t> &which,
                            const std::string &error, const std::string &cls) {
    if (which.empty()) co_return;
    const std::vector<ClaimedTimer> &rows = *owner;
    FailArgs args;
    for (size_t idx : which) {
        args.tenants.push_back(rows[idx].tenant);
        args.queues.push_back(rows[idx].queue);
        args.keys.push_back(rows[idx].timer_key);
        args.tokens.push_back(rows[idx].claim_token);
    }
    args.error = error.substr(0, 2000);
    args.error_class = cls;
    args.backoff_min_ms = ctx_.cfg.sweeper_backoff_min_ms;
    args.backoff_max_ms = ctx_.cfg.sweeper_backoff_max_ms;
    args.transient_backoff_ms = ctx_.cfg.sweeper_transient_backoff_ms;
    args.max_attempts = ctx_.cfg.sweeper_max_attempts;
    Query q = fail_query(args);
    q.timeout_ms = ctx_.cfg.stmt_timeout_ms;
    PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
    if (is_answer_lost(r) && !ctx_.hard_stop.load()) {
        recovery_.note_lost("fail", r);
        recovery_.park_rows(owner, which);  // still ours: handed back once connected again
        co_return;
    }
    for (size_t idx : which) book_.move(rows[idx], RowEvent::settled);
    const FailAnswer a = read_fail_answer(r);
    if (!a.readable) {
        // The claims lapse with their lease: the lease is the net under a failed failure.
        if (r.ok) r.message = "the fail call answered unreadably";
        ctx_.note_error("fail", r);
        co_return;
    }
    fig_.released_total += a.released;
    fig_.dlq_total += a.moved;
    if (a.moved > 0)
        ctx_.log.warn(std::to_string(a.moved) + " timer(s) exhausted their attempts and moved to the DLQ (__timer__)");
}

// Hands rows back, token-matched, and forgets them. The lock that made a fire skip a row
// usually lasts one claim statement; a few short retries (25, 50, 100, 200 ms) cover a
// longer holder before the lease does.
Task<void> Drain::hand_back(std::vector<ClaimedTimer> &rows, const std::vector<size_t> &which, int64_t expected,
                            const char *why) {
    std::vector<RowRef> refs;
    refs.reserve(which.size());
    for (size_t idx : which) refs.push_back(row_ref(rows[idx]));
    int64_t released = 0;
    for (int attempt = 0; attempt < 5 && released < expected && !ctx_.hard_stop.load(); ++attempt) {
        if (attempt > 0) co_await loop_delay(ctx_.loop, int64_t(25) << (attempt - 1));
        std::optional<int64_t> n =
            co_await release_rows(ctx_, refs, ctx_.cfg.stmt_timeout_ms, std::string("release (") + why + ")");
        if (!n) break;
        released += *n;
    }
    for (size_t idx : which) book_.move(rows[idx], RowEvent::settled);
    fig_.released_total += released;
}

// Every row of a claim this sweeper still holds goes back (no attempt spent), but a parked one.
Task<void> Drain::hand_back_claim(std::vector<ClaimedTimer> &rows, const char *why) {
    // A parked row is the recovery's to settle (its fire may have committed): left to it.
    std::vector<size_t> still;
    for (size_t i = 0; i < rows.size(); ++i) {
        const std::optional<RowState> st = book_.state_of(rows[i]);
        if (st && *st != RowState::parked) still.push_back(i);
    }
    if (!still.empty()) co_await hand_back(rows, still, static_cast<int64_t>(still.size()), why);
}

// Busy segments are kept, still claimed and held, to be tried again after busy_retry(tries):
// the batch's indexes stay indexes into the claim's own rows, which the kept segments share
// with the claim (a replay of them one timer per call packs each row's own payload).
void Drain::keep(const ClaimRows &rows, FireBatch busy, const CallPlan &plan, int64_t tries) {
    Kept k;
    k.rows = rows;
    k.batch = std::move(busy);
    k.fire_by = plan.fire_by;
    k.tries = tries;
    k.next_try = ctx_.now() + static_cast<uint64_t>(busy_retry(tries).delay_ms);
    kept_.push_back(std::move(k));
    fig_.busy_kept_segments = 0;
    for (const Kept &x : kept_) fig_.busy_kept_segments += static_cast<int64_t>(x.batch.segments.size());
}

// Moves every row of a batch in the claim book.
void Drain::move_rows(const std::vector<ClaimedTimer> &rows, const FireBatch &batch, RowEvent e) {
    for (const PackedSegment &seg : batch.segments)
        for (size_t idx : seg.rows) book_.move(rows[idx], e);
}

// Tries again the kept segments whose time has come, each with its claim's deadline (past
// it, they go back). A partition still held keeps them, with the next retry's plan.
Task<std::optional<PgResult>> Drain::retry_kept() {
    std::vector<Kept> due;
    const uint64_t now = ctx_.now();
    for (auto it = kept_.begin(); it != kept_.end();) {
        if (it->next_try <= now) {
            due.push_back(std::move(*it));
            it = kept_.erase(it);
        } else {
            ++it;
        }
    }
    std::optional<PgResult> refused;
    for (size_t i = 0; i < due.size(); ++i) {
        Kept &k = due[i];
        if (ctx_.stopping.load() || refused) {
            kept_.push_back(std::move(k));  // still held: tried later, or handed back at stop
            continue;
        }
        const BusyRetry r = busy_retry(k.tries);
        CallPlan plan;
        plan.wait = r.wait;
        plan.lock_wait_ms = r.lock_wait_ms;
        plan.fire_by = k.fire_by;
        plan.tries = k.tries + 1;
        ++fig_.busy_retries_total;
        FireEnd end = co_await fire_batch(k.rows, k.batch, plan);  // a refusal is read by run()
        if (end.refused) refused = std::move(end.refused);
    }
    fig_.busy_kept_segments = 0;
    for (const Kept &x : kept_) fig_.busy_kept_segments += static_cast<int64_t>(x.batch.segments.size());
    co_return refused;
}

bool Drain::kept_due() const { return ms_until_kept_due() == 0; }

PartitionKeys Drain::kept_partitions() const {
    PartitionKeys keys;
    for (const Kept &k : kept_)
        for (const PackedSegment &s : k.batch.segments) keys.push_back(PartitionKey{s.tenant, s.queue, s.partition});
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    return keys;
}

bool Drain::holding_back() const {
    if (!around_.empty) return false;
    const PartitionKeys now_kept = kept_partitions();
    HoldBackInput in;
    in.came_back_empty = true;
    in.partition_freed =
        !std::includes(now_kept.begin(), now_kept.end(), around_.left_out.begin(), around_.left_out.end());
    in.woken = around_.woken;
    in.empty_at_mono = around_.at;
    in.now_mono = ctx_.now();
    in.window_ms = hold_back_window_ms();
    return hold_back_claim(in);
}

// The empty-claim band's high end, which the sleep never sets above the max sleep either.
int64_t Drain::hold_back_window_ms() const {
    return std::min(ctx_.cfg.sweeper_empty_claim_max_ms, ctx_.cfg.sweeper_max_sleep_ms);
}

int64_t Drain::ms_until_hold_back_ends() const {
    if (!holding_back()) return INT64_MAX;
    const uint64_t end = around_.at + static_cast<uint64_t>(hold_back_window_ms());
    const uint64_t now = ctx_.now();
    return end <= now ? 0 : static_cast<int64_t>(end - now);
}

int64_t Drain::ms_until_kept_due() const {
    if (kept_.empty()) return INT64_MAX;
    const uint64_t now = ctx_.now();
    uint64_t first = UINT64_MAX;
    for (const Kept &k : kept_) first = std::min(first, k.next_try);
    return first <= now ? 0 : static_cast<int64_t>(first - now);
}

}  // namespace qsw
