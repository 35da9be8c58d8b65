// The due index's floor and the tenants the claims take a share of: how due rows are found
// when the index is full of what a long transaction elsewhere keeps alive, and when one
// tenant's backlog sits in front of everyone else's rows (sql/002_timers.sql, 3a;
// docs/design.md, "Finding due rows").
//
// The floor is an instant (server clock, Unix ms) no live row of queen.log_timers is
// behind, but a slow transaction's. Each probe and claim starts its walk of the due
// index (due_at, schema version 9) there, past the dead entries behind it, and answers the
// floor the next one starts from. A walk from the index head, on a clock of its own and
// never on the drain's path, finds a slow transaction's row behind the floor and lowers the floor to it.
// One floor per sweeper, in memory: nothing shared, no leader, every broker scans
// everything; a sweeper that starts (or meets a new server) walks from the head once.
//
// The backlog: while more rows are due than one claim takes (the probe's due count capped,
// or the last claim came back full), each claim names tenants from the fleet's ring of
// tenants (queen.log_timers_tenant_ring_v1) and takes a share of each through the
// (tenant_id, due_at) index first, so a small tenant behind other tenants' backlogs is
// reached within a few claims, and busy tenants share the drain equally.
//
// The decisions are pure functions (below the class), tested at both ends
// (tests/unit/floor_test.cpp). Loop thread only.
#pragma once
#include <atomic>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/task.hpp"
#include "sweeper/context.hpp"

namespace qsw {

// ---- Pure decisions ----------------------------------------------------------------------

// What a probe or a claim was sent with: the floor, and the epoch it belongs to. A walk
// from the head that lowers the floor starts a new epoch, and an answer to a call sent in
// an older one is dropped: it was computed from a floor past the row just found.
struct FloorTicket {
    std::optional<int64_t> floor_ms;
    uint64_t epoch = 0;
};

// The floor after an answer: the answer when it belongs to the current epoch and is later
// (the floor moves forward only by answers, and never back by one), else unchanged.
std::optional<int64_t> floor_after_answer(std::optional<int64_t> current, uint64_t current_epoch,
                                          const FloorTicket &sent, std::optional<int64_t> answered);

// The floor after a walk from the head found a row at behind_ms: lowered to it.
std::optional<int64_t> floor_after_walk(std::optional<int64_t> current, std::optional<int64_t> behind_ms);

// The walk from the head, a slice at a time. Under a snapshot held elsewhere every fired
// row behind the floor keeps its dead entries, and a walk of [head, floor) passes them all:
// in one call it grew to seconds (3.9 s after 30 minutes at 3,000 timers/s), and while it
// ran it read the whole kept history through shared buffers, evicting and writing what the
// drain was using: the claims it overlapped took 45-100 ms instead of 3-7
// (tests/bench/results/2026-12-07-issue-36-head-walk-slices.md). So a pass walks
// [head, end) (end: the floor when the pass began) in slices, from its end back:
// * [cursor - width, cursor), cursor going from end down to `low`, the lowest floor this
//   sweeper has had since its last reset; each slice's width set from the last one's cost
//   (head_walk_width_ms) so that one takes about kHeadWalkSliceMs, starting every pass at
//   kHeadWalkFirstWidthMs. From the end back because what a held snapshot keeps is the
//   fired rows since it began, behind the floor's end: a pass that crossed days of clean
//   history first would reach them with a width grown over that history (4 times a slice),
//   and walk them in one slice, as the one call did;
// * then the rest, from the index's head to low (behind it lies only what was fired
//   before this sweeper began);
// * each slice followed by a pause of 20 times what it took (at most 1/20 of the time),
//   at least kHeadWalkMinPauseMs; a pass begins at least kHeadWalkEveryMs after the last
//   one began. A slice that finds a row lowers the floor to it, and the pass goes on back.
// A row behind the floor (a slow transaction's) is found by the first pass that begins
// after its commit: within one pass and its spacing, 10 s on a clean index, about 21 times
// the dead entries' walking time under a held snapshot (2.5 minutes after 30
// minutes at 3,000/s, a pass's slices summing 7.2 s).
// head_walk_slice: the slice below cursor (the upper end of the next slice; none: the pass
// is over, the slice from the head done).
struct HeadWalkSlice {
    std::optional<int64_t> from_ms;  // none: the index's head
    int64_t until_ms = 0;            // not included
};
std::optional<HeadWalkSlice> head_walk_slice(std::optional<int64_t> cursor_ms, int64_t low_ms, int64_t width_ms);
// The next slice's width from the last one walked (span_ms of due_at in took_ms): scaled to
// take kHeadWalkSliceMs, at most 4 times wider, between kHeadWalkMinWidthMs and
// kHeadWalkMaxWidthMs.
int64_t head_walk_width_ms(int64_t span_ms, int64_t took_ms);
// The pause after a slice that took took_ms: 20 times it, kHeadWalkMinPauseMs to
// kHeadWalkMaxPauseMs.
int64_t head_walk_pause_ms(int64_t took_ms);
inline constexpr int64_t kHeadWalkSliceMs = 10;
inline constexpr int64_t kHeadWalkMinWidthMs = 100;
inline constexpr int64_t kHeadWalkMaxWidthMs = int64_t(1) << 45;  // about 1,100 years
inline constexpr int64_t kHeadWalkFirstWidthMs = 1000;  // 3,000 dead entries at 3,000 timers/s: about 1.5 ms
inline constexpr int64_t kHeadWalkMinPauseMs = 50;
inline constexpr int64_t kHeadWalkMaxPauseMs = 60000;
inline constexpr int64_t kHeadWalkEveryMs = 10000;

// Whether the next claim is under a backlog (and so names tenants from the ring): after a
// probe, whether its due count was capped; after a claim, whether it came back full (a
// claim that asked for nothing changes nothing). Without a backlog the oldest-first walk
// takes everything due and the ring is not walked.
bool backlog_after_probe(bool due_capped);
bool backlog_after_claim(bool backlog, int64_t got, int64_t want);

// Whether a claim under a backlog walks the tenants' ring: every claim while the last one
// served two or more tenants (or none is known); while it served one (one tenant's backlog:
// the ring has no one to share with), at most once every every_ms, to find a tenant that
// arrived behind it. The ring's walk passes the fired rows of a tenant that a snapshot held
// elsewhere keeps from being removed (362 ms a walk, measured, one tenant at 3,000 timers/s
// for 7 minutes under a held snapshot), so alone it is paid at most 1/20 of the time:
// ring_alone_every_ms = 20 x the last claim that walked it, 100 ms to 1 s.
bool ring_wanted(bool backlog, int64_t last_claim_tenants, uint64_t now_ms, uint64_t last_ring_ms,
                 int64_t every_ms);
int64_t ring_alone_every_ms(int64_t last_ring_claim_ms);

// The probe's horizon: how far past now it looks for the next row (ms), or none. Past now
// lie the entries of fired claims (a claim moves its rows to now + lease), which a long
// transaction elsewhere keeps: a search through a whole lease of them costs what the floor
// saves. So the search stops at the sleep ceiling (nothing further changes the next sleep)
// until the probe has found nothing within it idle_after_cycles times in a row, or the
// cycle is idle: then it looks as far as it must (to tell an empty table for the idle
// band). Nothing found within the horizon is never "empty".
std::optional<int64_t> probe_horizon_ms(int64_t beyond_streak, int64_t idle_cycles, int64_t max_sleep_ms,
                                        int64_t idle_after_cycles);

// Whether a cycle with nothing due but held rows (due rows another transaction keeps locked,
// listed in queen.log_timers_held and passed by the floors) sends a claim to try them by
// key: when there are some, at most once per every_ms (the sleep ceiling), so a held row
// fires within about that once its holder lets go, and a row held for an hour costs one
// claim a second, not a spin.
bool try_held_rows(int64_t held, uint64_t now_ms, uint64_t last_tried_ms, int64_t every_ms);

// Test seam (integration tests link the core): when > 0, the walk from the head also sleeps
// this many seconds on the server, a walk through a long transaction's dead entries made
// to last. 0 in production.
extern std::atomic<int> g_test_head_walk_sleep_s;

// ---- The floor's keeper --------------------------------------------------------------------

class DueFloor {
public:
    explicit DueFloor(LoopContext &ctx) : ctx_(ctx) {}

    FloorTicket ticket() const { return {floor_ms_, epoch_}; }
    // A probe's or a claim's answer (server now, when the probe read it, for the lag).
    void note_answer(const FloorTicket &sent, std::optional<int64_t> answered, std::optional<int64_t> server_now_ms);
    // Due rows another transaction keeps locked, at the last probe (stats floor.held_rows).
    void note_held_rows(int64_t held) { fig_.held_rows = held; }
    // The floor's own figures (stats "floor", less the ring's tidy's), written by the floor
    // alone on the loop thread; Sweeper::publish_pool gathers them into the snapshot.
    const FloorFigures &figures() const { return fig_; }
    // A new server (a failover): its rows and clock are another's; walk from the head.
    void reset();

    // The probe's horizon (probe_horizon_ms), and whether it found nothing within it.
    std::optional<int64_t> horizon_ms(int64_t idle_cycles) const;
    void note_beyond(bool beyond) { beyond_streak_ = beyond ? beyond_streak_ + 1 : 0; }

    bool backlog() const { return backlog_; }
    // Whether the next claim walks the ring (ring_wanted); true is remembered as sent.
    bool take_ring();
    void note_ring_claim_ms(int64_t ms) { last_ring_claim_ms_ = ms; }
    void note_probe_backlog(bool due_capped);
    // A claim's rows: whether the backlog lasts, and the tenants it served under one.
    void note_claim_backlog(bool sent_in_backlog, int64_t got, int64_t want, int64_t tenants);

    // The walk from the head: its next slice due (and none running), started beside the
    // cycle by the Sweeper, one slice a call. A graceful stop cuts it short (its call is
    // Query::cut_at_stop: the floor it would lower ends with the sweeper) before handing the
    // held claims back, then awaits it.
    bool head_walk_due() const;
    bool head_walking() const { return walking_; }
    Task<void> head_walk();

private:
    void end_pass(int64_t last_took_ms);  // figures, and when the next pass begins

    LoopContext &ctx_;
    FloorFigures fig_;
    std::optional<int64_t> floor_ms_;
    uint64_t epoch_ = 0;
    bool backlog_ = false;
    int64_t last_claim_tenants_ = 0;  // tenants in the last claim under a backlog (0: none known)
    uint64_t last_ring_ms_ = 0;       // loop clock of the last claim sent with the ring; 0: never
    int64_t last_ring_claim_ms_ = 0;  // how long that claim took
    int64_t beyond_streak_ = 0;
    // The walk from the head (head_walk_slice): a pass under way, where it is, where it ends.
    bool walking_ = false;
    uint64_t next_walk_ = 0;  // loop clock of the next slice; 0: at the first chance
    bool in_pass_ = false;
    std::optional<int64_t> cursor_ms_;  // the next slice's upper end; none: the pass is over
    uint64_t pass_began_ = 0;  // loop clock
    int64_t pass_walk_ms_ = 0;  // the pass's slices' time so far
    std::optional<int64_t> low_ms_;  // the lowest floor since the last reset
    int64_t width_ms_ = kHeadWalkFirstWidthMs;
};

}  // namespace qsw
