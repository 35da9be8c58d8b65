// The KV prune (prune.hpp). Its statement is kv_expire_step_v1 (sql/005_kv_maintenance.sql).
#include "sweeper/prune.hpp"

#include <algorithm>

#include "pg/classify.hpp"
#include "pg/calls.hpp"
#include "sweeper/subclocks.hpp"

namespace qsw {

// kv_expire_step_v1 counts expired-but-present rows up to 8 calls' worth.
constexpr int kPruneCallsPerPass = 8;

void Prune::show_stage(bool allowed) {
    if (!off_) fig_.phase_prune = allowed ? "on" : "shed";
}

int64_t Prune::ms_until_gate() const { return off_ ? INT64_MAX : ctx_.ms_until(next_mono_); }

Task<bool> Prune::run(const std::vector<int16_t> &shards, bool allowed, uint64_t now_mono) {
    if (off_) co_return false;
    if (!allowed || now_mono < next_mono_ || ctx_.stopping.load()) co_return work_ahead_;
    bool kv_work = false;
    const bool ok = co_await pass(shards, kv_work);
    // What the last answered pass saw stands until the next one: a cycle between two passes
    // is not idle because the gate was closed (cycles come faster than the gate when
    // sweeper_max_sleep_ms is below kv_expire_every_ms). A failed pass tells nothing new.
    if (ok) work_ahead_ = kv_work;
    // A failure does not consume the interval: try again after the short backoff.
    next_mono_ = ctx_.now() +
                 static_cast<uint64_t>(ok ? ctx_.cfg.kv_expire_every_ms : ctx_.cfg.sweeper_transient_backoff_ms);
    co_return off_ ? false : work_ahead_;
}

Task<bool> Prune::pass(const std::vector<int16_t> &shards, bool &kv_work) {
    // The prune's budget is its own: kv_expire_batch rows per call, whatever the fire
    // did this cycle. Pacing it by the fire's leftover rows cut it to one row (and its
    // alarm to "8, capped") exactly when a backlog made the fire busy. A pass makes at
    // most kPruneCallsPerPass calls: as many rows as one call's alarm can count.
    for (int call = 0; call < kPruneCallsPerPass && !ctx_.stopping.load(); ++call) {
        const int64_t batch = std::max<int64_t>(ctx_.cfg.kv_expire_batch, 1);
        Query q = kv_expire_query(KvExpireArgs{shards, batch});
        q.timeout_ms = ctx_.cfg.stmt_timeout_ms;
        PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
        if (!r.ok) {
            if (classify(r) == ErrorClass::config) {
                off_ = true;
                maintenance_phase_off(ctx_, "KV prune", r);
                fig_.phase_prune = "off_config";
            } else {
                ctx_.note_error("KV prune", r);
            }
            co_return false;
        }
        const KvExpireAnswer a = read_kv_expire_answer(r.get(0, 0));
        if (!a.readable) co_return false;
        ++fig_.kv_prune_calls_total;
        fig_.kv_deleted_total += a.deleted;
        // Computed on every pass, including those that delete nothing: an unpruned
        // table is a failure that looks like health.
        fig_.kv_expired_not_pruned = a.unpruned;
        fig_.kv_expired_not_pruned_capped = a.unpruned_capped;
        fig_.kv_expiry_lag_ms = a.lag_ms;
        // Keys with a ttl still ahead are work to come: a put carries no wake, so the prune
        // keeps its cadence for them rather than letting the idle backoff stretch it to
        // sweeper_idle_max_sleep_ms (schema version 6; an older schema omits the key).
        kv_work = kv_work || !a.done || a.unpruned > 0 || a.ttl_ahead;
        if (a.done || a.deleted == 0) break;
    }
    co_return true;
}

}  // namespace qsw
