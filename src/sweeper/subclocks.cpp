// C. SUB-CLOCKS (subclocks.hpp): the order of the two phases, the shedding stage, and what
// a class 42 error does to either.
#include "sweeper/subclocks.hpp"

namespace qsw {

void maintenance_phase_off(const LoopContext &ctx, const char *phase, const PgResult &r) {
    const bool prune = std::string(phase) == "KV prune";
    ctx.log.warn(std::string(phase) + " turned off for the life of this process (SQLSTATE " + r.sqlstate + "): " +
                 r.message +
                 (prune ? ". Reads stay correct (kv_live_v1 hides expired rows) and the fire keeps running, but "
                          "queen.kv grows and, with vacuum_truncate off, never gives its pages back"
                        : ". Reads stay correct and the fire keeps running, but the quota gauges in "
                          "queen.kv_usage go stale"));
    ctx.note_error(phase, r);
}

Task<bool> SubClocks::run(const std::vector<int16_t> &shards, const LadderStep &step, int64_t step_pressure) {
    // Both gates are read at the same instant, before either phase runs.
    const uint64_t now = ctx_.now();
    const std::string stage = std::string(step.rollup ? "on" : "shed") + "/" + (step.prune ? "on" : "shed");
    if (stage != stage_logged_) {
        ctx_.log.log(stage == "on/on" ? QUEEN_SWEEPER_LOG_INFO : QUEEN_SWEEPER_LOG_WARN,
                 "shedding stage rollup/prune: " + stage_logged_ + " -> " + stage + " (pressure " +
                     std::to_string(step_pressure) + ")");
        stage_logged_ = stage;
    }
    // Both set before either runs, and published together, so a reader never sees a stage
    // the ladder cannot produce.
    rollup_.show_stage(step.rollup);
    prune_.show_stage(step.prune);
    co_await rollup_.run(shards, step.rollup, now);
    co_await ring_tidy_.run(step.rollup, now);
    co_return co_await prune_.run(shards, step.prune, now);
}

}  // namespace qsw
