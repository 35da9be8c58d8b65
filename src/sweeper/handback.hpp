// Handing claimed rows back, token-matched: the one way the drain, the recovery and the
// stop give rows back to the table (queen.log_timers_release_v1: token and claimed_until
// nulled, due again at once, no attempt spent).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/task.hpp"
#include "codec/packer.hpp"
#include "sweeper/context.hpp"

namespace qsw {

struct RowRef {
    std::string tenant, queue, timer_key, claim_token;
};
inline RowRef row_ref(const ClaimedTimer &t) { return RowRef{t.tenant, t.queue, t.timer_key, t.claim_token}; }

// One release call; the number released, or nothing when the call failed (counted against
// `phase` by the caller's note_error).
Task<std::optional<int64_t>> release_rows(LoopContext &ctx, const std::vector<RowRef> &rows, int64_t timeout_ms,
                                          const std::string &phase);

}  // namespace qsw
