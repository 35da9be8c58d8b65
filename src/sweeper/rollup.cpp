// The usage rollup (rollup.hpp). Its statement is kv_usage_step_v1 (sql/005_kv_maintenance.sql).
#include "sweeper/rollup.hpp"

#include <algorithm>

#include "pg/classify.hpp"
#include "pg/statements.hpp"
#include "pg/sql_args.hpp"
#include "sweeper/subclocks.hpp"

namespace qsw {

// While a tenant is above this share of its quota the rollup refreshes on the
// quota cadence instead of its slow one.
constexpr double kQuotaWatermark = 0.8;
constexpr int64_t kQuotaRefreshMs = 30000;
constexpr int kRollupMaxTenants = 1000;

void Rollup::show_stage(Figures &f, bool allowed) const {
    if (!off_) f.phase_rollup = allowed ? "on" : "shed";
}

int64_t Rollup::ms_until_gate() const {
    if (off_ || shed_) return INT64_MAX;
    return ctx_.ms_until(next_mono_);
}

Task<void> Rollup::run(const std::vector<int16_t> &shards, bool allowed, uint64_t now_mono) {
    shed_ = !allowed;
    if (off_ || !allowed || now_mono < next_mono_) co_return;
    if (co_await pass(shards)) {
        const int64_t every = last_quota_ratio_ > kQuotaWatermark
                                  ? std::min(kQuotaRefreshMs, ctx_.cfg.kv_usage_every_ms)
                                  : ctx_.cfg.kv_usage_every_ms;
        next_mono_ = ctx_.now() + static_cast<uint64_t>(every);
    } else {
        // A failure does not consume the interval: try again after the short backoff.
        next_mono_ = ctx_.now() + static_cast<uint64_t>(ctx_.cfg.sweeper_transient_backoff_ms);
    }
}

Task<bool> Rollup::pass(const std::vector<int16_t> &shards) {
    Query q;
    q.sql = sql::kKvUsageStep;
    q.params = {text_param(shards_param(shards)), text_param(std::to_string(kRollupMaxTenants))};
    q.timeout_ms = ctx_.cfg.stmt_timeout_ms;
    PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
    if (!r.ok) {
        if (classify(r) == ErrorClass::config) {
            off_ = true;
            maintenance_phase_off(ctx_, "usage rollup", r);
            std::lock_guard<std::mutex> g(ctx_.stats.mu);
            ctx_.stats.f.phase_rollup = "off_config";
        } else {
            ctx_.note_error("usage rollup", r);
        }
        co_return false;
    }
    nlohmann::json j = nlohmann::json::parse(r.get(0, 0), nullptr, false);
    if (j.is_discarded()) co_return false;
    last_quota_ratio_ = j.value("maxQuotaRatio", 0.0);
    std::lock_guard<std::mutex> g(ctx_.stats.mu);
    auto &f = ctx_.stats.f;
    ++f.rollup_runs_total;
    f.rollup_max_quota_ratio = last_quota_ratio_;
    f.rollup_sampled = j.value("sampled", false);
    f.rollup_tenants = j.contains("tenants") ? j["tenants"] : nlohmann::json::array();
    co_return true;
}

}  // namespace qsw
