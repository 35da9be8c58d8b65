// B. DRAIN: claim and fire in the same iteration, under the lease budget, with what one
// partition, one payload or one error does borne by it alone.
//
// A worker claims a batch (bounded in rows and in payload bytes), packs it outside any
// transaction and fires it, with at most one more claim in flight meanwhile; every worker
// stops claiming once the pass has spent half the lease or the cycle's row budget.
//
// Containment, rule by rule (the decisions are pure functions, drain_policy.hpp):
//   - a partition someone else holds is never waited on while other work is due: its
//     segments come back busy, are kept (still claimed) and tried again later with backoff
//     (busy_retry), and the claims leave that partition alone meanwhile;
//   - every call of a claim has a deadline inside its lease (fire_deadline, call_budget):
//     rows that cannot be fired in time are handed back, never fired late;
//   - an error in any step of a claim (a failed call, our own exception) hands that
//     claim's rows back at once, is counted, and the loop goes on after a backoff;
//   - memory is bounded in bytes: the claim carries at most sweeper_claim_max_bytes of
//     payload, read in binary, and the batch grows on what the claim really carried.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/task.hpp"
#include "codec/packer.hpp"
#include "pg/calls.hpp"
#include "pg/pg_conn.hpp"
#include "sweeper/claim_book.hpp"
#include "sweeper/context.hpp"
#include "sweeper/drain_policy.hpp"
#include "sweeper/fire_tally.hpp"
#include "sweeper/floor.hpp"
#include "sweeper/busy_partitions.hpp"
#include "sweeper/partition_addresses.hpp"
#include "sweeper/recovery.hpp"

namespace qsw {

// (tenant, queue, partition) of a kept segment.
using PartitionKey = std::array<std::string, 3>;
using PartitionKeys = std::vector<PartitionKey>;

class Drain {
public:
    Drain(LoopContext &ctx, ClaimBook &book, Recovery &recovery, DueFloor &floor)
        : ctx_(ctx), book_(book), recovery_(recovery), floor_(floor) {}

    struct Result {
        int64_t moved = 0;     // rows that left the table (fired, duplicate) or failed over
        int64_t claimed = 0;
        bool empty_claim = false;
        bool capped = false;       // hit the row budget or the deadline
        bool out_of_time = false;  // hit the half-lease deadline: the database is slow
        bool failed = false;
    };
    // phase_due: a maintenance phase (the usage rollup) may run before the next drain, so
    // nothing is carried into it (carry_claim).
    Task<Result> run(const std::vector<int16_t> &shards, int64_t row_budget, bool phase_due);

    // Kept busy segments: whether any is due for its next try, and in how long (loop
    // clock; INT64_MAX when none is kept), so the cycle's sleep never outlasts it.
    bool kept_due() const;
    int64_t ms_until_kept_due() const;
    // While claims around kept segments are held back (hold_back_claim): in how long that
    // ends (INT64_MAX when they are not), so the cycle's sleep never outlasts it either.
    int64_t ms_until_hold_back_ends() const;
    // A wake rang: a local commit may have made another partition's timer due, so a claim
    // around the kept segments is worth sending again.
    void note_wake() { around_.woken = true; }
    // A slow database: back to the base batch.
    void reset_batch();
    // The claim taken beside the last pass's last fire for the next cycle (carry_claim):
    // held (its rows in the claim book, like every claim's) and packed, fired first by the
    // next pass. A cycle that does not drain hands it back (hand_back_carried); a stop hands
    // it back with every other held row.
    bool carrying() const { return carried_.has_value(); }
    Task<void> hand_back_carried(const char *why);
    // The drain's own figures (its part of the stats: stats.hpp DrainFigures), written by the
    // drain alone on the loop thread; Sweeper::publish_pool copies them into the snapshot.
    const DrainFigures &figures() const { return fig_; }

private:
    struct Claim {
        std::string id;        // the claim id sent (its rows' claim_token)
        int64_t want = 0;
        bool whole = false;    // asked for a whole batch (not the rest of a budget)
        uint64_t sent = 0;     // loop clock when the claim was sent
        uint64_t fire_by = 0;  // fire_deadline of the send
        bool ok = false;
        PgResult error;                  // when !ok
        ClaimRows rows = std::make_shared<std::vector<ClaimedTimer>>();  // decoded, each entered in the book
        std::string undecodable;         // a column that did not decode (the claim goes back)
        FloorTicket floor;               // the floor it was sent with
        bool backlog = false;  // sent under a backlog: the claim named tenants from the ring
        int64_t bytes = 0;               // payload bytes it carried
        PartitionKeys left_out;          // the kept segments' partitions it left out (sorted)
        // A claim taken ahead is packed as soon as it is decoded, while the fire before it
        // is still on the server (pack_ahead); its fire then starts at once. Empty: packed
        // by its fire (every claim not taken ahead, or a pack that threw here).
        std::optional<PackResult> packed;
    };
    // One pass of the drain, shared by its workers.
    struct Pass {
        Result acc;
        int64_t rows_left = 0;
        uint64_t deadline = 0;  // stop claiming: half the lease after the pass began
        bool held_back = false;  // a claim around kept segments was held back (hold_back_claim)
        bool shed = false;       // the ladder cut this cycle's row budget: nothing is carried
        bool carrying = false;   // a worker has sent the claim the next cycle is to fire first
        bool phase_due = false;  // a maintenance phase may run before the next drain: nothing carried
    };
    // Segments of a partition someone else holds, still claimed, to be tried again.
    struct Kept {
        ClaimRows rows;  // the claim's rows (batch indexes into them)
        FireBatch batch;
        uint64_t fire_by = 0;
        uint64_t next_try = 0;
        int64_t tries = 0;
    };
    struct CallPlan {
        bool wait = false;  // wait on partitions (at most lock_wait_ms)
        int64_t lock_wait_ms = 0;
        bool isolating = false;
        uint64_t fire_by = 0;
        int64_t tries = 0;  // earlier tries of these segments' partitions (busy_retry)
    };
    // How a fire call went, for the claim that made it: whether the drain ends here, and a
    // refusal no timer owns (a class 42 or internal failure, an unreadable answer), after
    // which the rest of the claim goes back and the drain ends with that error.
    struct FireEnd {
        bool ends_drain = false;
        std::optional<PgResult> refused;
    };

    Task<void> worker(const std::vector<int16_t> &shards, Pass &p);
    int64_t reserve(Pass &p, bool &whole);
    Task<void> claim_into(const std::vector<int16_t> &shards, int64_t want, bool whole, bool ahead, Claim &out);
    void decode_claim(const PgResult &r, Claim &out);
    void pack_ahead(Claim &c) noexcept;
    PackResult pack(const std::vector<ClaimedTimer> &rows) const;
    Task<bool> fire_claim(Claim &c, Pass &p);
    Task<bool> fire_claim_unguarded(Claim &c, Pass &p);
    Task<void> settle_unframed(Claim &c, const PackResult &packed);
    Task<FireEnd> fire_batch(const ClaimRows &rows, FireBatch &batch, const CallPlan &plan);
    Task<FireEnd> on_fire_answer(const ClaimRows &rows, FireBatch &batch, const PgResult &r, const CallPlan &plan);
    void publish_fire(const std::vector<ClaimedTimer> &rows, const FireBatch &batch, const FireTally &t);
    Task<FireEnd> on_fire_failure(const ClaimRows &rows, FireBatch &batch, PgResult r, const CallPlan &plan);
    Task<FireEnd> isolate(const ClaimRows &rows, FireBatch &batch, const CallPlan &plan);
    Task<void> fail_rows(const ClaimRows &rows, const std::vector<size_t> &which, const std::string &error,
                         const std::string &cls);
    Task<void> hand_back(std::vector<ClaimedTimer> &rows, const std::vector<size_t> &which, int64_t expected,
                         const char *why);
    Task<void> hand_back_claim(std::vector<ClaimedTimer> &rows, const char *why);
    void keep(const ClaimRows &rows, FireBatch busy, const CallPlan &plan, int64_t tries);
    void move_rows(const std::vector<ClaimedTimer> &rows, const FireBatch &batch, RowEvent e);
    Task<std::optional<PgResult>> retry_kept();  // a refusal of one of their fires
    void after_claim(Claim &c, int64_t contended_before);
    Task<void> carry_over(Claim next, Pass &p);
    bool contended_recently() const { return ctx_.now() < contended_until_; }
    int64_t fire_contention() const;
    void set_batch(int64_t rows);

    LoopContext &ctx_;
    DrainFigures fig_;
    ClaimBook &book_;  // each claimed row's state (claim_book.hpp)
    Recovery &recovery_;
    DueFloor &floor_;
    int64_t batch_ = 0;  // 0 until the first drain: then sweeper_claim_batch
    // Loop clock until which claims are sent after their fires, not beside them.
    uint64_t contended_until_ = 0;
    static constexpr uint64_t kContendedHoldMs = 1000;
    std::vector<Kept> kept_;
    // The last claim around kept segments that came back empty (hold_back_claim).
    struct AroundKept {
        bool empty = false;
        uint64_t at = 0;         // loop clock when it came back
        PartitionKeys left_out;  // the partitions it left out
        bool woken = false;      // a wake rang since
    };
    AroundKept around_;
    // Each partition's row address after our last fire of it, handed to the next fire of it
    // (partition_addresses.hpp).
    PartitionAddresses addresses_;
    BusyPartitions busy_partitions_;  // what came back busy lately: fire_waits_first
    std::optional<Claim> carried_;  // for the next pass (carrying)
    PartitionKeys kept_partitions() const;  // sorted, distinct
    bool holding_back() const;
    int64_t hold_back_window_ms() const;
};

// Test seams (integration tests link the core): each counts down and, while above zero,
// makes the next such step throw, as an internal error (an allocation failure) would.
extern std::atomic<int> g_test_fault_pack;        // packing a claim
extern std::atomic<int> g_test_fault_claim;       // decoding a claim's answer (not one taken ahead)
extern std::atomic<int> g_test_fault_claim_ahead; // decoding the answer of a claim taken ahead
extern std::atomic<int> g_test_fault_fire_answer; // reading a fire's answer

}  // namespace qsw
