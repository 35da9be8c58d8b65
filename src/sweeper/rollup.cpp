// The usage rollup (rollup.hpp). Its statement is kv_usage_step_v2 (sql/005_kv_maintenance.sql).
#include "sweeper/rollup.hpp"

#include <algorithm>

#include "pg/classify.hpp"
#include "pg/calls.hpp"
#include "sweeper/subclocks.hpp"

namespace qsw {

// While a tenant is above this share of its quota the rollup refreshes on the
// quota cadence instead of its slow one.
constexpr double kQuotaWatermark = 0.8;
constexpr int64_t kQuotaRefreshMs = 30000;
constexpr int kRollupMaxTenants = 1000;

void Rollup::show_stage(bool allowed) {
    if (!off_) fig_.phase_rollup = allowed ? "on" : "shed";
}

int64_t Rollup::ms_until_gate() const {
    if (off_ || shed_) return INT64_MAX;
    return ctx_.ms_until(next_mono_);
}

int64_t Rollup::every_ms() const {
    return last_quota_ratio_ > kQuotaWatermark ? std::min(kQuotaRefreshMs, ctx_.cfg.kv_usage_every_ms)
                                               : ctx_.cfg.kv_usage_every_ms;
}

int64_t rollup_wait_after_skip(int64_t every_ms, int64_t age_ms) {
    const int64_t every = std::max<int64_t>(every_ms, 1);
    if (age_ms < 0) return every;  // running elsewhere: a whole interval
    const int64_t left = every - std::min(age_ms, every);
    return std::max<int64_t>(left, std::min(kRollupMinWaitMs, every));
}

Task<void> Rollup::run(const std::vector<int16_t> &shards, bool allowed, uint64_t now_mono) {
    shed_ = !allowed;
    if (off_ || !allowed || now_mono < next_mono_) co_return;
    const int64_t every = every_ms();
    const Outcome o = co_await pass(shards, every);
    if (o.ran) {
        next_mono_ = ctx_.now() + static_cast<uint64_t>(every_ms());
    } else if (o.skipped) {
        // Another broker's pass serves this interval: look again when it has run out.
        next_mono_ = ctx_.now() + static_cast<uint64_t>(rollup_wait_after_skip(every, o.age_ms));
    } else {
        // A failure does not consume the interval: try again after the short backoff.
        next_mono_ = ctx_.now() + static_cast<uint64_t>(ctx_.cfg.sweeper_transient_backoff_ms);
    }
}

Task<Rollup::Outcome> Rollup::pass(const std::vector<int16_t> &shards, int64_t every) {
    Outcome out;
    Query q = kv_usage_query(KvUsageArgs{shards, kRollupMaxTenants, std::clamp<int64_t>(every, 1, INT32_MAX)});
    q.timeout_ms = ctx_.cfg.stmt_timeout_ms;
    PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
    if (!r.ok) {
        if (classify(r) == ErrorClass::config) {
            off_ = true;
            maintenance_phase_off(ctx_, "usage rollup", r);
            fig_.phase_rollup = "off_config";
        } else {
            ctx_.note_error("usage rollup", r);
        }
        co_return out;
    }
    KvUsageAnswer a = read_kv_usage_answer(r.get(0, 0));
    if (!a.readable) co_return out;
    if (a.skipped) {
        out.skipped = true;
        out.age_ms = a.age_ms;
        ++fig_.rollup_skipped_total;
        co_return out;
    }
    out.ran = true;
    last_quota_ratio_ = a.max_quota_ratio;
    ++fig_.rollup_runs_total;
    fig_.rollup_max_quota_ratio = last_quota_ratio_;
    fig_.rollup_sampled = a.sampled;
    fig_.rollup_tenants = std::make_shared<const nlohmann::json>(std::move(a.tenants));
    co_return out;
}

}  // namespace qsw
