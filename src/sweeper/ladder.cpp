#include "sweeper/ladder.hpp"

#include <algorithm>

namespace qsw {

LadderStep shedding_ladder(int64_t pressure, int64_t slow_pressure, int64_t cycle_max_rows, int64_t claim_batch) {
    LadderStep s;
    const int64_t p = std::max<int64_t>(pressure, 0);
    s.prune = p < 1;
    s.rollup = p < 2;
    const int64_t floor_rows = std::max<int64_t>(std::min(claim_batch, cycle_max_rows), 1);
    int64_t budget = std::max<int64_t>(cycle_max_rows, 1);
    const int64_t slow = std::max<int64_t>(slow_pressure, 0);
    for (int64_t i = 0; i < slow && budget > floor_rows; ++i) budget /= 2;
    s.fire_row_budget = std::max(budget, floor_rows);
    return s;
}

}  // namespace qsw
