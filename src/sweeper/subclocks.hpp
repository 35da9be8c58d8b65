// C. SUB-CLOCKS: the usage rollup, then the KV prune, each on its own gate and below the
// fire in priority. A phase whose cost tracks space rather than work is not paced by the
// phase that tracks work. Shedding starts from the bottom (the prune first, then the
// rollup); a class 42 error turns a phase off for the life of the process, and neither can
// ever take the fire down with it (maintenance_phase_off). This runner owns both phases and the stage it last
// logged; each phase owns its gate and its figures.
#pragma once
#include <string>
#include <vector>

#include "base/task.hpp"
#include "sweeper/ladder.hpp"
#include "sweeper/context.hpp"
#include "sweeper/prune.hpp"
#include "sweeper/ring_tidy.hpp"
#include "sweeper/rollup.hpp"

namespace qsw {

// A class 42 answer (function missing or not executable) turns a maintenance phase (the
// prune, the rollup) off for the life of the process: said once, with what it costs, and
// counted. The fire keeps running.
void maintenance_phase_off(const LoopContext &ctx, const char *phase, const PgResult &r);

class SubClocks {
public:
    explicit SubClocks(const LoopContext &ctx) : ctx_(ctx), rollup_(ctx), ring_tidy_(ctx), prune_(ctx) {}

    // The rollup and the tenants' ring's tidy, then the prune, as the ladder step allows (`step_pressure` is the
    // pressure the step was computed from, for the log). Returns whether the prune has work
    // (expired keys remain, or keys with a ttl ahead), so the cycle keeps its cadence.
    Task<bool> run(const std::vector<int16_t> &shards, const LadderStep &step, int64_t step_pressure);
    // The sleep never outlasts the rollup's gate while it may run.
    int64_t ms_until_next_gate() const { return rollup_.ms_until_gate(); }
    // Until the prune's gate opens again; INT64_MAX once it is off.
    int64_t ms_until_prune() const { return prune_.ms_until_gate(); }
    const RingTidy::Figures &ring_tidy_figures() const { return ring_tidy_.figures(); }
    const RollupFigures &rollup_figures() const { return rollup_.figures(); }
    const PruneFigures &prune_figures() const { return prune_.figures(); }

private:
    const LoopContext &ctx_;
    Rollup rollup_;
    RingTidy ring_tidy_;  // runs when the rollup may
    Prune prune_;
    std::string stage_logged_ = "on/on";  // rollup/prune, logged once per change
};

}  // namespace qsw
