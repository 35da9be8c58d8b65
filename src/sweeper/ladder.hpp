// The shedding ladder: which optional phases run at a given pressure. Priority
// from the top is fire, usage rollup, KV prune; shedding starts at the bottom.
// The fire is not on the ladder at all: it never switches itself off.
#pragma once
#include <cstdint>

namespace qsw {

struct LadderStep {
    bool prune = true;
    bool rollup = true;
    int64_t fire_row_budget = 0;  // this cycle's row budget for the drain
};

// pressure = consecutive cycles under database pressure (the drain ran out of its
// half-lease, or one of its calls failed transiently: the database is slow, unreachable
// or overloaded). 1 sheds the prune, 2 or more sheds the rollup too. A drain that merely
// used up its row budget is a backlog on a healthy database and is no pressure at all.
// slow_pressure = consecutive cycles whose drain ran out of time: the database is
// slow, so the fire's budget halves per step, never below one claim batch. A drain
// that merely used up its rows in good time is a backlog, not a slow database, and
// keeps its full budget: throttling a healthy fire only makes timers later.
LadderStep shedding_ladder(int64_t pressure, int64_t slow_pressure, int64_t cycle_max_rows, int64_t claim_batch);

}  // namespace qsw
