#include "sweeper/floor.hpp"

#include <algorithm>

#include "pg/calls.hpp"
#include "pg/statements.hpp"

namespace qsw {

std::atomic<int> g_test_head_walk_sleep_s{0};

std::optional<int64_t> floor_after_answer(std::optional<int64_t> current, uint64_t current_epoch,
                                          const FloorTicket &sent, std::optional<int64_t> answered) {
    if (!answered || sent.epoch != current_epoch) return current;
    if (current && *answered <= *current) return current;
    return answered;
}

std::optional<int64_t> floor_after_walk(std::optional<int64_t> current, std::optional<int64_t> behind_ms) {
    if (!behind_ms) return current;
    if (!current) return current;  // no floor: the walks already start at the head
    return std::min(*current, *behind_ms);
}

std::optional<HeadWalkSlice> head_walk_slice(std::optional<int64_t> cursor_ms, int64_t low_ms, int64_t width_ms) {
    if (!cursor_ms) return std::nullopt;
    if (*cursor_ms <= low_ms) return HeadWalkSlice{std::nullopt, *cursor_ms};  // the rest, from the head
    const int64_t w = std::clamp(width_ms, kHeadWalkMinWidthMs, kHeadWalkMaxWidthMs);
    // cursor - w without overflow (the distance in unsigned: cursor > low): never below low.
    const uint64_t above = static_cast<uint64_t>(*cursor_ms) - static_cast<uint64_t>(low_ms);
    const int64_t from = above <= static_cast<uint64_t>(w) ? low_ms : *cursor_ms - w;
    return HeadWalkSlice{from, *cursor_ms};
}

int64_t head_walk_width_ms(int64_t span_ms, int64_t took_ms) {
    const int64_t span = std::clamp(span_ms, kHeadWalkMinWidthMs, kHeadWalkMaxWidthMs);
    const int64_t took = std::max<int64_t>(took_ms, 1);
    // span * slice / took, in double: span can be years of milliseconds.
    const double scaled = static_cast<double>(span) * static_cast<double>(kHeadWalkSliceMs) / static_cast<double>(took);
    const double most = std::min(static_cast<double>(span) * 4.0, static_cast<double>(kHeadWalkMaxWidthMs));
    const double w = std::clamp(scaled, static_cast<double>(kHeadWalkMinWidthMs), most);
    return static_cast<int64_t>(w);
}

int64_t head_walk_pause_ms(int64_t took_ms) {
    const int64_t t = std::clamp<int64_t>(took_ms, 0, kHeadWalkMaxPauseMs);
    return std::clamp(t * 20, kHeadWalkMinPauseMs, kHeadWalkMaxPauseMs);
}

bool backlog_after_probe(bool due_capped) { return due_capped; }

bool ring_wanted(bool backlog, int64_t last_claim_tenants, uint64_t now_ms, uint64_t last_ring_ms,
                 int64_t every_ms) {
    if (!backlog) return false;
    if (last_claim_tenants != 1 || last_ring_ms == 0 || now_ms < last_ring_ms) return true;
    return now_ms - last_ring_ms >= static_cast<uint64_t>(std::max<int64_t>(every_ms, 0));
}

int64_t ring_alone_every_ms(int64_t last_ring_claim_ms) {
    const int64_t ms = std::clamp<int64_t>(last_ring_claim_ms, 0, 1000);
    return std::clamp<int64_t>(ms * 20, 100, 1000);
}

bool DueFloor::take_ring() {
    const uint64_t now = ctx_.now();
    if (!ring_wanted(backlog_, last_claim_tenants_, now, last_ring_ms_, ring_alone_every_ms(last_ring_claim_ms_)))
        return false;
    last_ring_ms_ = now;
    return true;
}

bool backlog_after_claim(bool backlog, int64_t got, int64_t want) {
    if (want <= 0) return backlog;
    return got >= want;
}

bool try_held_rows(int64_t held, uint64_t now_ms, uint64_t last_tried_ms, int64_t every_ms) {
    if (held <= 0) return false;
    if (last_tried_ms == 0 || now_ms < last_tried_ms) return true;  // never tried, or a clock that went back
    return now_ms - last_tried_ms >= static_cast<uint64_t>(std::max<int64_t>(every_ms, 1));
}

std::optional<int64_t> probe_horizon_ms(int64_t beyond_streak, int64_t idle_cycles, int64_t max_sleep_ms,
                                        int64_t idle_after_cycles) {
    if (idle_cycles > 0 || beyond_streak >= std::max<int64_t>(idle_after_cycles, 1)) return std::nullopt;
    return std::max<int64_t>(max_sleep_ms, 1);
}

std::optional<int64_t> DueFloor::horizon_ms(int64_t idle_cycles) const {
    return probe_horizon_ms(beyond_streak_, idle_cycles, ctx_.cfg.sweeper_max_sleep_ms,
                            ctx_.cfg.sweeper_idle_after_cycles);
}

void DueFloor::note_answer(const FloorTicket &sent, std::optional<int64_t> answered,
                           std::optional<int64_t> server_now_ms) {
    floor_ms_ = floor_after_answer(floor_ms_, epoch_, sent, answered);
    if (floor_ms_ && (!low_ms_ || *floor_ms_ < *low_ms_)) low_ms_ = floor_ms_;
    if (server_now_ms) fig_.lag_ms = floor_ms_ ? std::max<int64_t>(*server_now_ms - *floor_ms_, 0) : -1;
}

void DueFloor::reset() {
    if (!floor_ms_) return;
    floor_ms_.reset();
    low_ms_.reset();
    in_pass_ = false;
    ++epoch_;
    ++fig_.resets_total;
    fig_.lag_ms = -1;
}

void DueFloor::note_probe_backlog(bool due_capped) {
    backlog_ = backlog_after_probe(due_capped);
    if (backlog_) return;
    fig_.tenants_named = 0;
}

void DueFloor::note_claim_backlog(bool sent_in_backlog, int64_t got, int64_t want, int64_t tenants) {
    backlog_ = backlog_after_claim(backlog_, got, want);
    if (got > 0) last_claim_tenants_ = tenants;
    fig_.tenants_named = sent_in_backlog ? tenants : 0;
}

bool DueFloor::head_walk_due() const { return !walking_ && floor_ms_ && ctx_.now() >= next_walk_; }

Task<void> DueFloor::head_walk() {
    walking_ = true;
    const FloorTicket sent = ticket();
    if (!in_pass_) {  // a new pass over [head, the floor now), from its end back
        in_pass_ = true;
        cursor_ms_ = sent.floor_ms.value_or(0);
        width_ms_ = kHeadWalkFirstWidthMs;
        pass_began_ = ctx_.now();
        pass_walk_ms_ = 0;
    }
    const int64_t low = low_ms_.value_or(cursor_ms_.value_or(0));
    const std::optional<HeadWalkSlice> slice = head_walk_slice(cursor_ms_, low, width_ms_);
    if (!slice) {  // nothing left (not reached: a pass ends with its slice from the head)
        walking_ = false;
        end_pass(0);
        co_return;
    }
    Query q = head_walk_query(HeadWalkArgs{slice->from_ms, slice->until_ms});
    q.timeout_ms = ctx_.cfg.stmt_timeout_ms;
    q.cut_at_stop = true;
    if (const int s = g_test_head_walk_sleep_s.load(); s > 0)
        q.sql = std::string("SELECT w.* FROM (") + sql::kFloorHeadWalk + ") w CROSS JOIN pg_catalog.pg_sleep(" +
                std::to_string(s) + ")";
    const uint64_t t0 = ctx_.now();
    PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
    const int64_t took = static_cast<int64_t>(ctx_.now() - t0);
    walking_ = false;
    // Read without throwing: an answer that does not read fails this walk, never the loop.
    const HeadWalkAnswer a = read_head_walk_answer(r);
    const bool ok = a.readable;
    if (!ok && r.ok) {
        r.ok = false;
        r.origin = Origin::internal;
        r.message = r.rows() == 1 ? "the walk from the head answered unreadably" : "the walk from the head returned no row";
    }
    if (!ok && ctx_.stopping.load()) {
        // Cut short by a graceful stop (or failed during it): nothing to lower any more.
        ctx_.log.info("the walk from the index head was cut short by the stop");
        co_return;
    }
    if (!ok) {
        ctx_.note_error("floor", r);
        ++fig_.head_walk_failures_total;
        in_pass_ = false;  // the next pass begins again, kHeadWalkEveryMs after this one
        next_walk_ = std::max(ctx_.now() + static_cast<uint64_t>(head_walk_pause_ms(took)),
                              pass_began_ + static_cast<uint64_t>(kHeadWalkEveryMs));
        co_return;
    }
    pass_walk_ms_ += took;
    fig_.dead_tuples = a.dead_tuples;
    if (sent.epoch != epoch_ || !in_pass_) {
        // A reset meanwhile (another server): its floor starts from the head already.
        in_pass_ = false;
        next_walk_ = ctx_.now() + static_cast<uint64_t>(head_walk_pause_ms(took));
        co_return;
    }
    if (slice->from_ms) {  // a slice cut short at low only narrows the next
        const int64_t span = slice->until_ms - *slice->from_ms;
        const int64_t w = head_walk_width_ms(span, took);
        width_ms_ = span < width_ms_ ? std::min(width_ms_, w) : w;
    }
    cursor_ms_ = slice->from_ms;  // none after the slice from the head: the pass is over
    if (a.behind_ms) {
        floor_ms_ = floor_after_walk(floor_ms_, a.behind_ms);
        if (floor_ms_) low_ms_ = low_ms_ ? std::min(*low_ms_, *floor_ms_) : *floor_ms_;
        ++epoch_;  // answers to calls sent before are dropped (computed past this row)
        ++fig_.behind_total;
        ctx_.log.info("a timer was found behind the floor (a transaction committed long after it wrote it): "
                      "the floor goes back to it");
    }
    if (!cursor_ms_ || !floor_ms_) {
        end_pass(took);
        co_return;
    }
    next_walk_ = ctx_.now() + static_cast<uint64_t>(head_walk_pause_ms(took));
}

void DueFloor::end_pass(int64_t last_took_ms) {
    in_pass_ = false;
    ++fig_.head_walks_total;
    fig_.head_walk_ms = pass_walk_ms_;
    next_walk_ = std::max(ctx_.now() + static_cast<uint64_t>(head_walk_pause_ms(last_took_ms)),
                          pass_began_ + static_cast<uint64_t>(kHeadWalkEveryMs));
}

}  // namespace qsw
