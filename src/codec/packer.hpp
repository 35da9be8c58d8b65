// The fire packer: claimed timer rows in, fire batches of packed segments out. A pure
// function of its inputs, run outside any transaction so that no connection or lock is held
// while zstd works.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace qsw {

// One row as log_timers_claim_v1 returned it, in claim order.
struct ClaimedTimer {
    std::string tenant;  // uuid text
    std::string queue;
    std::string partition;
    std::string timer_key;
    std::string txn;
    uint8_t message_id[16] = {};
    std::string payload;
    bool payload_zstd = false;
    bool encrypted = false;
    std::optional<std::string> producer_sub;
    std::string claim_token;  // uuid text
    int64_t deliver_at_ms = 0;
    int64_t late_ms = 0;
    int attempts = 0;
    // Where the claim left the row: "(block,offset)" as the server prints a tid, or empty
    // when unknown. A hint for the fire (it finds the row there without a key lookup, and
    // checks that it is this timer); never an identity.
    std::string row_tid;
};

// One segment for one (tenant, queue, partition): what log_timers_fire_v2 receives per
// segment, plus the input rows it carries so the caller can pass their keys and tokens.
struct PackedSegment {
    std::string tenant;
    std::string queue;
    std::string partition;
    uint32_t count = 0;
    std::string hashes;        // 16 bytes per frame, xxh3-128 of the txn, big-endian
    std::string blob;          // zstd of the concatenated frames
    std::vector<size_t> rows;  // indices into the input, in frame order
    size_t bytes = 0;          // blob.size() + hashes.size()
};

// One fire call, one transaction.
struct FireBatch {
    std::vector<PackedSegment> segments;
    size_t bytes = 0;  // sum of the segments' bytes
};

struct PackResult {
    std::vector<FireBatch> batches;
    // Rows that cannot be framed, in input order, with the reason (a payload_zstd payload
    // that does not decompress, a txn or producer sub over 65535 bytes). The caller fails
    // them as permanent; every other row is in exactly one segment.
    std::vector<std::pair<size_t, std::string>> rejected;
    // payload_zstd rows left out because inflating them would pass the call's inflation
    // budget. They are sound: the caller hands them back (token-matched, no attempt spent)
    // and a later claim takes them first, so RSS stays bounded whatever the table holds.
    std::vector<size_t> deferred;
};

// The largest payload a frame may carry once inflated: the limit log_timers_apply_v1
// enforces on payloads (1 MiB). A payload_zstd payload inflating past it is refused by the
// packer with its own reason, without ever inflating more than this.
inline constexpr size_t kMaxPayloadBytes = size_t{1} << 20;

// How much one pack_timers call may inflate in all: twice the byte cap, within [4, 64] MiB.
size_t inflate_budget(size_t max_fire_bytes);

// Packs claimed rows into fire batches.
//
// Rows are grouped by (tenant, queue, partition), groups in order of first appearance, claim
// order kept inside each. A row whose txn (empty included) already appeared earlier in the
// same (tenant, queue) goes into a segment of its own after every segment holding an earlier
// occurrence, so the fire's per-segment dedup check judges it alone and after the first, and
// no segment ever repeats a hash (the fire refuses one that does).
// A group is split so that no segment's raw frames plus hashes pass max_fire_bytes, and a
// multi-frame segment whose compressed blob plus hashes still passes it is halved. Batches
// take segments in order while blob + hashes stay within max_fire_bytes; a segment over the
// cap (a single oversized timer) is a batch of its own: never stuck, never dropped.
//
// Throws std::bad_alloc (and std::runtime_error if zstd itself fails).
PackResult pack_timers(const std::vector<ClaimedTimer> &rows, size_t max_fire_bytes);
PackResult pack_timers(const std::vector<ClaimedTimer> &rows, size_t max_fire_bytes, size_t inflate_budget);

// Test seam (integration tests link the core): when set, called at the start of every
// pack_timers on the packing thread, so a test can look at the database while a pack is
// in progress (no connection may be held then). Null in production.
extern std::atomic<void (*)()> g_test_on_pack;

}  // namespace qsw
