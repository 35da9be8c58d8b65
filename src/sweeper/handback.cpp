#include "sweeper/handback.hpp"

#include "pg/sql_args.hpp"
#include "pg/statements.hpp"

namespace qsw {

Task<std::optional<int64_t>> release_rows(LoopContext &ctx, const std::vector<RowRef> &rows, int64_t timeout_ms,
                                          const std::string &phase) {
    if (rows.empty()) co_return int64_t(0);
    std::vector<std::string> tenants, queues, keys, tokens;
    tenants.reserve(rows.size());
    queues.reserve(rows.size());
    keys.reserve(rows.size());
    tokens.reserve(rows.size());
    for (const RowRef &r : rows) {
        tenants.push_back(r.tenant);
        queues.push_back(r.queue);
        keys.push_back(r.timer_key);
        tokens.push_back(r.claim_token);
    }
    Query q;
    q.sql = sql::kRelease;
    q.params = {text_param(pg_text_array(tenants)), text_param(pg_text_array(queues)), text_param(pg_text_array(keys)),
                text_param(pg_text_array(tokens))};
    q.timeout_ms = timeout_ms;
    PgResult r = co_await ctx.pool.query(Lane::maint, std::move(q));
    int64_t released = 0;
    if (!r.ok || r.rows() != 1 || !parse_i64(r.get(0, 0), released)) {
        if (r.ok) r.message = "the release answered unreadably";
        ctx.note_error(phase, r);
        co_return std::nullopt;
    }
    co_return released;
}

}  // namespace qsw
