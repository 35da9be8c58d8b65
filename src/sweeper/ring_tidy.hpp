// The tenants' ring's tidy: a sub-clock of its own, beside the cycle and never on the
// drain's path. The claims under a backlog walk the tenants with pending timers from
// queen.log_timers_tenants (log_timers_tenant_ring_v1); a tenant is entered by the commit
// that writes its timers, and this removes those left without any
// (queen.log_timers_tenants_tidy_v1: up to kRingTidyMax entries a call from a random place,
// so brokers tidying at once look at different ones). Every kRingTidyEveryMs while the ring
// holds tenants, every kRingTidyIdleMs while it is empty. It runs when the rollup may (shed
// second under pressure): a stale entry costs a claim's ring one descent, nothing else.
#pragma once
#include <cstdint>

#include "base/task.hpp"
#include "sweeper/context.hpp"

namespace qsw {

constexpr int64_t kRingTidyEveryMs = 10000;
constexpr int64_t kRingTidyIdleMs = 60000;
constexpr int64_t kRingTidyMax = 256;

// The wait before the next tidy: its interval after an answer (kRingTidyIdleMs when the ring
// was empty), the transient backoff after a failure.
int64_t ring_tidy_wait(bool answered, int64_t tenants, int64_t backoff_ms);

class RingTidy {
public:
    explicit RingTidy(const LoopContext &ctx) : ctx_(ctx) {}

    // One call if allowed and the gate (read at `now_mono`) is open.
    Task<void> run(bool allowed, uint64_t now_mono);

    // Its figures (stats floor.ring_tenants, floor.ring_removed_total), its own: written on
    // the loop thread, gathered by Sweeper::publish_pool.
    struct Figures {
        int64_t tenants = -1;  // entries at the last tidy (-1: none yet)
        int64_t removed_total = 0;
    };
    const Figures &figures() const { return fig_; }

private:
    const LoopContext &ctx_;
    bool off_ = false;  // class 42 (an older schema without the ring's table): off for good
    uint64_t next_mono_ = 0;
    Figures fig_;
};

}  // namespace qsw
