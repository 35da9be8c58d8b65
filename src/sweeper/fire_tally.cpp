// What one fire's answer means (see fire_tally.hpp).
#include "sweeper/fire_tally.hpp"

#include <algorithm>

namespace qsw {

FireTally tally_fire(const FireAnswer &answer, const FireBatch &batch, const std::vector<ClaimedTimer> &rows,
                     int64_t now_mono) {
    FireTally t;
    // Segments busy because another transaction held their queue or partition name (a queue
    // being created, removed or renamed; schema 18): kept like any busy segment, and counted.
    t.provision_busy = answer.provision_busy;
    for (size_t s = 0; s < batch.segments.size(); ++s) {
        const PackedSegment &seg = batch.segments[s];
        const FireSegmentAnswer sa = answer.segment(s);
        if (sa.status == FireSegStatus::busy) {  // still claimed and held: kept, not forgotten
            t.busy.segments.push_back(seg);
            t.busy.bytes += seg.bytes;
            continue;
        }
        if (sa.status == FireSegStatus::fired) {
            t.fired += seg.count;
            ++t.fired_segs;
            for (size_t idx : seg.rows) {
                const int64_t lag = std::max<int64_t>(rows[idx].late_ms + now_mono, 0);
                t.lags.push_back(lag);
                t.lag_max = std::max(t.lag_max, lag);
            }
            t.fired_notes.emplace_back(s, sa.base_offset);
        } else if (sa.status == FireSegStatus::stale) {
            ++t.stale;
            t.released += sa.held;
            t.stale_unheld += static_cast<int64_t>(seg.count) - sa.held;
            t.stale_rows.insert(t.stale_rows.end(), seg.rows.begin(), seg.rows.end());
            continue;  // settled by their hand-back, not here
        } else if (sa.status == FireSegStatus::duplicate) {
            t.dup += sa.duplicates;
            t.released += sa.released;
        }
        t.done_rows.insert(t.done_rows.end(), seg.rows.begin(), seg.rows.end());
    }
    return t;
}

}  // namespace qsw
