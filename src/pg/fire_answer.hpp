// The fire's answer (sql::kFire) as a value: its two forms read by one pure decoder that
// never throws. Apart from pg/calls.hpp so that it needs neither libpq nor the pool: the
// fuzz target tests/fuzz/fire_answer.cpp reads arbitrary text through it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace qsw {

// What the fire says of one segment, by its "status".
enum class FireSegStatus {
    busy,       // "busy", absent, or no entry for the segment: still claimed, kept
    fired,      // pushed and its timers deleted; "baseOffset" its first offset
    stale,      // some row was no longer ours; "held" of them still were
    duplicate,  // inside the queue's dedup window; "duplicates", "released"
    other,      // any other status: the segment is done with, nothing counted
};

struct FireSegmentAnswer {
    FireSegStatus status = FireSegStatus::busy;
    int64_t base_offset = -1;  // fired: "baseOffset" (-1: not given)
    int64_t held = 0;          // stale: "held"
    int64_t duplicates = 0;    // duplicate: "duplicates"
    int64_t released = 0;      // duplicate: "released"
};

// A fire's answer as a value, from its full form ("segments") or its compact one
// ("statuses" and an array per kind, which the sweeper asks for). Unreadable (not JSON, not
// an object, no "segments" array, a segment entry that is not an object or a "status" that
// is not a string; in the compact form, anything that does not add up): the fire committed
// and what it did is unknown; `unreadable` says why.
struct FireAnswer {
    bool readable = false;
    std::string unreadable;
    std::vector<FireSegmentAnswer> segments;  // as answered, in segment order
    int64_t provision_busy = 0;  // "provisionBusy": busy segments whose queue name someone held (>= 0)
    // "partitionTids" (schema 37): per segment of the call, the address of its partition's
    // row after the fire ("(block,offset)"; empty: none, the segment was not appended).
    // Empty vector: not given, or not usable (not an array as long as the segments, or an
    // element neither null nor a tid): a hint only, so never a reason to call the answer
    // unreadable, and never passed on unless it is a tid.
    std::vector<std::string> partition_tids;
    // Segment i of the call (an answer shorter than the call: busy).
    FireSegmentAnswer segment(size_t i) const { return i < segments.size() ? segments[i] : FireSegmentAnswer{}; }
};

// The answer as parsed JSON, or as the text the statement returns (not JSON: unreadable).
FireAnswer read_fire_answer(const nlohmann::json &j);
FireAnswer parse_fire_answer(std::string_view text);

}  // namespace qsw
