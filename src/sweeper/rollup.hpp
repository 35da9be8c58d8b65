// The usage rollup: the quota gauges of queen.kv_usage, refreshed on a slow gate of its
// own (kv_usage_every_ms, 5 min; 30 s while a tenant is above 80% of its quota). Below
// the fire and above the prune in priority: shed second under pressure.
#pragma once
#include <cstdint>
#include <vector>

#include "base/task.hpp"
#include "sweeper/context.hpp"

namespace qsw {

class Rollup {
public:
    explicit Rollup(const LoopContext &ctx) : ctx_(ctx) {}

    // One pass if the ladder allows it and the gate (read at `now_mono`) is open. A shed
    // or failed pass does not consume the gate: it runs as soon as it may.
    Task<void> run(const std::vector<int16_t> &shards, bool allowed, uint64_t now_mono);
    // The stage shown in stats ("on" or "shed"); "off_config" stays once it is off.
    void show_stage(Figures &f, bool allowed) const;
    // The sleep never outlasts this gate while the rollup may run (an idle loop must still
    // refresh the gauges on their cadence); INT64_MAX while it is shed or off.
    int64_t ms_until_gate() const;

private:
    Task<bool> pass(const std::vector<int16_t> &shards);

    const LoopContext &ctx_;
    bool off_ = false;   // class 42: off for the life of the process
    bool shed_ = false;  // the last cycle's ladder shed it
    uint64_t next_mono_ = 0;
    double last_quota_ratio_ = 0;
};

}  // namespace qsw
