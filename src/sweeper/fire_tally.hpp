// What one fire's answer means for the batch it fired, as a pure function (no clock, no
// I/O): the counts for the stats, the segments that came back busy (kept, still claimed),
// the stale rows to hand back, the fired segments to announce, and the rows no longer
// held. drain.cpp carries it out.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "codec/packer.hpp"
#include "pg/calls.hpp"

namespace qsw {

struct FireTally {
    int64_t fired = 0, fired_segs = 0;  // timers and segments fired
    int64_t stale = 0;                  // stale segments
    int64_t dup = 0;                    // duplicates (inside the queue's dedup window)
    int64_t released = 0;               // rows the fire released (stale "held", duplicate "released")
    int64_t stale_unheld = 0;           // rows of stale segments the fire did not release
    int64_t provision_busy = 0;         // busy segments whose queue or partition name someone held
    int64_t lag_max = 0;
    std::vector<int64_t> lags;                            // each fired timer's lateness, ms (>= 0)
    std::vector<std::pair<size_t, int64_t>> fired_notes;  // (segment, base offset), to announce
    FireBatch busy;                                       // still claimed and held: kept
    std::vector<size_t> stale_rows;                       // rows of stale segments: handed back (settled so)
    std::vector<size_t> done_rows;                        // rows of every other segment not busy: settled
};

// `rows` are the batch's claimed rows (segments index into them); a row's late_ms is its
// lateness at claim less the loop clock then, so lateness now is late_ms + now_mono.
FireTally tally_fire(const FireAnswer &answer, const FireBatch &batch, const std::vector<ClaimedTimer> &rows,
                     int64_t now_mono);

}  // namespace qsw
