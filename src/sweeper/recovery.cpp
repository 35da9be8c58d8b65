// The recovery after a lost connection (see recovery.hpp).
#include "sweeper/recovery.hpp"

#include <algorithm>

#include "pg/calls.hpp"
#include "pg/classify.hpp"
#include "pg/sql_args.hpp"
#include "pg/statements.hpp"
#include "sweeper/sweeper.hpp"

namespace qsw {

Task<void> Recovery::run() {
    notice_disconnects();
    if (!ctx_.pool.up()) co_return;
    if (identify_due(link_)) {
        // Into a variable, not `identify_due(link_) && !co_await ...`: see settle() in base/task.hpp.
        const bool identified = co_await identify_server();
        if (!identified) co_return;
    }
    if (!lost_claims_.empty()) co_await hand_back_lost_claims();
    if (!parked_.empty()) co_await resolve_parked();
    if (!to_check_.empty()) co_await check_recent_fires();
}

size_t Recovery::Announced::bytes() const {
    size_t n = hashes.size() + sizeof(Announced);
    for (const auto &[key, token] : rows) n += key.size() + token.size() + sizeof(rows[0]);
    return n;
}

void Recovery::remember_fired(const std::vector<ClaimedTimer> &rows, const PackedSegment &seg, int64_t base_offset) {
    Announced a{seg.tenant, seg.queue, seg.partition, seg.hashes, seg.count, base_offset, ctx_.now(), {}};
    a.rows.reserve(seg.rows.size());
    for (size_t idx : seg.rows) a.rows.emplace_back(rows[idx].timer_key, rows[idx].claim_token);
    const size_t bytes = a.bytes();
    // Bounded in time and in bytes: the oldest go first.
    while (!announced_.empty() && (a.at_mono - announced_.front().at_mono > kAnnouncedWindowMs ||
                                   announced_bytes_ + bytes > kAnnouncedMaxBytes)) {
        announced_bytes_ -= announced_.front().bytes();
        announced_.pop_front();
    }
    announced_bytes_ += bytes;
    announced_.push_back(std::move(a));
}

// After a failover: the fires announced in the last seconds on the old server, looked for
// in the new one's log (the same segment at the same offset, as the in-doubt check finds
// it). With an asynchronous standby a commit the old primary acknowledged may never have
// reached it: that fire is gone, its timers are due again and fire again, and the host
// heard of them twice. The sweeper cannot prevent it; it says how many.
Task<void> Recovery::check_recent_fires() {
    std::vector<Announced> look = std::move(to_check_);
    to_check_.clear();
    InDoubtArgs args;  // the segments only: no key to look for
    for (size_t i = 0; i < look.size(); ++i) {
        args.segments.push_back(static_cast<int64_t>(i));
        args.tenants.push_back(look[i].tenant);
        args.queues.push_back(look[i].queue);
        args.hashes.emplace_back(look[i].hashes);
    }
    Query q = in_doubt_query(args);
    q.timeout_ms = ctx_.cfg.stmt_timeout_ms;
    PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
    if (!r.ok || r.rows() != static_cast<int>(look.size())) {
        if (r.ok) r.message = "the check of recent fires answered " + std::to_string(r.rows()) + " rows";
        ctx_.note_error("check of recent fires", r);
        co_return;
    }
    int64_t lost_timers = 0, lost_segments = 0;
    std::vector<RowRef> back;  // a lost fire's claim may have reached the standby: hand it back
    for (const InDoubtRow &row : read_in_doubt_rows(r)) {
        if (!row.readable || row.seg < 0 || static_cast<size_t>(row.seg) >= look.size()) continue;
        const Announced &a = look[static_cast<size_t>(row.seg)];
        if (row.base != a.base) {
            lost_timers += a.count;
            ++lost_segments;
            for (const auto &[key, token] : a.rows) back.push_back(RowRef{a.tenant, a.queue, key, token});
        }
    }
    r = PgResult{};
    // Their rows may still carry this sweeper's claim on the new primary (the claim was
    // replicated, the fire was not): token-matched, they go back and fire at once instead
    // of after the lease. A row nobody holds, or someone else's, is left alone.
    std::optional<int64_t> released = co_await release_rows(ctx_, back, ctx_.cfg.stmt_timeout_ms, "hand-back of lost fires");
    fig_.recent_fires_checked_total += static_cast<int64_t>(look.size());
    fig_.recent_fires_lost_total += lost_timers;
    if (released) {
        fig_.handed_back_total += *released;
        shares_.released += *released;
    }
    if (lost_timers > 0)
        ctx_.log.warn(std::to_string(lost_timers) + " timer(s) in " + std::to_string(lost_segments) +
                      " segment(s) announced through on_fired shortly before the failover are not in the new "
                      "primary's log: lost in the failover (the standby was asynchronous and had not replayed "
                      "their commit). They are due again and fire again: the host hears of them twice");
}

// Every connection the pool lost may mean another server now: identify it again. A loss
// while nothing of ours was in flight (an idle loop, a probe) is still a loss.
void Recovery::notice_disconnects() {
    const PoolFigures pf = ctx_.pool.figures();
    if (pf.disconnects_total <= seen_disconnects_) return;
    seen_disconnects_ = pf.disconnects_total;
    const bool known = !fig_.server.empty();
    const LinkStep st = link_step(link_, LinkEvent::disconnect_seen, known);
    link_ = st.next;
    if (st.new_loss) {
        PgResult lost;
        lost.message = pf.last_error;
        lost.origin = Origin::transport;
        date_loss("connection", lost, true);
    }
}

void Recovery::note_lost(const char *phase, const PgResult &r) {
    // One loss, many failed calls: the first one since the server was last found dates it.
    const LinkStep st = link_step(link_, LinkEvent::call_lost);
    link_ = st.next;
    date_loss(phase, r, st.new_loss);
}

void Recovery::date_loss(const char *phase, const PgResult &r, bool first) {
    const bool ro = is_read_only(r);
    std::string was;
    auto &fo = fig_;
    ++fo.lost_total;
    if (ro) ++fo.read_only_total;
    if (first) {
        fo.last_lost_unix_ms = wall_now_ms();
        fo.last_lost_phase = phase;
        fo.last_lost_error = r.message;
        fo.lost_server = fo.server;
    }
    was = fo.server;
    if (first)
        ctx_.log.warn(std::string("connection to ") + (was.empty() ? std::string("the database") : was) +
                      " lost during " + phase +
                      (ro ? " (the server is read-only: a standby or a demoted primary)" : "") + ": " + r.message +
                      "; claims held are kept and handed back once connected again, no attempt is spent");
}

void Recovery::add_parked(ParkedFire pf, int64_t rows) {
    const bool in_doubt = pf.in_doubt;
    parked_.push_back(std::move(pf));
    auto &fo = fig_;
    fo.parked_claims += rows;
    if (in_doubt) {
        ++fo.in_doubt_fires_total;
        ++fo.in_doubt_pending;
    }
}

// A parked row is never sent again (row_next): its payload goes back at once; what the
// recovery needs of it (names, token) stays in the claim's rows.
void Recovery::park_fire(const ClaimRows &rows, const FireBatch &batch, bool in_doubt) {
    ParkedFire pf;
    pf.in_doubt = in_doubt;
    pf.rows = rows;
    int64_t n = 0;
    for (const PackedSegment &seg : batch.segments) {
        ParkedSegment ps{seg.tenant, seg.queue, seg.partition, seg.count, seg.hashes, seg.rows};
        for (size_t idx : seg.rows) {
            book_.move((*rows)[idx], RowEvent::answer_lost);
            std::string().swap((*rows)[idx].payload);
        }
        n += static_cast<int64_t>(seg.rows.size());
        pf.segments.push_back(std::move(ps));
    }
    add_parked(std::move(pf), n);
}

void Recovery::park_rows(const ClaimRows &rows, const std::vector<size_t> &which) {
    // Rows of a fail call: nothing of theirs can be in the log, only handed back.
    ParkedFire pf;
    pf.rows = rows;
    for (size_t idx : which) {
        const ClaimedTimer &t = (*rows)[idx];
        pf.segments.push_back(ParkedSegment{t.tenant, t.queue, t.partition, 0, {}, {idx}});
        book_.move(t, RowEvent::answer_lost);
        std::string().swap((*rows)[idx].payload);
    }
    add_parked(std::move(pf), static_cast<int64_t>(which.size()));
}

void Recovery::note_server_clock(int64_t server_now_unix_ms, uint64_t sent_mono, uint64_t got_mono) {
    server_now_unix_ms_ = server_now_unix_ms;
    server_now_sent_mono_ = sent_mono;
    server_now_got_mono_ = got_mono;
}

void Recovery::remember_lost_claim(const std::string &claim_id, uint64_t sent_mono,
                                   std::optional<int64_t> floor_ms) {
    if (server_now_got_mono_ == 0) return;  // no probe answered yet: no clock to place it on
    // The claim's now() was taken on the server between its send and now (the loss). On the
    // server's clock, as the last probe relates it to the loop's: S(m) lies within
    // [probe_now + m - probe_got, probe_now + m - probe_sent]. Two seconds more each side
    // for the clocks' drift since. Every row of the claim has claimed_until = now() + lease.
    constexpr int64_t kSlackMs = 2000;
    const uint64_t lost = ctx_.now();
    const int64_t lo = server_now_unix_ms_ + static_cast<int64_t>(sent_mono) - static_cast<int64_t>(server_now_got_mono_);
    const int64_t hi = server_now_unix_ms_ + static_cast<int64_t>(lost) - static_cast<int64_t>(server_now_sent_mono_);
    LostClaim lc;
    lc.id = claim_id;
    lc.floor_unix_ms = floor_ms;
    lc.lease_from_unix_ms = lo - kSlackMs + ctx_.cfg.sweeper_lease_ms;
    lc.lease_to_unix_ms = hi + kSlackMs + ctx_.cfg.sweeper_lease_ms;
    lc.forget_at_mono = lost + static_cast<uint64_t>(ctx_.cfg.sweeper_lease_ms + kSlackMs);
    // Bounded: a loss leaves at most one claim per worker and one ahead; the oldest go first.
    constexpr size_t kMaxRemembered = 64;
    if (lost_claims_.size() >= kMaxRemembered) lost_claims_.erase(lost_claims_.begin());
    lost_claims_.push_back(std::move(lc));
    ++fig_.lost_claims_total;
    fig_.lost_claims_pending = static_cast<int64_t>(lost_claims_.size());
}

void Recovery::note_fired(int64_t timers) {
    if (timers <= 0) return;
    const LinkStep st = link_step(link_, LinkEvent::fired);
    link_ = st.next;
    if (!st.resumed) return;
    std::string where, gap;
    auto &fo = fig_;
    fo.resumed_unix_ms = wall_now_ms();
    fo.last_gap_ms = fo.resumed_unix_ms - fo.last_lost_unix_ms;
    where = fo.server;
    gap = std::to_string(fo.last_gap_ms);
    ctx_.log.info("firing resumed on " + (where.empty() ? std::string("the database") : where) + ", " + gap +
                  " ms after the connection was lost");
}

bool is_new_server(const ServerIdentity &before, const ServerIdentity &now) {
    if (before.address.empty()) return false;
    if (before.address != now.address) return true;
    return !before.identity.empty() && !now.identity.empty() && before.identity != now.identity;
}

Task<bool> Recovery::identify_server() {
    // Which server answers now. Behind a bouncer this is still the PostgreSQL server, so
    // the stats name the host that failed and the one that took over.
    Query q = identify_query();
    q.timeout_ms = ctx_.cfg.stmt_timeout_ms;
    PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
    const IdentifyAnswer a = read_identify_answer(r);
    if (!a.readable) {
        if (is_read_only(r)) ++fig_.read_only_total;
        co_return false;
    }
    const std::string &server = a.server;
    const bool in_recovery = a.in_recovery;
    const std::string &identity = a.identity;
    const LinkStep st = link_step(link_, LinkEvent::identified);
    link_ = st.next;
    std::string before;
    bool changed = false;
    auto &fo = fig_;
    before = fo.server;
    changed = is_new_server({before, identity_}, {server, identity});
    if (changed) {
        ++fo.server_changes_total;
        ++server_changes_;
    }
    fo.server = server;
    fo.server_identity = identity;
    fo.server_in_recovery = in_recovery;
    // The first identification after the last recorded loss dates the reconnection.
    if (fo.last_lost_unix_ms >= 0 && fo.reconnected_unix_ms < fo.last_lost_unix_ms)
        fo.reconnected_unix_ms = wall_now_ms();
    const std::string was_identity = identity_;
    identity_ = identity;
    const bool again = st.again;
    if (changed) {
        // A failover: what was announced on the old server in the last seconds is looked
        // for on the new one (check_recent_fires).
        to_check_.assign(announced_.begin(), announced_.end());
        announced_.clear();
        announced_bytes_ = 0;
    }
    if (before.empty()) ctx_.log.info("connected to " + server);
    else if (changed && before != server)
        ctx_.log.warn("connected to " + server + " (was " + before + "): the database failed over");
    else if (changed)
        ctx_.log.warn("connected to " + server + ", now server " + identity + " (was " + was_identity +
                      "): the database failed over behind the same address");
    else if (again) ctx_.log.info("connected to " + server + " again");
    co_return true;
}

// Claims whose answer was lost, handed back by id as soon as the server answers again, so
// their rows are due at once instead of after the lease (and whichever broker claims them
// next fires them). A claim that never committed has no rows; one past its lease is
// forgotten (its rows are anyone's again).
Task<void> Recovery::hand_back_lost_claims() {
    const uint64_t now = ctx_.now();
    std::erase_if(lost_claims_, [now](const LostClaim &lc) { return now >= lc.forget_at_mono; });
    while (!lost_claims_.empty() && !ctx_.stopping.load()) {
        const LostClaim &lc = lost_claims_.front();
        Query q = release_claims_query(
            ReleaseClaimsArgs{{lc.id}, lc.lease_from_unix_ms, lc.lease_to_unix_ms, lc.floor_unix_ms});
        q.timeout_ms = ctx_.cfg.stmt_timeout_ms;
        PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
        const std::optional<int64_t> answered = read_released(r);
        if (!answered) {
            if (r.ok) r.message = "the hand-back of a lost claim answered unreadably";
            ctx_.note_error("hand-back of a lost claim", r);
            break;  // kept: the next cycle tries again
        }
        lost_claims_.erase(lost_claims_.begin());
        const int64_t released = *answered;
        auto &fo = fig_;
        fo.lost_claims_handed_back_total += released;
        fo.handed_back_total += released;
        shares_.released += released;
        if (released > 0)
            ctx_.log.info("handed back " + std::to_string(released) +
                          " timer(s) of a claim whose answer the lost connection took, instead of waiting out the lease");
    }
    fig_.lost_claims_pending = static_cast<int64_t>(lost_claims_.size());
}

// One statement looks at every parked segment: are its timers still in the table (then its
// fire did not commit: the fire deletes them in the same transaction), is any of them
// locked by someone (a fire still running on a connection we lost sight of: undecided,
// look again next cycle), and is exactly this segment in the log (the same transaction
// hashes at the offset the dedup index gives for the first)?
Task<void> Recovery::resolve_parked() {
    InDoubtArgs args;
    for (const ParkedFire &pf : parked_)
        for (const ParkedSegment &ps : pf.segments) {
            const int64_t i = static_cast<int64_t>(args.segments.size());
            args.segments.push_back(i);
            args.tenants.push_back(ps.tenant);
            args.queues.push_back(ps.queue);
            args.hashes.emplace_back(ps.hashes);
            for (size_t idx : ps.rows) {
                args.key_segments.push_back(i);
                args.keys.push_back((*pf.rows)[idx].timer_key);
            }
        }
    // queen.log_timers_in_doubt_v1 (SECURITY DEFINER) answers for a role that reads no table.
    Query q = in_doubt_query(args);
    q.timeout_ms = ctx_.cfg.stmt_timeout_ms;
    PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
    if (is_privilege_denied(r)) {
        co_await release_parked_unchecked();
        co_return;
    }
    std::vector<InDoubtSeen> seen(args.segments.size());
    bool readable = r.ok && r.rows() == static_cast<int>(seen.size());
    for (const InDoubtRow &row : readable ? read_in_doubt_rows(r) : std::vector<InDoubtRow>{}) {
        readable = readable && row.readable && row.seg >= 0 && static_cast<size_t>(row.seg) < seen.size();
        if (!readable) break;
        seen[static_cast<size_t>(row.seg)] = InDoubtSeen{row.present, row.unlocked, row.base};
    }
    if (!readable) {
        if (r.ok) r.message = "the in-doubt check answered " + std::to_string(r.rows()) + " unreadable rows";
        ctx_.note_error("in-doubt check", r);
        co_return;
    }
    r = PgResult{};
    Settled settled = settle_checked(seen);
    if (settled.decided.empty()) co_return;
    std::optional<int64_t> released = int64_t(0);
    if (!settled.release.empty())
        released = co_await release_rows(ctx_, settled.release, ctx_.cfg.stmt_timeout_ms, "hand-back after reconnecting");
    // On a failed release the decided fires stay parked (less what was announced): the
    // next cycle tries again.
    if (released) drop_decided(settled.decided, *released);
}

// Announces what committed (once), and says what goes back (plan_in_doubt decides).
Recovery::Settled Recovery::settle_checked(const std::vector<InDoubtSeen> &seen) {
    const InDoubtPlan plan = plan_in_doubt(parked_, seen);
    Settled out;
    for (const InDoubtFirePlan &fp : plan.decided) {
        ParkedFire &pf = parked_[fp.fire];
        out.decided.push_back(fp.fire);
        // Committed, answer lost: the host hears of it now, once, and never again.
        for (const auto &[s, base] : fp.announce) {
            const ParkedSegment &ps = pf.segments[s];
            for (size_t idx : ps.rows) book_.move((*pf.rows)[idx], RowEvent::settled);
            ctx_.announce(ps.tenant, ps.queue, ps.partition, static_cast<uint32_t>(ps.count), base);
        }
        for (size_t s : fp.release) {
            const ParkedSegment &ps = pf.segments[s];
            for (size_t idx : ps.rows) out.release.push_back(row_ref((*pf.rows)[idx]));
        }
        std::vector<ParkedSegment> left;
        for (size_t s : fp.left) left.push_back(std::move(pf.segments[s]));
        pf.segments = std::move(left);
        if (fp.count != InDoubtFirePlan::Count::none) pf.counted = true;
    }
    const int64_t calls = plan.fired_calls + plan.not_fired_calls;
    shares_.fired += plan.fired_rows;
    shares_.fired_segments += plan.fired_segments;
    fig_.in_doubt_fired_total += plan.fired_calls;
    fig_.in_doubt_not_fired_total += plan.not_fired_calls;
    fig_.in_doubt_pending -= calls;
    fig_.in_doubt_timers_announced_total += plan.fired_rows;
    if (calls > 0)
        ctx_.log.info("resolved " + std::to_string(calls) + " fire(s) whose answer was lost: " +
                      std::to_string(plan.fired_calls) + " committed (" + std::to_string(plan.fired_rows) +
                      " timer(s) announced now), " + std::to_string(plan.not_fired_calls) + " not committed");
    return out;
}

// Decided fires leave the books, their rows with them, in one pass from the back.
void Recovery::drop_decided(const std::vector<size_t> &decided, int64_t released) {
    for (auto it = decided.rbegin(); it != decided.rend(); ++it) {
        const ParkedFire &pf = parked_[*it];
        for (const ParkedSegment &ps : pf.segments)
            for (size_t idx : ps.rows) book_.move((*pf.rows)[idx], RowEvent::settled);
        parked_.erase(parked_.begin() + static_cast<std::ptrdiff_t>(*it));
    }
    int64_t still = 0;
    for (const ParkedFire &pf : parked_)
        for (const ParkedSegment &ps : pf.segments) still += static_cast<int64_t>(ps.rows.size());
    fig_.handed_back_total += released;
    fig_.parked_claims = still;
    shares_.released += released;
    if (released > 0)
        ctx_.log.info("handed back " + std::to_string(released) +
                      " claim(s) held when the connection was lost, instead of waiting out the lease");
}

// A role holding queen_sweeper only may not read the tables: no check is possible. The
// claims still go back at once, token-matched, one parked call at a time. A call whose
// rows all come back did not commit; any other stays unknown and unannounced.
Task<void> Recovery::release_parked_unchecked() {
    if (!check_refused_logged_) {
        ctx_.log.warn("the in-doubt check is refused (insufficient privilege); claims of lost calls are handed "
                      "back, but a fire whose answer was lost cannot be confirmed, so the host is not told of it");
        check_refused_logged_ = true;
    }
    while (!parked_.empty()) {
        ParkedFire &pf = parked_.front();
        std::vector<RowRef> rows;
        for (const ParkedSegment &ps : pf.segments)
            for (size_t idx : ps.rows) rows.push_back(row_ref((*pf.rows)[idx]));
        std::optional<int64_t> released =
            co_await release_rows(ctx_, rows, ctx_.cfg.stmt_timeout_ms, "hand-back after reconnecting");
        if (!released) co_return;
        const int64_t n = static_cast<int64_t>(rows.size());
        auto &fo = fig_;
        fo.handed_back_total += *released;
        fo.parked_claims -= n;
        shares_.released += *released;
        if (pf.in_doubt && !pf.counted) {
            --fo.in_doubt_pending;
            ++(*released == n ? fo.in_doubt_not_fired_total : fo.in_doubt_unknown_total);
        }
        for (const RowRef &r : rows) book_.move(r.tenant, r.queue, r.timer_key, r.claim_token, RowEvent::settled);
        parked_.erase(parked_.begin());
    }
}

}  // namespace qsw
