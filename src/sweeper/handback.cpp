#include "sweeper/handback.hpp"

#include "pg/calls.hpp"

namespace qsw {

Task<std::optional<int64_t>> release_rows(LoopContext &ctx, const std::vector<RowRef> &rows, int64_t timeout_ms,
                                          const std::string &phase) {
    if (rows.empty()) co_return int64_t(0);
    ReleaseArgs args;
    args.tenants.reserve(rows.size());
    args.queues.reserve(rows.size());
    args.keys.reserve(rows.size());
    args.tokens.reserve(rows.size());
    for (const RowRef &r : rows) {
        args.tenants.push_back(r.tenant);
        args.queues.push_back(r.queue);
        args.keys.push_back(r.timer_key);
        args.tokens.push_back(r.claim_token);
    }
    Query q = release_query(args);
    q.timeout_ms = timeout_ms;
    PgResult r = co_await ctx.pool.query(Lane::maint, std::move(q));
    const std::optional<int64_t> released = read_released(r);
    if (!released) {
        if (r.ok) r.message = "the release answered unreadably";
        ctx.note_error(phase, r);
    }
    co_return released;
}

}  // namespace qsw
