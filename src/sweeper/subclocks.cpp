// C. SUB-CLOCKS: the usage rollup, then the KV prune, each on its own gate and
// below the fire in priority. A phase whose cost tracks space rather than work
// is not paced by the phase that tracks work. Shedding starts from the bottom
// (the prune first, then the rollup); a class 42 error turns a phase off for the
// life of the process, and neither can ever take the fire down with it.
#include "pg/classify.hpp"
#include "pg/sql_args.hpp"
#include "sweeper/sweeper.hpp"

namespace qsw {

// While a tenant is above this share of its quota the rollup refreshes on the
// quota cadence instead of its slow one.
constexpr double kQuotaWatermark = 0.8;
constexpr int64_t kQuotaRefreshMs = 30000;
constexpr int kRollupMaxTenants = 1000;
// kv_expire_step_v1 counts expired-but-present rows up to 8 calls' worth.
constexpr int kPruneCallsPerPass = 8;

Task<void> Sweeper::sub_clocks(const std::vector<int16_t> &shards, const LadderStep &step, int64_t step_pressure,
                               bool &kv_work) {
    const uint64_t now = uv_now(&loop_);
    const std::string stage = std::string(step.rollup ? "on" : "shed") + "/" + (step.prune ? "on" : "shed");
    if (stage != shed_state_logged_) {
        log_.log(stage == "on/on" ? QUEEN_SWEEPER_LOG_INFO : QUEEN_SWEEPER_LOG_WARN,
                 "shedding stage rollup/prune: " + shed_state_logged_ + " -> " + stage + " (pressure " +
                     std::to_string(step_pressure) + ")");
        shed_state_logged_ = stage;
    }
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        if (!rollup_off_) stats_.f.phase_rollup = step.rollup ? "on" : "shed";
        if (!prune_off_) stats_.f.phase_prune = step.prune ? "on" : "shed";
    }
    // A shed or failed phase does not consume its gate: it runs as soon as it may.
    rollup_shed_ = !step.rollup;
    if (!rollup_off_ && step.rollup && now >= next_rollup_mono_) {
        if (co_await usage_rollup(shards)) {
            const int64_t every =
                last_quota_ratio_ > kQuotaWatermark ? std::min(kQuotaRefreshMs, cfg_.kv_usage_every_ms) : cfg_.kv_usage_every_ms;
            next_rollup_mono_ = uv_now(&loop_) + static_cast<uint64_t>(every);
        } else {
            // A failure does not consume the interval: try again after the short backoff.
            next_rollup_mono_ = uv_now(&loop_) + static_cast<uint64_t>(cfg_.sweeper_transient_backoff_ms);
        }
    }
    if (!prune_off_ && step.prune && now >= next_prune_mono_ && !stopping_.load()) {
        const bool ok = co_await kv_prune(shards, kv_work);
        next_prune_mono_ = uv_now(&loop_) + static_cast<uint64_t>(ok ? cfg_.kv_expire_every_ms
                                                                        : cfg_.sweeper_transient_backoff_ms);
    }
}

void Sweeper::phase_off_config(const char *phase, const PgResult &r) {
    const bool prune = std::string(phase) == "KV prune";
    log_.warn(std::string(phase) + " turned off for the life of this process (SQLSTATE " + r.sqlstate + "): " +
              r.message +
              (prune ? ". Reads stay correct (kv_live_v1 hides expired rows) and the fire keeps running, but "
                       "queen.kv grows and, with vacuum_truncate off, never gives its pages back"
                     : ". Reads stay correct and the fire keeps running, but the quota gauges in "
                       "queen.kv_usage go stale"));
    note_error(phase, r);
}

Task<bool> Sweeper::kv_prune(const std::vector<int16_t> &shards, bool &kv_work) {
    // The prune's budget is its own: kv_expire_batch rows per call, whatever the fire
    // did this cycle. Pacing it by the fire's leftover rows cut it to one row (and its
    // alarm to "8, capped") exactly when a backlog made the fire busy. A pass makes at
    // most kPruneCallsPerPass calls: as many rows as one call's alarm can count.
    for (int call = 0; call < kPruneCallsPerPass && !stopping_.load(); ++call) {
        const int64_t batch = std::max<int64_t>(cfg_.kv_expire_batch, 1);
        Query q;
        q.sql = "SELECT queen.kv_expire_step_v1($1::int2[], now(), $2::int)::text";
        q.params = {text_param(shards_param(shards)), text_param(std::to_string(batch))};
        q.timeout_ms = cfg_.stmt_timeout_ms;
        PgResult r = co_await pool_->query(Lane::maint, std::move(q));
        if (!r.ok) {
            if (classify_sqlstate(r.sqlstate) == ErrorClass::config) {
                prune_off_ = true;
                phase_off_config("KV prune", r);
                std::lock_guard<std::mutex> g(stats_.mu);
                stats_.f.phase_prune = "off_config";
            } else {
                note_error("KV prune", r);
            }
            co_return false;
        }
        nlohmann::json j = nlohmann::json::parse(r.get(0, 0), nullptr, false);
        if (j.is_discarded()) co_return false;
        const int64_t deleted = j.value("deleted", int64_t(0));
        const bool done = j.value("done", true);
        const int64_t unpruned = j.value("unpruned", int64_t(0));
        {
            std::lock_guard<std::mutex> g(stats_.mu);
            auto &f = stats_.f;
            ++f.kv_prune_calls_total;
            f.kv_deleted_total += deleted;
            // Computed on every pass, including those that delete nothing: an unpruned
            // table is a failure that looks like health.
            f.kv_expired_not_pruned = unpruned;
            f.kv_expired_not_pruned_capped = j.value("unprunedCapped", false);
            f.kv_expiry_lag_ms = j.value("lagMs", int64_t(0));
        }
        kv_work = kv_work || !done || unpruned > 0;
        if (done || deleted == 0) break;
    }
    co_return true;
}

int64_t Sweeper::ms_until_next_gate() const {
    // The sleep never outlasts a gate that is due: an idle loop must still refresh the
    // quota gauges on their cadence. The prune's gate only counts while keys await it
    // (the cycle keeps the ceiling then); an empty KV table lets the idle backoff grow.
    if (rollup_off_ || rollup_shed_) return INT64_MAX;
    const uint64_t now = uv_now(&loop_);
    return next_rollup_mono_ > now ? static_cast<int64_t>(next_rollup_mono_ - now) : 0;
}

Task<bool> Sweeper::usage_rollup(const std::vector<int16_t> &shards) {
    Query q;
    q.sql = "SELECT queen.kv_usage_step_v1($1::int2[], now(), $2::int)::text";
    q.params = {text_param(shards_param(shards)), text_param(std::to_string(kRollupMaxTenants))};
    q.timeout_ms = cfg_.stmt_timeout_ms;
    PgResult r = co_await pool_->query(Lane::maint, std::move(q));
    if (!r.ok) {
        if (classify_sqlstate(r.sqlstate) == ErrorClass::config) {
            rollup_off_ = true;
            phase_off_config("usage rollup", r);
            std::lock_guard<std::mutex> g(stats_.mu);
            stats_.f.phase_rollup = "off_config";
        } else {
            note_error("usage rollup", r);
        }
        co_return false;
    }
    nlohmann::json j = nlohmann::json::parse(r.get(0, 0), nullptr, false);
    if (j.is_discarded()) co_return false;
    last_quota_ratio_ = j.value("maxQuotaRatio", 0.0);
    std::lock_guard<std::mutex> g(stats_.mu);
    auto &f = stats_.f;
    ++f.rollup_runs_total;
    f.rollup_max_quota_ratio = last_quota_ratio_;
    f.rollup_sampled = j.value("sampled", false);
    f.rollup_tenants = j.contains("tenants") ? j["tenants"] : nlohmann::json::array();
    co_return true;
}

}  // namespace qsw
