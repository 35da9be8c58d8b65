// The drain's decisions, as pure functions of their inputs (no clock, no randomness, no
// I/O), so both ends of every rule are asserted in tests/unit/drain_policy_test.cpp, as the
// sleep bands and the shedding ladder are. drain.cpp only carries them out.
#pragma once
#include <cstdint>

namespace qsw {

// ---- The claim's size -----------------------------------------------------------------

struct BatchInput {
    int64_t batch = 0;          // the batch the claim asked for
    int64_t base = 200;         // sweeper_claim_batch: never below
    int64_t ceiling = 2000;     // sweeper_claim_batch_max (never below the base)
    int64_t lease_ms = 30000;   // sweeper_lease_ms
    int64_t byte_budget = 8 << 20;  // sweeper_claim_max_bytes: what one claim may carry
    bool whole = true;          // the claim asked for a whole batch (not a budget's rest)
    bool full = true;           // it came back full (a backlog)
    int64_t elapsed_ms = 0;     // claim + pack + fire of that claim
    int64_t claimed_bytes = 0;  // payload bytes the claim really carried (as claimed, not packed)
};

// The next claim's size. A claim that came back short ends the backlog: the base. A full,
// whole claim done in under 1/16 of the lease that carried at most half the byte budget
// doubles (up to the ceiling); one over 1/8 of the lease, or that filled its byte budget,
// halves (never below the base). Anything else keeps the batch. Whether its fires met
// another broker does not matter (schema version 10): a fire fires the partitions it
// takes and keeps the others, so a bigger claim costs no more per timer when brokers
// collide, and a smaller one costs more calls and more, smaller segments per timer (with
// four brokers held at their first sizes, 2.5x the segments of one broker and 1.7x its
// CPU per timer: tests/bench/README.md, seventh pass).
int64_t next_claim_batch(const BatchInput &in);

// ---- Claiming ahead --------------------------------------------------------------------

// Whether the next claim is sent while this one is packed and fired (on a second
// connection), rather than after it: only through a backlog (this claim came back full and
// decodable), never once a stop is asked, and not while other brokers are in the way (for
// a second after a claim whose fires met one: then each broker keeps one connection busy).
bool claim_ahead(bool full_claim, bool contended_recently, bool stopping);

// Whether the claim sent beside a pass's last fire is taken for the next cycle (carried:
// held, packed, and fired first by the next pass) once this pass's rows are spent. Only
// where a claim would be sent ahead anyway (claim_ahead), when the pass ended on its row
// budget alone, unshed (a backlog on a healthy database: not out of its half-lease, no call
// failed, the budget not cut by the ladder), no claim is held back around kept segments,
// no claim is carried already (one per drain), and no maintenance phase of this cycle may
// come due before the next cycle fires it (the usage rollup's gate is more than half a lease
// away when the pass begins, and the pass claims nothing after half a lease): a carried
// claim's rows wait for what runs between the two drains, and other brokers could have
// fired them meanwhile. Without it, every cycle of a backlog
// began with a claim and its packing on the path to its first fire: ~36 ms of every
// 5,000 timers at a segment per timer (tests/bench/results/2026-12-07-carry-and-compact.md).
struct CarryInput {
    bool ahead = false;        // claim_ahead(...) for the claim just fired
    bool budget_spent = false; // the pass has no rows left to reserve
    bool out_of_time = false;  // the pass's half-lease is spent
    bool failed = false;       // a call of the pass failed
    bool shed = false;         // the ladder cut this cycle's row budget
    bool holding_back = false; // claims around kept segments are held back
    bool carrying = false;     // a claim is carried already
    bool phase_due = false;    // a maintenance phase may run before the next drain
};
bool carry_claim(const CarryInput &in);

// ---- Deadlines inside the lease ---------------------------------------------------------

// The loop-clock instant by which every fire of a claim sent at `sent_mono` must have
// been sent, with its answer due: three quarters of the lease after the send. The claim's
// rows are claimed_until (server) now() + lease and now() is after the send, so a fire
// sent by then with a deadline at it commits well inside the lease: no claim is ever
// fired after its claimed_until, and the last quarter is the margin for clocks and the
// cancel of a call that overran.
uint64_t fire_deadline(uint64_t sent_mono, int64_t lease_ms);

struct CallBudget {
    bool go = false;         // false: too late, hand the rows back instead
    int64_t timeout_ms = 0;  // the call's deadline when go
};
// A call for rows that must be fired by `deadline_mono`: its timeout is the statement
// timeout or what is left until the deadline, whichever is shorter; with less than
// kMinCallMs left it is not sent (the rows go back, due again at once).
constexpr int64_t kMinCallMs = 100;
CallBudget call_budget(uint64_t now_mono, uint64_t deadline_mono, int64_t stmt_timeout_ms);

// ---- A partition someone else holds ------------------------------------------------------

// Segments whose partition another transaction holds come back "busy". Try 0 is at once
// and waits for the partition, at most 100 ms: most holders are another broker's fire or a
// push, which let go within that (brokers sharing a backlog then take turns on a partition
// instead of colliding). A segment still busy after it is kept, still claimed, to be tried
// again later while the rest of the drain goes on, and its partition is left out of the
// next claims meanwhile (a long push, a forgotten transaction). Try n >= 1: after delay_ms,
// doubling from 100 ms to 1 s; tries 1-3 skip a partition still held (wait false), later
// ones wait for it at most lock_wait_ms (200), so a partition under a constant stream of
// short pushes still gets its timers and one held by a long transaction costs one short
// wait a second. A held partition costs a few calls a second, and its timers fire within
// a second of its release.
struct BusyRetry {
    int64_t delay_ms = 0;
    bool wait = false;
    int64_t lock_wait_ms = 0;  // with wait: the call's lock_timeout
};
BusyRetry busy_retry(int64_t n);

// ---- Claiming around kept rows -------------------------------------------------------------

// A claim sent while segments are kept leaves their partitions out. When such a claim comes
// back empty, nothing else was due for this broker: every due row it can reach is in the
// held partitions (with one partition, the claim walked that partition's whole due backlog
// to find so). Sending it again before anything changed walks that backlog again for
// nothing, so the drain holds such claims back while all of these hold:
//   - the claim around the kept rows came back empty, and every partition it left out is
//     still kept (tries again that find a partition still held keep it; one that fired or
//     went back frees its partition, whose other due rows the next claim may then take; a
//     partition kept since only leaves more out);
//   - no wake has rung since (a local commit may have made another partition's timer due);
//   - less than window_ms has passed since: sweeper_empty_claim_max_ms, never above the max
//     sleep, the longest empty-claim sleep the design already allows after any empty claim,
//     so a timer that comes due by the clock in another partition waits no longer than it
//     did.
// window_ms <= 0 never holds back.
struct HoldBackInput {
    bool came_back_empty = false;  // the last claim around the kept rows took nothing
    bool partition_freed = false;  // a partition that claim left out is no longer kept
    bool woken = false;            // a wake rang since
    uint64_t empty_at_mono = 0;    // loop clock when it came back
    uint64_t now_mono = 0;
    int64_t window_ms = 0;
};
bool hold_back_claim(const HoldBackInput &in);

// ---- A failed fire ------------------------------------------------------------------------

enum class FailedFire {
    park,       // the answer was lost (connection, read-only server): keep, resolve on reconnect
    busy,       // a lock wait that ran out: the partition is still held; kept, tried again later
    hand_back,  // not the timers' fault (class 42, our own error): back, no attempt spent, back off
    isolate,    // a permanent failure of a batch: replay it one timer per call
    fail,       // fail the rows (an attempt spent unless transient)
};
struct FailedFireInput {
    bool answer_lost = false;
    bool config = false;      // class 42
    bool internal = false;    // this library's own code failed
    bool lock_timeout = false;
    bool transient = false;
    bool isolating = false;   // this call is already one timer of a replay
    bool isolate_enabled = true;  // sweeper_isolate_on_permanent
    int64_t timers = 0;
};
FailedFire failed_fire(const FailedFireInput &in);

}  // namespace qsw
