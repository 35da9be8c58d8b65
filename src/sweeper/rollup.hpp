// The usage rollup: the quota gauges of queen.kv_usage, refreshed on a slow gate of its
// own (kv_usage_every_ms, 5 min; 30 s while a tenant is above 80% of its quota). Below
// the fire and above the prune in priority: shed second under pressure. Its figures are
// the database's, so one pass per interval serves every broker (schema version 10,
// queen.kv_usage_step_v2): when this broker's gate opens and another broker's pass ran
// less than an interval ago, or is running, this one passes it up (rollup_skipped_total)
// and looks again when that interval has run out.
#pragma once
#include <cstdint>
#include <vector>

#include "base/task.hpp"
#include "sweeper/context.hpp"

namespace qsw {

// After a pass passed up: how long until this broker's gate opens again. age_ms is how long
// ago the other broker's pass ran ("recent"), or negative when it is running now: then a
// whole interval. Never less than kRollupMinWaitMs (clocks of two brokers differ a little),
// nor than the interval when that is shorter.
constexpr int64_t kRollupMinWaitMs = 1000;
int64_t rollup_wait_after_skip(int64_t every_ms, int64_t age_ms);

class Rollup {
public:
    explicit Rollup(const LoopContext &ctx) : ctx_(ctx) {}

    // One pass if the ladder allows it and the gate (read at `now_mono`) is open. A shed
    // or failed pass does not consume the gate: it runs as soon as it may.
    Task<void> run(const std::vector<int16_t> &shards, bool allowed, uint64_t now_mono);
    // The stage shown in stats ("on" or "shed"); "off_config" stays once it is off.
    void show_stage(bool allowed);
    // Its figures, written here alone on the loop thread; the sweeper's publish gathers them.
    const RollupFigures &figures() const { return fig_; }
    // The sleep never outlasts this gate while the rollup may run (an idle loop must still
    // refresh the gauges on their cadence); INT64_MAX while it is shed or off.
    int64_t ms_until_gate() const;

private:
    struct Outcome {
        bool ran = false;      // a pass ran here and its figures are in the stats
        bool skipped = false;  // another broker's pass serves this interval
        int64_t age_ms = -1;   // skipped: how long ago that pass ran (negative: running)
    };
    Task<Outcome> pass(const std::vector<int16_t> &shards, int64_t every);
    int64_t every_ms() const;  // the interval: kv_usage_every_ms, or 30 s above the watermark

    const LoopContext &ctx_;
    bool off_ = false;   // class 42: off for the life of the process
    bool shed_ = false;  // the last cycle's ladder shed it
    uint64_t next_mono_ = 0;
    double last_quota_ratio_ = 0;
    RollupFigures fig_;
};

}  // namespace qsw
