#include "sweeper/drain_policy.hpp"

#include <algorithm>

namespace qsw {

int64_t next_claim_batch(const BatchInput &in) {
    const int64_t base = std::max<int64_t>(in.base, 1);
    const int64_t ceiling = std::max(base, in.ceiling);
    const int64_t batch = std::clamp(in.batch, base, ceiling);
    if (!in.full) return base;  // the backlog is over
    if (!in.whole) return batch;
    const int64_t lease = std::max<int64_t>(in.lease_ms, 1);
    const int64_t budget = std::max<int64_t>(in.byte_budget, 1);
    // Multiplications below cannot overflow: elapsed and bytes are bounded by a day and by
    // 2^30 in any real call; clamp them to be sure.
    const int64_t elapsed = std::clamp<int64_t>(in.elapsed_ms, 0, int64_t(1) << 40);
    const int64_t bytes = std::clamp<int64_t>(in.claimed_bytes, 0, int64_t(1) << 40);
    if (elapsed * 8 > lease || bytes >= budget) return std::max(base, batch / 2);
    if (elapsed * 16 < lease && bytes * 2 <= budget) return std::min(ceiling, batch * 2);
    return batch;
}

bool claim_ahead(bool full_claim, bool contended_recently, bool stopping) {
    return full_claim && !contended_recently && !stopping;
}

bool carry_claim(const CarryInput &in) {
    return in.ahead && in.budget_spent && !in.out_of_time && !in.failed && !in.shed && !in.holding_back &&
           !in.carrying && !in.phase_due;
}

uint64_t fire_deadline(uint64_t sent_mono, int64_t lease_ms) {
    const int64_t lease = std::max<int64_t>(lease_ms, 0);
    return sent_mono + static_cast<uint64_t>(lease - lease / 4);
}

CallBudget call_budget(uint64_t now_mono, uint64_t deadline_mono, int64_t stmt_timeout_ms) {
    if (deadline_mono <= now_mono) return {};
    const uint64_t left = deadline_mono - now_mono;
    if (left < static_cast<uint64_t>(kMinCallMs)) return {};
    const int64_t stmt = std::max<int64_t>(stmt_timeout_ms, 1);
    return {true, left < static_cast<uint64_t>(stmt) ? static_cast<int64_t>(left) : stmt};
}

BusyRetry busy_retry(int64_t n) {
    BusyRetry r;
    if (n <= 0) {  // at once, waiting a little: another broker's fire or a push lets go soon
        r.wait = true;
        r.lock_wait_ms = 100;
        return r;
    }
    const int64_t k = std::clamp<int64_t>(n - 1, 0, 4);
    r.delay_ms = std::min<int64_t>(int64_t(100) << k, 1000);
    r.wait = n >= 4;
    r.lock_wait_ms = r.wait ? 200 : 0;
    return r;
}

bool hold_back_claim(const HoldBackInput &in) {
    if (!in.came_back_empty || in.partition_freed || in.woken || in.window_ms <= 0) return false;
    if (in.now_mono < in.empty_at_mono) return true;  // a clock read before the answer: still inside
    return in.now_mono - in.empty_at_mono < static_cast<uint64_t>(in.window_ms);
}

FailedFire failed_fire(const FailedFireInput &in) {
    if (in.answer_lost) return FailedFire::park;
    if (in.lock_timeout) return FailedFire::busy;
    if (in.config || in.internal) return FailedFire::hand_back;
    if (!in.transient && !in.isolating && in.isolate_enabled && in.timers > 1) return FailedFire::isolate;
    return FailedFire::fail;
}

}  // namespace qsw
