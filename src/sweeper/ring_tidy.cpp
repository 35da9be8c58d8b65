// The tenants' ring's tidy (ring_tidy.hpp). Its statement is
// queen.log_timers_tenants_tidy_v1 (sql/002_timers.sql).
#include "sweeper/ring_tidy.hpp"

#include <algorithm>

#include "pg/calls.hpp"
#include "pg/classify.hpp"

namespace qsw {

int64_t ring_tidy_wait(bool answered, int64_t tenants, int64_t backoff_ms) {
    if (!answered) return std::max<int64_t>(backoff_ms, 1);
    return tenants > 0 ? kRingTidyEveryMs : kRingTidyIdleMs;
}

Task<void> RingTidy::run(bool allowed, uint64_t now_mono) {
    if (off_ || !allowed || now_mono < next_mono_ || ctx_.stopping.load()) co_return;
    Query q = ring_tidy_query(kRingTidyMax);
    q.timeout_ms = ctx_.cfg.stmt_timeout_ms;
    PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
    RingTidyAnswer a;
    if (!r.ok) {
        if (classify(r) == ErrorClass::config) {
            off_ = true;  // the ring's table or its tidy is missing: claims still reach every row
            ctx_.log.warn("tenants' ring tidy turned off for the life of this process (SQLSTATE " + r.sqlstate +
                          "): " + r.message + ". Timers keep firing; tenants without timers stay in the ring");
        }
        ctx_.note_error("ring tidy", r);
    } else {
        a = read_ring_tidy_answer(r.get(0, 0));
    }
    if (a.readable) {
        fig_.tenants = a.tenants;
        fig_.removed_total += a.removed;
    }
    next_mono_ = ctx_.now() + static_cast<uint64_t>(ring_tidy_wait(a.readable, a.tenants,
                                                                   ctx_.cfg.sweeper_transient_backoff_ms));
}

}  // namespace qsw
