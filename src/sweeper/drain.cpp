// B. DRAIN: claim and fire in the same iteration. Claiming everything first and
// firing afterwards lets the first batch's lease expire before the last fire
// commits under load, and two brokers then steal work from each other (a
// livelock that shows only as "the sweeper is slow"). So every worker claims a
// batch, packs it outside any transaction and fires it, with at most one more
// claim in flight meanwhile (drain_worker), and all of them stop claiming once the
// pass has spent half the lease or the cycle's row budget.
#include <sys/random.h>

#include <chrono>
#include <cstring>
#include <random>

#include "codec/codec.hpp"
#include "pg/classify.hpp"
#include "pg/sql_args.hpp"
#include "sweeper/sweeper.hpp"

namespace qsw {

namespace {

// A failure that took the connection with it: no SQLSTATE (the socket died, the deadline
// passed), a connection exception (class 08), or the server ending the session
// (57P01 pg_terminate_backend or a shutdown, 57P02 a crash, 57P03 starting up); or a
// server that turned out to be read-only (a standby, a demoted primary). Nothing says the
// timer is at fault, the rows claimed under it are still this sweeper's, and a fire that
// ended so may have committed: its COMMIT's answer is what was lost.
bool read_only(const PgResult &r) { return r.sqlstate == "25006"; }
bool no_answer(const PgResult &r) {
    if (r.ok) return false;
    const std::string &s = r.sqlstate;
    return s.empty() || read_only(r) || s.rfind("08", 0) == 0 || s == "57P01" || s == "57P02" || s == "57P03";
}

// The pool refused the call before sending it: no connection could serve it.
bool never_sent(const PgResult &r) {
    return r.message.rfind("database unavailable", 0) == 0 || r.message.rfind("sweeper is stopping", 0) == 0;
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
        static thread_local std::mt19937_64 gen{std::random_device{}() ^
                                                static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
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

}  // namespace

Task<Sweeper::DrainResult> Sweeper::drain(std::vector<int16_t> shards, int64_t row_budget) {
    DrainResult acc;
    int64_t rows_left = row_budget;
    const uint64_t deadline = uv_now(&loop_) + static_cast<uint64_t>(cfg_.sweeper_lease_ms / 2);
    if (cfg_.sweeper_parallelism <= 1) {
        co_await drain_worker(shards, acc, rows_left, deadline);
    } else {
        std::vector<Task<void>> workers;
        for (int64_t i = 0; i < cfg_.sweeper_parallelism; ++i)
            workers.push_back(drain_worker(shards, acc, rows_left, deadline));
        co_await join_all(std::move(workers));
    }
    acc.out_of_time = !acc.failed && !acc.empty_claim && uv_now(&loop_) >= deadline;
    acc.capped = !acc.failed && !acc.empty_claim && (rows_left <= 0 || acc.out_of_time);
    co_return acc;
}

// One claim call: reserve nothing (the caller did), send, decode every row (checked), and
// register each claimed row in held_ at once, so a stop or a lost fire hands it back
// whether or not it was ever packed.
Task<void> Sweeper::claim_rows(const std::vector<int16_t> &shards, int64_t want, ClaimCall &out) {
    out.want = want;
    out.started = uv_now(&loop_);
    // The claim's id is its rows' token: if the answer is lost, the sweeper can still name
    // what it holds (lost_claims_) and hand it back once connected again.
    out.id = new_claim_id();
    Query q;
    q.sql = "SELECT tenant_id::text, queue, timer_key, partition, txn, message_id::text, payload, "
            "payload_zstd, encrypted, producer_sub, claim_token::text, deliver_at_ms, late_ms, attempts "
            "FROM queen.log_timers_claim_v2($1::int2[], now(), $2::int, $3::int, $4::int, $5::bigint, $6::uuid)";
    q.params = {text_param(shards_param(shards)), text_param(std::to_string(cfg_.sweeper_lease_ms)),
                text_param(std::to_string(want)), text_param(std::to_string(cfg_.sweeper_fire_rate_per_tenant)),
                text_param(std::to_string(cfg_.sweeper_claim_max_bytes)), text_param(out.id)};
    q.timeout_ms = cfg_.stmt_timeout_ms;
    PgResult r = co_await pool_->query(Lane::maint, std::move(q));
    if (!r.ok) {
        if (no_answer(r) && !never_sent(r) && !read_only(r)) remember_lost_claim(out);
        out.error = std::move(r);
        co_return;
    }
    out.ok = true;
    const int got = r.rows();
    const uint64_t claimed_at = uv_now(&loop_);
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        ++stats_.f.claims_total;
        stats_.f.claimed_total += got;
    }
    out.rows.resize(static_cast<size_t>(got));
    // Every decode is checked: a value that does not read back as written (a session
    // setting the pin missed, a server that answers differently) must never become an
    // empty payload fired without a word, nor an exception that ends the loop.
    for (int i = 0; i < got; ++i) {
        ClaimedTimer &t = out.rows[static_cast<size_t>(i)];
        t.tenant = r.get(i, 0);
        t.queue = r.get(i, 1);
        t.timer_key = r.get(i, 2);
        t.partition = r.get(i, 3);
        t.txn = r.get(i, 4);
        t.claim_token = r.get(i, 10);
        held_[{t.tenant, t.queue, t.timer_key}] = t.claim_token;
        int64_t late = 0, attempts = 0;
        if (!parse_uuid(r.get(i, 5), t.message_id)) out.undecodable = "message_id";
        else if (!pg_bytea_from_text(r.get(i, 6), t.payload)) out.undecodable = "payload (bytea)";
        else if (!parse_i64(r.get(i, 11), t.deliver_at_ms)) out.undecodable = "deliver_at_ms";
        else if (!parse_i64(r.get(i, 12), late)) out.undecodable = "late_ms";
        else if (!parse_i64(r.get(i, 13), attempts)) out.undecodable = "attempts";
        t.payload_zstd = r.get(i, 7) == "t";
        t.encrypted = r.get(i, 8) == "t";
        if (!r.is_null(i, 9)) t.producer_sub = r.get(i, 9);
        // Lateness at fire time = lateness at claim + time spent since the claim,
        // measured on the loop's monotonic clock, so no two clocks are compared.
        t.late_ms = late - static_cast<int64_t>(claimed_at);
        t.attempts = static_cast<int>(attempts);
    }
}

// Hands every row of a claim that this sweeper still holds back to the table (token
// matched, no attempt spent) and forgets it.
Task<void> Sweeper::hand_back_claim(std::vector<ClaimedTimer> &rows) {
    std::vector<size_t> still;
    for (size_t i = 0; i < rows.size(); ++i)
        if (held_.count({rows[i].tenant, rows[i].queue, rows[i].timer_key})) still.push_back(i);
    if (still.empty()) co_return;
    co_await release_rows(rows, still, static_cast<int64_t>(still.size()));
    for (size_t idx : still) held_.erase({rows[idx].tenant, rows[idx].queue, rows[idx].timer_key});
}

// Packs and fires one decoded claim: rejects, deferrals, then its fire batches in order.
// Sets ok = false when the drain must end (an unreadable claim, a class-42 fire error, a
// stop); the claim's rows are then handed back or left in held_ for the stop to hand back.
Task<void> Sweeper::fire_claim(ClaimCall &c, DrainResult &acc, bool &ok, size_t &packed_bytes) {
    std::vector<ClaimedTimer> &rows = c.rows;
    if (!c.undecodable.empty()) {
        // Not the timers' fault: hand the whole claim back (no attempt spent) and back off.
        co_await hand_back_claim(rows);
        PgResult bad;
        bad.message = "the claim's answer has an unreadable " + c.undecodable +
                      " column; the claim was handed back untouched";
        log_.error(bad.message);
        acc.failed = true;
        cycle_failed("claim", bad);
        ok = false;
        co_return;
    }
    PackResult packed = pack_timers(rows, static_cast<size_t>(cfg_.sweeper_max_fire_bytes));
    for (auto &b : packed.batches) packed_bytes += b.bytes;
    if (!packed.rejected.empty()) {
        std::vector<size_t> which;
        for (auto &[idx, reason] : packed.rejected) which.push_back(idx);
        {
            std::lock_guard<std::mutex> g(stats_.mu);
            stats_.f.rejected_total += static_cast<int64_t>(which.size());
        }
        log_.warn(std::to_string(which.size()) + " claimed timer(s) cannot be framed (" +
                  packed.rejected.front().second + (which.size() > 1 ? ", ..." : "") +
                  "); failing them as permanent, each with its own reason");
        // Each timer fails with its own reason: one fail call per distinct reason.
        std::map<std::string, std::vector<size_t>> by_reason;
        for (auto &[idx, reason] : packed.rejected) by_reason[reason].push_back(idx);
        for (auto &[reason, idxs] : by_reason) co_await fail_rows(rows, idxs, "cannot be framed: " + reason, "permanent");
    }
    if (!packed.deferred.empty()) {
        // Over this call's inflation budget: handed back untouched, taken first next time.
        co_await release_rows(rows, packed.deferred, static_cast<int64_t>(packed.deferred.size()));
        for (size_t idx : packed.deferred) held_.erase({rows[idx].tenant, rows[idx].queue, rows[idx].timer_key});
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.inflate_deferred_total += static_cast<int64_t>(packed.deferred.size());
    }
    for (auto &batch : packed.batches) {
        // A requested stop finishes the transaction in flight and fires nothing
        // more: the rest of the claim stays in held_ and is handed back at once.
        if (stopping_.load()) {
            ok = false;
            co_return;
        }
        co_await fire_batch(rows, batch, false, false);
        if (fire_config_failed_) break;
    }
    if (fire_config_failed_) {
        // The rest of this claim goes back too, untouched; the cycle backs off.
        fire_config_failed_ = false;
        co_await hand_back_claim(rows);
        log_.error("fire refused by the database (configuration, SQLSTATE " + fire_config_error_.sqlstate +
                   "): " + fire_config_error_.message +
                   "; no timer spends an attempt on it, the claims were handed back, the fire backs off "
                   "until the privilege or schema is fixed");
        acc.failed = true;
        cycle_failed("fire", fire_config_error_);
        ok = false;
    }
}

// The next claim overlaps the current fire: while claim k is packed and fired on one
// maintenance-lane connection, claim k+1 runs on a second one, so the database's claim
// work and the fire's (and the client's packing) proceed side by side instead of in turn.
// There is still one fire at a time per worker (the design document's parallelism
// default), the fires still commit in claim order, on_fired still follows each commit,
// and the budget (rows and half the lease) is reserved before each claim is sent. The
// next claim is sent only after a full claim (a backlog) and never once a stop is asked;
// while other brokers are in the way it is sent after the fire (contended_recently).
Task<void> Sweeper::drain_worker(const std::vector<int16_t> &shards, DrainResult &acc, int64_t &rows_left,
                                 uint64_t deadline) {
    bool whole = false;  // the last reservation asked for a whole batch (not a budget's rest)
    auto next_want = [&]() -> int64_t {
        if (stopping_.load() || acc.failed || rows_left <= 0 || uv_now(&loop_) >= deadline) return 0;
        if (claim_batch_now_ < cfg_.sweeper_claim_batch) claim_batch_now_ = cfg_.sweeper_claim_batch;
        const int64_t want = std::min(claim_batch_now_, rows_left);
        rows_left -= want;  // reserved, so parallel workers share one budget
        whole = want == claim_batch_now_;
        return want;
    };
    const int64_t want = next_want();
    if (want == 0) co_return;
    ClaimCall cur;
    cur.whole = whole;
    co_await claim_rows(shards, want, cur);
    for (;;) {
        if (!cur.ok) {
            rows_left += cur.want;
            acc.failed = true;
            if (no_answer(cur.error)) note_lost("claim", cur.error);
            cycle_failed("claim", cur.error);
            co_return;
        }
        const int64_t got = static_cast<int64_t>(cur.rows.size());
        rows_left += cur.want - got;
        if (got < cur.want) set_claim_batch(cfg_.sweeper_claim_batch);  // the backlog is over
        if (got == 0) {
            if (acc.claimed == 0) {
                acc.empty_claim = true;
                std::lock_guard<std::mutex> g(stats_.mu);
                ++stats_.f.empty_claims_total;
            }
            co_return;
        }
        acc.claimed += got;
        bool ok = true;
        size_t packed_bytes = 0;
        const int64_t contended_before = fire_contention();
        ClaimCall next;
        const bool more = got == cur.want && cur.undecodable.empty();  // a backlog: claim again
        // Alone, the next claim overlaps this fire; while other brokers are in the way it
        // is sent after the fire instead (see contended_recently).
        const bool overlap = more && !contended_recently();
        const int64_t ahead = overlap ? next_want() : 0;
        next.whole = whole;
        if (ahead > 0) {
            {
                std::lock_guard<std::mutex> g(stats_.mu);
                ++stats_.f.claims_ahead_total;
            }
            std::vector<Task<void>> both;
            both.push_back(fire_claim(cur, acc, ok, packed_bytes));
            both.push_back(claim_rows(shards, ahead, next));
            co_await join_all(std::move(both));
        } else {
            co_await fire_claim(cur, acc, ok, packed_bytes);
        }
        if (!ok) {
            // The drain ends here. A claim already taken ahead goes back at once, unless a
            // stop is under way (held_ then hands everything back together).
            if (ahead > 0) {
                rows_left += ahead - static_cast<int64_t>(next.rows.size());
                if (next.ok && !stopping_.load()) co_await hand_back_claim(next.rows);
                if (!next.ok && no_answer(next.error)) note_lost("claim", next.error);
            }
            co_return;
        }
        acc.moved += got;
        // Met another broker: the batch stays as it is (fire_contention below), and the
        // next claims wait for their fires.
        if (fire_contention() != contended_before) {
            contended_until_mono_ = uv_now(&loop_) + kContendedHoldMs;
            std::lock_guard<std::mutex> g(stats_.mu);
            ++stats_.f.contended_claims_total;
        } else if (cur.whole) {
            adapt_claim_batch(uv_now(&loop_) - cur.started, packed_bytes);
        }
        if (ahead == 0) {
            if (overlap || !more) co_return;  // nothing more is due for us, or the budget is spent
            // In turn: the next claim now that this fire is done (the budget is read now).
            const int64_t want_next = next_want();
            if (want_next == 0) co_return;
            next.whole = whole;
            co_await claim_rows(shards, want_next, next);
        }
        cur = std::move(next);
    }
}

// Other brokers are firing the same timers' partitions when a claim's fires come back busy
// (a partition held) or stale (rows lost to another broker's lock). Then the next claim is
// sent after the fire rather than beside it, for kContendedHoldMs after the last such claim:
// each broker keeps one connection busy instead of two, and the database's cores go to the
// work rather than to the brokers' collisions. Measured (tests/bench/README.md, 4 sweepers,
// 1 / 100 partitions, 2 cores): claims always ahead 15,880 / 13,217 timers/s at 122 / 148
// CPU-ms per 1,000 timers; never ahead 19,268 / 17,666/s at 100 / 109. One sweeper alone
// gains from the overlap (20,317 against 17,722/s), so a broker alone keeps it.
bool Sweeper::contended_recently() { return uv_now(&loop_) < contended_until_mono_; }

// A full claim that was packed and fired in well under its share of the lease, in well
// under one fire transaction's byte cap, says a backlog is being drained faster than the
// batch lets it: double the batch (up to sweeper_claim_batch_max). Every claim and fire
// call costs a round trip, four pinned statements and a plan start whatever its size, so
// bigger batches cut the per-row cost (tests/bench/README.md has the figures). A slow one
// halves it again; a claim that comes back short (the backlog is over) resets it; a claim
// whose fires met another broker leaves it as it is (fire_contention below).
// Limits, so nothing the sweeper promises is traded for speed:
//  - time: grow only under lease/16 for claim + pack + fire, shrink over lease/8; the
//    drain's budget is lease/2, so a grown batch can never eat it in one step;
//  - bytes: grow only while the claim packed into at most half of sweeper_max_fire_bytes,
//    so a grown claim still fits one fire transaction;
//  - per-tenant fairness is per claim (sweeper_fire_rate_per_tenant rows each before any
//    tenant gets more) and holds at any batch size.
void Sweeper::adapt_claim_batch(uint64_t elapsed_ms, size_t packed_bytes) {
    const uint64_t lease = static_cast<uint64_t>(cfg_.sweeper_lease_ms);
    const int64_t ceiling = std::max(cfg_.sweeper_claim_batch, cfg_.sweeper_claim_batch_max);
    if (elapsed_ms * 8 > lease || packed_bytes > static_cast<size_t>(cfg_.sweeper_max_fire_bytes))
        set_claim_batch(std::max(cfg_.sweeper_claim_batch, claim_batch_now_ / 2));
    else if (elapsed_ms * 16 < lease && packed_bytes * 2 <= static_cast<size_t>(cfg_.sweeper_max_fire_bytes))
        set_claim_batch(std::min(ceiling, claim_batch_now_ * 2));
}

// Segments that met another broker on their partition (busy) or lost rows to another
// broker's lock (stale). A claim whose fires met another broker does not grow the batch:
// a bigger batch spans more partitions and holds them longer, which only lengthens the
// queue the brokers form on them. Nor does it shrink it. Measured with the fast way of
// the fire (tests/bench/README.md, 4 sweepers, 1 / 100 partitions): back to the base
// batch on contention, 14.3k / 9.8k timers/s; halved, 14.9k / 13.4k; held, 16.4k / 14.2k.
// Small batches under contention cost more round trips and more busy second calls than
// the queue they avoid. A broker alone keeps growing.
int64_t Sweeper::fire_contention() {
    std::lock_guard<std::mutex> g(stats_.mu);
    return stats_.f.fire_busy_total + stats_.f.stale_total;
}

void Sweeper::set_claim_batch(int64_t rows) {
    claim_batch_now_ = rows;
    std::lock_guard<std::mutex> g(stats_.mu);
    stats_.f.claim_batch = rows;
}

Task<void> Sweeper::fire_batch(std::vector<ClaimedTimer> &rows, FireBatch &batch, bool isolating, bool wait) {
    std::vector<std::string> seg_tenants, seg_queues, seg_parts, keys, tokens;
    std::vector<int64_t> counts, seg_of;
    std::vector<std::string_view> hashes, blobs;
    size_t total_rows = 0;
    for (size_t s = 0; s < batch.segments.size(); ++s) {
        const PackedSegment &seg = batch.segments[s];
        seg_tenants.push_back(seg.tenant);
        seg_queues.push_back(seg.queue);
        seg_parts.push_back(seg.partition);
        counts.push_back(seg.count);
        hashes.emplace_back(seg.hashes);
        blobs.emplace_back(seg.blob);
        for (size_t idx : seg.rows) {
            keys.push_back(rows[idx].timer_key);
            tokens.push_back(rows[idx].claim_token);
            seg_of.push_back(static_cast<int64_t>(s + 1));
            ++total_rows;
        }
    }
    Query q;
    // First without waiting on partitions: segments whose partition another broker (or a
    // push) holds come back "busy", still ours, and go again in a second call that waits.
    q.sql = "SELECT queen.log_timers_fire_v1($1::uuid[], $2::text[], $3::text[], $4::int[], $5, $6, "
            "$7::text[], $8::int[], $9::uuid[], now(), $10::boolean)::text";
    q.params = {text_param(pg_text_array(seg_tenants)),
                text_param(pg_text_array(seg_queues)),
                text_param(pg_text_array(seg_parts)),
                text_param(pg_int_array(counts)),
                binary_param(pg_bytea_array_binary(hashes), kByteaArrayOid),
                binary_param(pg_bytea_array_binary(blobs), kByteaArrayOid),
                text_param(pg_text_array(keys)),
                text_param(pg_int_array(seg_of)),
                text_param(pg_text_array(tokens)),
                text_param(wait ? "true" : "false")};
    q.timeout_ms = cfg_.stmt_timeout_ms;
    PgResult r = co_await pool_->query(Lane::maint, std::move(q));
    auto forget = [&](const PackedSegment &seg) {
        for (size_t idx : seg.rows) held_.erase({rows[idx].tenant, rows[idx].queue, rows[idx].timer_key});
    };
    if (r.ok && r.rows() == 1) {
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(r.get(0, 0));
        } catch (const std::exception &e) {
            log_.error(std::string("fire answer unreadable: ") + e.what());
            co_return;
        }
        const auto &segs = j["segments"];
        const int64_t now_mono = static_cast<int64_t>(uv_now(&loop_));
        int64_t fired = 0, stale = 0, dup = 0, released = 0, lag_max = 0;
        std::vector<int64_t> lags;
        struct Note {
            size_t seg;
            int64_t base;
        };
        std::vector<Note> fired_notes;
        FireBatch busy;
        std::vector<size_t> stale_rows;
        int64_t stale_unheld = 0;
        for (size_t s = 0; s < batch.segments.size() && s < segs.size(); ++s) {
            const auto &sj = segs[s];
            const std::string status = sj.value("status", "");
            const PackedSegment &seg = batch.segments[s];
            if (status == "fired") {
                fired += seg.count;
                for (size_t idx : seg.rows) {
                    int64_t lag = std::max<int64_t>(rows[idx].late_ms + now_mono, 0);
                    lags.push_back(lag);
                    lag_max = std::max(lag_max, lag);
                }
                fired_notes.push_back({s, sj.value("baseOffset", int64_t(-1))});
            } else if (status == "stale") {
                ++stale;
                const int64_t held = sj.value("held", int64_t(0));
                released += held;
                stale_unheld += static_cast<int64_t>(seg.count) - held;
                stale_rows.insert(stale_rows.end(), seg.rows.begin(), seg.rows.end());
            } else if (status == "duplicate") {
                dup += sj.value("duplicates", int64_t(0));
                released += sj.value("released", int64_t(0));
            } else if (status == "busy") {
                busy.segments.push_back(seg);  // still claimed and held: not forgotten
                busy.bytes += seg.bytes;
                continue;
            }
            forget(seg);
        }
        {
            std::lock_guard<std::mutex> g(stats_.mu);
            auto &f = stats_.f;
            f.fired_total += fired;
            f.fired_segments_total += static_cast<int64_t>(fired_notes.size());
            f.stale_total += stale;
            f.duplicate_total += dup;
            f.released_total += released;
            ++f.fire_txns_total;
            f.fire_bytes_total += static_cast<int64_t>(batch.bytes - busy.bytes);
            f.fire_busy_total += static_cast<int64_t>(busy.segments.size());
            for (auto l : lags) f.fire_lag.add(l);
            f.fire_lag_max_ms = std::max(f.fire_lag_max_ms, lag_max);
            if (awaiting_resume_ && fired > 0) {
                f.failover.resumed_unix_ms = wall_now_ms();
                f.failover.last_gap_ms = f.failover.resumed_unix_ms - f.failover.last_lost_unix_ms;
            }
        }
        if (awaiting_resume_ && fired > 0) {
            awaiting_resume_ = false;
            std::string where, gap;
            {
                std::lock_guard<std::mutex> g(stats_.mu);
                where = stats_.f.failover.server;
                gap = std::to_string(stats_.f.failover.last_gap_ms);
            }
            log_.info("firing resumed on " + (where.empty() ? std::string("the database") : where) + ", " + gap +
                      " ms after the connection was lost");
        }
        // After the commit, never before: a host can wake its parked consumers now.
        if (fired_fn_) {
            for (auto &n : fired_notes) {
                const PackedSegment &seg = batch.segments[n.seg];
                try {
                    CallbackScope in_callback;
                    fired_fn_(fired_user_, seg.tenant.c_str(), seg.queue.c_str(), seg.partition.c_str(), seg.count,
                              n.base);
                } catch (...) {
                    log_.error("the host's on_fired callback threw; ignored");
                }
            }
        }
        publish_pool();  // a long drain still shows its pool figures as it goes
        // A row the fire could not lock is not necessarily lost to us: another broker's
        // claim may have held it for an instant (SKIP LOCKED) while our token is still on
        // it. Hand such rows back now, token-matched, instead of leaving them to the lease.
        if (stale_unheld > 0 && !hard_stop_.load()) co_await release_rows(rows, stale_rows, stale_unheld);
        if (!busy.segments.empty() && !stopping_.load()) co_await fire_batch(rows, busy, isolating, true);
        co_return;
    }
    if (r.ok) r.message = "fire returned no row";
    const ErrorClass cls = classify_sqlstate(r.sqlstate);
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        auto &f = stats_.f;
        if (cls == ErrorClass::transient) ++f.fire_failures_transient;
        else if (cls == ErrorClass::config) ++f.fire_failures_config;
        else ++f.fire_failures_permanent;
    }
    if (cls == ErrorClass::config && !hard_stop_.load()) {
        // A privilege or schema mistake (class 42: a REVOKE, a dropped table) is never one
        // timer's fault: replaying them one by one would only spend every timer's attempts
        // and dead-letter them all within seconds. Hand the claims back token-matched
        // (no attempt spent), stop this drain, back off, and say so loudly.
        std::vector<size_t> all;
        for (auto &seg : batch.segments)
            for (size_t idx : seg.rows) all.push_back(idx);
        fire_config_error_ = r;
        fire_config_failed_ = true;
        co_await release_rows(rows, all, static_cast<int64_t>(all.size()));
        for (size_t idx : all) held_.erase({rows[idx].tenant, rows[idx].queue, rows[idx].timer_key});
        co_return;
    }
    note_error("fire", r);
    log_.warn(std::string("fire of ") + std::to_string(total_rows) + " timer(s) in " +
              std::to_string(batch.segments.size()) + " segment(s) failed (" + error_class_name(cls) +
              (r.sqlstate.empty() ? "" : ", SQLSTATE " + r.sqlstate) + "): " + r.message);
    if (hard_stop_.load()) co_return;
    if (no_answer(r)) {
        // The connection took the answer with it. Sent, the fire may have committed (its
        // commit may even have reached a standby that is primary now): it is resolved from
        // the log once connected again. Either way its claims stay ours, to be handed back
        // then rather than left to the lease, and no attempt is spent on them.
        const bool in_doubt = !read_only(r) && !never_sent(r);
        note_lost("fire", r);
        park(rows, batch, nullptr, in_doubt);
        co_return;
    }
    std::vector<size_t> all;
    for (auto &seg : batch.segments)
        for (size_t idx : seg.rows) all.push_back(idx);
    if (cls != ErrorClass::transient && !isolating && cfg_.sweeper_isolate_on_permanent && all.size() > 1) {
        // Replay one timer per call: the poisoned one fails alone and the others
        // are delivered, instead of the whole batch waiting on it.
        for (size_t idx : all) {
            if (stopping_.load()) co_return;  // the rest is released at stop
            std::vector<ClaimedTimer> one{rows[idx]};
            PackResult p = pack_timers(one, static_cast<size_t>(cfg_.sweeper_max_fire_bytes));
            for (auto &b : p.batches) co_await fire_batch(one, b, true, true);
        }
        co_return;
    }
    if (isolating && cls != ErrorClass::transient) {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.poisoned_total += static_cast<int64_t>(all.size());
    }
    co_await fail_rows(rows, all, r.message, error_class_name(cls));
}

Task<void> Sweeper::fail_rows(std::vector<ClaimedTimer> &rows, const std::vector<size_t> &which,
                              const std::string &error, const std::string &cls) {
    if (which.empty()) co_return;
    std::vector<std::string> tenants, queues, keys, tokens;
    for (size_t idx : which) {
        tenants.push_back(rows[idx].tenant);
        queues.push_back(rows[idx].queue);
        keys.push_back(rows[idx].timer_key);
        tokens.push_back(rows[idx].claim_token);
    }
    Query q;
    // Exhaustion and the move to the DLQ are one decision, in one transaction: a host that
    // reschedules the timer meanwhile is never told "rescheduled" about a dead-lettered one.
    q.sql = "SELECT queen.log_timers_fail_v2($1::uuid[], $2::text[], $3::text[], $4::uuid[], $5, $6, now(), "
            "$7::int, $8::int, $9::int, $10::int)::text";
    q.params = {text_param(pg_text_array(tenants)),
                text_param(pg_text_array(queues)),
                text_param(pg_text_array(keys)),
                text_param(pg_text_array(tokens)),
                text_param(error.substr(0, 2000)),
                text_param(cls),
                text_param(std::to_string(cfg_.sweeper_backoff_min_ms)),
                text_param(std::to_string(cfg_.sweeper_backoff_max_ms)),
                text_param(std::to_string(cfg_.sweeper_transient_backoff_ms)),
                text_param(std::to_string(cfg_.sweeper_max_attempts))};
    q.timeout_ms = cfg_.stmt_timeout_ms;
    PgResult r = co_await pool_->query(Lane::maint, std::move(q));
    if (no_answer(r) && !hard_stop_.load()) {
        // Still ours: handed back once connected again.
        note_lost("fail", r);
        park(rows, FireBatch{}, &which, false);
        co_return;
    }
    for (size_t idx : which) held_.erase({rows[idx].tenant, rows[idx].queue, rows[idx].timer_key});
    if (!r.ok) {
        // The claims lapse with their lease: the lease is the net under a failed failure.
        note_error("fail", r);
        co_return;
    }
    nlohmann::json j = nlohmann::json::parse(r.get(0, 0), nullptr, false);
    if (j.is_discarded()) co_return;
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.released_total += j.value("released", int64_t(0));
    }
    const int64_t moved = j.value("moved", int64_t(0));
    if (moved <= 0) co_return;
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.dlq_total += moved;
    }
    log_.warn(std::to_string(moved) + " timer(s) exhausted their attempts and moved to the DLQ (__timer__)");
}

Task<void> Sweeper::release_rows(std::vector<ClaimedTimer> &rows, const std::vector<size_t> &which,
                                  int64_t expected) {
    std::vector<std::string> tenants, queues, keys, tokens;
    for (size_t idx : which) {
        tenants.push_back(rows[idx].tenant);
        queues.push_back(rows[idx].queue);
        keys.push_back(rows[idx].timer_key);
        tokens.push_back(rows[idx].claim_token);
    }
    int64_t released = 0;
    // The lock that made the fire skip a row usually lasts one claim statement; a few
    // short retries (25, 50, 100, 200 ms) cover a longer holder before the lease does.
    for (int attempt = 0; attempt < 5 && released < expected && !stopping_.load(); ++attempt) {
        if (attempt > 0) co_await delay(int64_t(25) << (attempt - 1));
        Query q;
        q.sql = "SELECT queen.log_timers_release_v1($1::uuid[], $2::text[], $3::text[], $4::uuid[])";
        q.params = {text_param(pg_text_array(tenants)), text_param(pg_text_array(queues)),
                    text_param(pg_text_array(keys)), text_param(pg_text_array(tokens))};
        q.timeout_ms = cfg_.stmt_timeout_ms;
        PgResult r = co_await pool_->query(Lane::maint, std::move(q));
        if (!r.ok || r.rows() != 1) {
            note_error("release of stale rows", r);
            break;
        }
        released += std::stoll(r.get(0, 0));
    }
    std::lock_guard<std::mutex> g(stats_.mu);
    stats_.f.released_total += released;
}

Task<void> Sweeper::release_held() {
    // Fires a lost connection left unanswered are resolved first, so the host hears of
    // those that committed; what is left of them is released with the rest below.
    if (!parked_.empty() && pool_->up()) co_await recover_after_loss();
    if (held_.empty()) co_return;
    std::vector<std::string> tenants, queues, keys, tokens;
    for (auto &[k, tok] : held_) {
        tenants.push_back(std::get<0>(k));
        queues.push_back(std::get<1>(k));
        keys.push_back(std::get<2>(k));
        tokens.push_back(tok);
    }
    Query q;
    q.sql = "SELECT queen.log_timers_release_v1($1::uuid[], $2::text[], $3::text[], $4::uuid[])";
    q.params = {text_param(pg_text_array(tenants)), text_param(pg_text_array(queues)),
                text_param(pg_text_array(keys)), text_param(pg_text_array(tokens))};
    q.timeout_ms = cfg_.stmt_timeout_ms;
    PgResult r = co_await pool_->query(Lane::maint, std::move(q));
    if (!r.ok) {
        note_error("release at stop", r);
        log_.warn("could not release " + std::to_string(held_.size()) + " claim(s) at stop: " + r.message +
                  "; they lapse with their lease");
        co_return;
    }
    const int64_t n = r.rows() == 1 ? std::stoll(r.get(0, 0)) : 0;
    held_.clear();
    parked_.clear();
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.released_on_stop_total += n;
    }
    log_.info("released " + std::to_string(n) + " claim(s) at stop");
}


// ---------------------------------------------------------------------------------------
// Failover: what a lost connection leaves behind
// ---------------------------------------------------------------------------------------

void Sweeper::note_lost(const char *phase, const PgResult &r) {
    const bool ro = read_only(r);
    std::string was;
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        auto &fo = stats_.f.failover;
        ++fo.lost_total;
        if (ro) ++fo.read_only_total;
        // One loss, many failed calls: the first one since the server was last found dates it.
        if (!awaiting_resume_ || reconnected_since_loss_) {
            fo.last_lost_unix_ms = wall_now_ms();
            fo.last_lost_phase = phase;
            fo.last_lost_error = r.message;
            fo.lost_server = fo.server;
        }
        was = fo.server;
    }
    if (!awaiting_resume_ || reconnected_since_loss_) {
        log_.warn(std::string("connection to ") + (was.empty() ? std::string("the database") : was) + " lost during " +
                  phase + (ro ? " (the server is read-only: a standby or a demoted primary)" : "") + ": " +
                  r.message + "; claims held are kept and handed back once connected again, no attempt is spent");
    }
    awaiting_resume_ = true;
    reconnected_since_loss_ = false;
    identify_pending_ = true;
}

void Sweeper::park(std::vector<ClaimedTimer> &rows, const FireBatch &batch, const std::vector<size_t> *only,
                   bool in_doubt) {
    ParkedFire pf;
    pf.in_doubt = in_doubt;
    int64_t n = 0;
    if (only) {
        // Rows of a fail call: nothing of theirs can be in the log, only handed back.
        for (size_t idx : *only) {
            ParkedSegment ps;
            ps.tenant = rows[idx].tenant;
            ps.queue = rows[idx].queue;
            ps.partition = rows[idx].partition;
            ps.rows.emplace_back(rows[idx].timer_key, rows[idx].claim_token);
            pf.segments.push_back(std::move(ps));
            ++n;
        }
    } else {
        for (const PackedSegment &seg : batch.segments) {
            ParkedSegment ps;
            ps.tenant = seg.tenant;
            ps.queue = seg.queue;
            ps.partition = seg.partition;
            ps.count = seg.count;
            ps.hashes = seg.hashes;
            for (size_t idx : seg.rows) ps.rows.emplace_back(rows[idx].timer_key, rows[idx].claim_token);
            n += static_cast<int64_t>(seg.rows.size());
            pf.segments.push_back(std::move(ps));
        }
    }
    parked_.push_back(std::move(pf));
    std::lock_guard<std::mutex> g(stats_.mu);
    auto &fo = stats_.f.failover;
    fo.parked_claims += n;
    if (in_doubt) {
        ++fo.in_doubt_fires_total;
        ++fo.in_doubt_pending;
    }
}

void Sweeper::remember_lost_claim(const ClaimCall &c) {
    if (server_now_got_mono_ == 0) return;  // no probe answered yet: no clock to place it on
    // The claim's now() was taken on the server between its send and now (the loss). On the
    // server's clock, as the last probe relates it to the loop's: S(m) lies within
    // [probe_now + m - probe_got, probe_now + m - probe_sent]. Two seconds more each side
    // for the clocks' drift since. Every row of the claim sits at visible_at = now() + lease.
    constexpr int64_t kSlackMs = 2000;
    const uint64_t lost = uv_now(&loop_);
    const int64_t lo = server_now_unix_ms_ + static_cast<int64_t>(c.started) - static_cast<int64_t>(server_now_got_mono_);
    const int64_t hi = server_now_unix_ms_ + static_cast<int64_t>(lost) - static_cast<int64_t>(server_now_sent_mono_);
    LostClaim lc;
    lc.id = c.id;
    lc.lease_from_unix_ms = lo - kSlackMs + cfg_.sweeper_lease_ms;
    lc.lease_to_unix_ms = hi + kSlackMs + cfg_.sweeper_lease_ms;
    lc.forget_at_mono = lost + static_cast<uint64_t>(cfg_.sweeper_lease_ms + kSlackMs);
    // Bounded: a loss leaves at most one claim per worker and one ahead; the oldest go first.
    constexpr size_t kMaxRemembered = 64;
    if (lost_claims_.size() >= kMaxRemembered) lost_claims_.erase(lost_claims_.begin());
    lost_claims_.push_back(std::move(lc));
    std::lock_guard<std::mutex> g(stats_.mu);
    ++stats_.f.failover.lost_claims_total;
    stats_.f.failover.lost_claims_pending = static_cast<int64_t>(lost_claims_.size());
}

// Claims whose answer was lost, handed back by id as soon as the server answers again, so
// their rows are due at once instead of after the lease (and whichever broker claims them
// next fires them). A claim that never committed has no rows; one past its lease is
// forgotten (its rows are anyone's again).
Task<void> Sweeper::hand_back_lost_claims() {
    const uint64_t now = uv_now(&loop_);
    std::erase_if(lost_claims_, [now](const LostClaim &lc) { return now >= lc.forget_at_mono; });
    while (!lost_claims_.empty() && !stopping_.load()) {
        const LostClaim &lc = lost_claims_.front();
        Query q;
        q.sql = "SELECT queen.log_timers_release_claims_v1(ARRAY[$1::uuid], "
                "to_timestamp($2::double precision / 1000), to_timestamp($3::double precision / 1000))";
        q.params = {text_param(lc.id), text_param(std::to_string(lc.lease_from_unix_ms)),
                    text_param(std::to_string(lc.lease_to_unix_ms))};
        q.timeout_ms = cfg_.stmt_timeout_ms;
        PgResult r = co_await pool_->query(Lane::maint, std::move(q));
        int64_t released = 0;
        if (!r.ok || r.rows() != 1 || !parse_i64(r.get(0, 0), released)) {
            if (r.ok) r.message = "the hand-back of a lost claim answered unreadably";
            note_error("hand-back of a lost claim", r);
            co_return;  // kept: the next cycle tries again
        }
        lost_claims_.erase(lost_claims_.begin());
        {
            std::lock_guard<std::mutex> g(stats_.mu);
            auto &fo = stats_.f.failover;
            fo.lost_claims_handed_back_total += released;
            fo.handed_back_total += released;
            fo.lost_claims_pending = static_cast<int64_t>(lost_claims_.size());
            stats_.f.released_total += released;
        }
        if (released > 0)
            log_.info("handed back " + std::to_string(released) +
                      " timer(s) of a claim whose answer the lost connection took, instead of waiting out the lease");
    }
    std::lock_guard<std::mutex> g(stats_.mu);
    stats_.f.failover.lost_claims_pending = static_cast<int64_t>(lost_claims_.size());
}

Task<bool> Sweeper::identify_server() {
    // Which server answers now. Behind a bouncer this is still the PostgreSQL server, so
    // the stats name the host that failed and the one that took over.
    Query q;
    q.sql = "SELECT coalesce(host(inet_server_addr()), 'local') || ':' || "
            "coalesce(inet_server_port()::text, current_setting('port')), pg_is_in_recovery()";
    q.timeout_ms = cfg_.stmt_timeout_ms;
    PgResult r = co_await pool_->query(Lane::maint, std::move(q));
    if (!r.ok || r.rows() != 1) {
        if (r.sqlstate == "25006") {
            std::lock_guard<std::mutex> g(stats_.mu);
            ++stats_.f.failover.read_only_total;
        }
        co_return false;
    }
    const std::string server = r.get(0, 0);
    const bool in_recovery = r.get(0, 1) == "t";
    identify_pending_ = false;
    std::string before;
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        auto &fo = stats_.f.failover;
        before = fo.server;
        if (!before.empty() && before != server) ++fo.server_changes_total;
        fo.server = server;
        fo.server_in_recovery = in_recovery;
        // The first identification after the last recorded loss dates the reconnection.
        if (fo.last_lost_unix_ms >= 0 && fo.reconnected_unix_ms < fo.last_lost_unix_ms)
            fo.reconnected_unix_ms = wall_now_ms();
    }
    const bool again = awaiting_resume_ && !reconnected_since_loss_;
    reconnected_since_loss_ = true;
    if (before.empty()) log_.info("connected to " + server);
    else if (before != server) log_.warn("connected to " + server + " (was " + before + "): the database failed over");
    else if (again) log_.info("connected to " + server + " again");
    co_return true;
}

Task<void> Sweeper::recover_after_loss() {
    // Every connection the pool lost may mean another server now: identify it again.
    const PoolFigures pf = pool_->figures();
    if (pf.disconnects_total > seen_disconnects_) {
        seen_disconnects_ = pf.disconnects_total;
        bool known;
        {
            std::lock_guard<std::mutex> g(stats_.mu);
            known = !stats_.f.failover.server.empty();
        }
        // Lost while nothing of ours was in flight (an idle loop, a probe): still a loss.
        if (known && (!awaiting_resume_ || reconnected_since_loss_)) {
            PgResult lost;
            lost.message = pf.last_error;
            note_lost("connection", lost);
        }
        identify_pending_ = true;
    }
    if (!pool_->up()) co_return;
    if (identify_pending_ && !co_await identify_server()) co_return;
    if (!lost_claims_.empty()) co_await hand_back_lost_claims();
    if (parked_.empty()) co_return;

    // One statement looks at every parked segment: are its timers still in the table
    // (then its fire did not commit: the fire deletes them in the same transaction), is
    // any of them locked by someone (a fire still running on a connection we lost sight
    // of: undecided, look again next cycle), and is exactly this segment in the log
    // (the same transaction hashes at the offset the dedup index gives for the first)?
    std::vector<int64_t> seg_i, row_i;
    std::vector<std::string> seg_tenants, seg_queues, row_keys;
    std::vector<std::string_view> seg_hashes;
    std::vector<std::pair<size_t, size_t>> where;  // flat segment index -> (fire, segment)
    for (size_t f = 0; f < parked_.size(); ++f) {
        for (size_t s = 0; s < parked_[f].segments.size(); ++s) {
            const ParkedSegment &ps = parked_[f].segments[s];
            const int64_t i = static_cast<int64_t>(where.size());
            where.emplace_back(f, s);
            seg_i.push_back(i);
            seg_tenants.push_back(ps.tenant);
            seg_queues.push_back(ps.queue);
            seg_hashes.emplace_back(ps.hashes);
            for (auto &[key, tok] : ps.rows) {
                row_i.push_back(i);
                row_keys.push_back(key);
            }
        }
    }
    Query q;
    // queen.log_timers_in_doubt_v1 (SECURITY DEFINER) answers for a role that reads no table.
    q.sql = "SELECT seg, present, unlocked, base_offset FROM queen.log_timers_in_doubt_v1("
            "$1::int[], $2::uuid[], $3::text[], $4::bytea[], $5::int[], $6::text[])";
    q.params = {text_param(pg_int_array(seg_i)), text_param(pg_text_array(seg_tenants)),
                text_param(pg_text_array(seg_queues)),
                binary_param(pg_bytea_array_binary(seg_hashes), kByteaArrayOid), text_param(pg_int_array(row_i)),
                text_param(pg_text_array(row_keys))};
    q.timeout_ms = cfg_.stmt_timeout_ms;
    PgResult r = co_await pool_->query(Lane::maint, std::move(q));
    if (r.sqlstate == "42501") {
        // A role holding queen_sweeper only may not read the tables: no check is possible.
        // The claims still go back at once, token-matched, one parked call at a time. A call
        // whose rows all come back did not commit; any other stays unknown and unannounced.
        if (!check_refused_logged_) {
            log_.warn("the in-doubt check needs to read queen.log_timers and the log (" + r.message +
                      "); claims of lost calls are handed back, but a fire whose answer was lost cannot be "
                      "confirmed, so the host is not told of it");
            check_refused_logged_ = true;
        }
        while (!parked_.empty()) {
            ParkedFire &pf = parked_.front();
            std::vector<std::string> t, qu, k, tok;
            for (const ParkedSegment &ps : pf.segments)
                for (auto &[key, token] : ps.rows) {
                    t.push_back(ps.tenant);
                    qu.push_back(ps.queue);
                    k.push_back(key);
                    tok.push_back(token);
                }
            Query rq;
            rq.sql = "SELECT queen.log_timers_release_v1($1::uuid[], $2::text[], $3::text[], $4::uuid[])";
            rq.params = {text_param(pg_text_array(t)), text_param(pg_text_array(qu)), text_param(pg_text_array(k)),
                         text_param(pg_text_array(tok))};
            rq.timeout_ms = cfg_.stmt_timeout_ms;
            PgResult rr = co_await pool_->query(Lane::maint, std::move(rq));
            if (!rr.ok || rr.rows() != 1) {
                note_error("hand-back after reconnecting", rr);
                co_return;
            }
            const int64_t released = std::stoll(rr.get(0, 0));
            {
                std::lock_guard<std::mutex> g(stats_.mu);
                auto &fo = stats_.f.failover;
                fo.handed_back_total += released;
                fo.parked_claims -= static_cast<int64_t>(k.size());
                stats_.f.released_total += released;
                if (pf.in_doubt && !pf.counted) {
                    --fo.in_doubt_pending;
                    ++(released == static_cast<int64_t>(k.size()) ? fo.in_doubt_not_fired_total
                                                                   : fo.in_doubt_unknown_total);
                }
            }
            for (size_t i = 0; i < k.size(); ++i) held_.erase({t[i], qu[i], k[i]});
            parked_.erase(parked_.begin());
        }
        co_return;
    }
    if (!r.ok || r.rows() != static_cast<int>(where.size())) {
        if (r.ok) r.message = "the in-doubt check answered " + std::to_string(r.rows()) + " rows";
        note_error("in-doubt check", r);
        co_return;
    }
    struct Seen {
        int64_t present = 0, unlocked = 0, base = -1;
    };
    std::vector<Seen> seen(where.size());
    for (int i = 0; i < r.rows(); ++i) {
        const size_t at = static_cast<size_t>(std::stoll(r.get(i, 0)));
        if (at >= seen.size()) continue;
        seen[at].present = std::stoll(r.get(i, 1));
        seen[at].unlocked = std::stoll(r.get(i, 2));
        if (!r.is_null(i, 3)) seen[at].base = std::stoll(r.get(i, 3));
    }
    r = PgResult{};

    std::vector<std::string> rel_tenants, rel_queues, rel_keys, rel_tokens;
    std::vector<size_t> decided;
    int64_t fired_rows = 0, fired_segs = 0, fired_calls = 0, not_fired_calls = 0;
    size_t flat = 0;
    for (size_t f = 0; f < parked_.size(); ++f) {
        ParkedFire &pf = parked_[f];
        const size_t first = flat;
        flat += pf.segments.size();
        bool undecided = false;
        for (size_t s = first; s < flat; ++s)
            if (seen[s].unlocked < seen[s].present) undecided = true;
        if (undecided) continue;
        decided.push_back(f);
        bool any_fired = false;
        for (size_t s = first; s < flat; ++s) {
            const ParkedSegment &ps = pf.segments[s - first];
            if (seen[s].present == 0 && seen[s].base >= 0 && !ps.hashes.empty()) {
                // Committed, answer lost: the host hears of it now, once.
                any_fired = true;
                fired_rows += ps.count;
                for (auto &[key, tok] : ps.rows) held_.erase({ps.tenant, ps.queue, key});
                ++fired_segs;
                if (fired_fn_) {
                    try {
                        CallbackScope in_callback;
                        fired_fn_(fired_user_, ps.tenant.c_str(), ps.queue.c_str(), ps.partition.c_str(),
                                  static_cast<uint32_t>(ps.count), seen[s].base);
                    } catch (...) {
                        log_.error("the host's on_fired callback threw; ignored");
                    }
                }
            } else if (seen[s].present > 0) {
                for (auto &[key, tok] : ps.rows) {
                    rel_tenants.push_back(ps.tenant);
                    rel_queues.push_back(ps.queue);
                    rel_keys.push_back(key);
                    rel_tokens.push_back(tok);
                }
            }
        }
        if (pf.in_doubt && !pf.counted) {
            pf.counted = true;
            ++(any_fired ? fired_calls : not_fired_calls);
        }
        // Announced segments must never be announced again, whatever the release does.
        std::vector<ParkedSegment> left;
        for (size_t s = first; s < flat; ++s)
            if (!(seen[s].present == 0 && seen[s].base >= 0 && !pf.segments[s - first].hashes.empty()))
                left.push_back(std::move(pf.segments[s - first]));
        pf.segments = std::move(left);
    }
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        auto &f = stats_.f;
        f.fired_total += fired_rows;
        f.fired_segments_total += fired_segs;
        f.failover.in_doubt_fired_total += fired_calls;
        f.failover.in_doubt_not_fired_total += not_fired_calls;
        f.failover.in_doubt_pending -= fired_calls + not_fired_calls;
        f.failover.in_doubt_timers_announced_total += fired_rows;
    }
    if (fired_calls + not_fired_calls > 0)
        log_.info("resolved " + std::to_string(fired_calls + not_fired_calls) + " fire(s) whose answer was lost: " +
                  std::to_string(fired_calls) + " committed (" + std::to_string(fired_rows) +
                  " timer(s) announced now), " + std::to_string(not_fired_calls) + " not committed");
    if (decided.empty()) co_return;

    int64_t released = 0;
    if (!rel_keys.empty()) {
        Query rq;
        rq.sql = "SELECT queen.log_timers_release_v1($1::uuid[], $2::text[], $3::text[], $4::uuid[])";
        rq.params = {text_param(pg_text_array(rel_tenants)), text_param(pg_text_array(rel_queues)),
                     text_param(pg_text_array(rel_keys)), text_param(pg_text_array(rel_tokens))};
        rq.timeout_ms = cfg_.stmt_timeout_ms;
        PgResult rr = co_await pool_->query(Lane::maint, std::move(rq));
        if (!rr.ok || rr.rows() != 1) {
            // Kept parked (less what was announced): the next cycle tries again.
            note_error("hand-back after reconnecting", rr);
            co_return;
        }
        released = std::stoll(rr.get(0, 0));
    }
    // Decided fires leave the books, their rows with them, in one pass from the back.
    for (auto it = decided.rbegin(); it != decided.rend(); ++it) {
        for (const ParkedSegment &ps : parked_[*it].segments)
            for (auto &[key, tok] : ps.rows) held_.erase({ps.tenant, ps.queue, key});
        parked_.erase(parked_.begin() + static_cast<std::ptrdiff_t>(*it));
    }
    int64_t still = 0;
    for (const ParkedFire &pf : parked_)
        for (const ParkedSegment &ps : pf.segments) still += static_cast<int64_t>(ps.rows.size());
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.failover.handed_back_total += released;
        stats_.f.failover.parked_claims = still;
        stats_.f.released_total += released;
    }
    if (released > 0)
        log_.info("handed back " + std::to_string(released) +
                  " claim(s) held when the connection was lost, instead of waiting out the lease");
}

}  // namespace qsw
