// The schema step (schema_step.hpp). Its statements: queen.schema_version_v1() and the
// embedded schema itself (pg/schema.hpp, every sql/*.sql in order).
#include "sweeper/schema_step.hpp"

#include <algorithm>
#include <string_view>

#include "pg/classify.hpp"
#include "pg/calls.hpp"
#include "pg/schema.hpp"

namespace qsw {

// While not ready because of the schema, the step is taken again this often.
constexpr uint64_t kSchemaRecheckMs = 5000;

// An embedded schema without queen.schema_version_v1 is unversioned: no check is possible.
static bool embedded_schema_versioned() {
    return std::string_view(kSchemaSql).find("schema_version_v1") != std::string_view::npos;
}

bool SchemaStep::recheck_due() const {
    // Unanswered (the database could not be reached): again before the next cycle, so ready
    // follows the first cycle that succeeds. Answered but not usable (older, unversioned, a
    // missing grant): an operator has to act, so every kSchemaRecheckMs is enough.
    return !readiness_.schema_ok() && (unanswered_ || ctx_.now() >= next_check_mono_);
}

std::string SchemaStep::last_stats_error() {
    std::lock_guard<std::mutex> g(ctx_.stats.mu);
    return ctx_.stats.f.last_error;
}

Task<SchemaStep::Version> SchemaStep::read_version() {
    // Before the schema exists its SQLSTATEs are the answer, not a failure: a healthy first
    // start counts no failed call (an alert on pool_calls_failed_total would fire on every
    // new deployment).
    Query q = schema_version_query();
    q.timeout_ms = ctx_.cfg.stmt_timeout_ms;
    PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
    SchemaVersionAnswer a = read_schema_version(std::move(r));
    Version v;
    v.ok = a.ok;
    v.absent = a.absent;
    v.version = a.version;
    v.error = std::move(a.error);
    co_return v;
}

void SchemaStep::show_database_version(const Version &v) {
    std::lock_guard<std::mutex> g(ctx_.stats.mu);
    ctx_.stats.f.schema_version_database = v.ok && !v.absent ? v.version : -1;
}

Task<void> SchemaStep::run() {
    const bool first = next_check_mono_ == 0;
    next_check_mono_ = ctx_.now() + kSchemaRecheckMs;
    unanswered_ = false;
    const bool versioned = embedded_schema_versioned();
    const int64_t want = versioned ? kSchemaVersion : 0;
    {
        std::lock_guard<std::mutex> g(ctx_.stats.mu);
        ctx_.stats.f.schema_version_expected = want;
    }
    if (!versioned) {
        co_await unversioned_build(first);
        co_return;
    }
    const Version v = co_await read_version();
    if (ctx_.stopping.load()) co_return;
    show_database_version(v);
    if (v.ok && !v.absent && v.version == want) {
        if (ctx_.cfg.apply_schema && first)
            ctx_.log.info("schema version " + std::to_string(want) + " already recorded: DDL skipped");
        readiness_.set_schema_outcome(true, ctx_.cfg.apply_schema ? "skipped" : "current", "");
        co_return;
    }
    if (v.ok && !v.absent && v.version > want) {
        // Never apply older DDL over a newer schema: it would replace newer functions. The _v1
        // functions this library calls are kept by every later schema, so it runs as is.
        ctx_.log.warn("the database records schema version " + std::to_string(v.version) +
                      ", newer than this library's " + std::to_string(want) + ": " +
                      (ctx_.cfg.apply_schema ? "DDL not applied; " : "") +
                      "the _v1 functions it calls are kept by newer schemas; upgrade this library when convenient");
        readiness_.set_schema_outcome(true, "newer", "");
        co_return;
    }
    if (ctx_.cfg.apply_schema && first) {
        // Older, absent or unreadable: apply, then read back what the apply recorded.
        co_await apply_and_verify(want);
        co_return;
    }
    // apply_schema=false (or a failed apply being looked at again): say what to do.
    say_what_to_do(v, want);
}

Task<void> SchemaStep::unversioned_build(bool first) {
    // A build without the version file: the schema step is the apply alone.
    if (!ctx_.cfg.apply_schema) {
        readiness_.set_schema_outcome(true, "unversioned", "");
    } else if (first) {
        const bool ok = co_await apply();
        readiness_.set_schema_outcome(ok, ok ? "applied" : "failed", last_stats_error());
    }
}

Task<void> SchemaStep::apply_and_verify(int64_t want) {
    if (!co_await apply()) {
        readiness_.set_schema_outcome(false, "failed",
                                      last_stats_error() + "; grant the role the rights to run DDL "
                                      "on schema queen, or apply sql/*.sql as its owner and set apply_schema=false");
        co_return;
    }
    const Version after = co_await read_version();
    show_database_version(after);
    if (after.ok && !after.absent && after.version == want) {
        readiness_.set_schema_outcome(true, "applied", "");
        co_return;
    }
    const std::string msg = "after the schema apply the database records version " +
                            (after.ok && !after.absent ? std::to_string(after.version) : std::string("none")) +
                            ", this library expects " + std::to_string(want);
    ctx_.log.error(msg);
    readiness_.set_schema_outcome(false, "failed", msg);
}

void SchemaStep::say_what_to_do(const Version &v, int64_t want) {
    const std::string fix = "apply the library's sql/*.sql with psql -f as a role that may run DDL (see "
                            "sql/README.md), or set apply_schema=true";
    std::string state, reason;
    if (v.ok && v.absent) {
        state = "unversioned";
        reason = "the database has no queen.schema_version_v1(): the schema is not applied or predates version " +
                 std::to_string(want) + "; " + fix;
    } else if (v.ok) {
        state = "older";
        reason = "the database records schema version " + std::to_string(v.version) + ", older than this library's " +
                 std::to_string(want) + "; " + fix;
    } else {
        const bool transient = classify(v.error) == ErrorClass::transient;
        unanswered_ = transient;
        state = "pending";
        reason = "cannot read the schema version" +
                 (v.error.sqlstate.empty() ? std::string() : " (SQLSTATE " + v.error.sqlstate + ")") + ": " +
                 v.error.message +
                 (transient ? "" : is_privilege_denied(v.error) ? "; grant the role USAGE on schema queen and EXECUTE "
                                                                 "on its functions (sql/README.md)"
                                                               : "");
        if (!transient) ctx_.note_error("schema version check", v.error);
    }
    if (reason != readiness_.schema_reason()) {
        if (state == "pending" && classify(v.error) == ErrorClass::transient) ctx_.log.info(reason);
        else ctx_.log.warn(reason);
    }
    readiness_.set_schema_outcome(false, state, reason);
}

Task<bool> SchemaStep::apply() {
    int64_t backoff = 100;
    while (!ctx_.stopping.load()) {
        Query q;
        q.sql = kSchemaSql;
        q.simple = true;
        q.timeout_ms = std::max<int64_t>(ctx_.cfg.stmt_timeout_ms, 60000);
        PgResult r = co_await ctx_.pool.query(Lane::maint, std::move(q));
        if (r.ok) {
            ctx_.log.info("schema applied");
            co_return true;
        }
        // Two brokers applying at the same moment race on catalog rows; the files
        // are idempotent, so trying again is the whole fix.
        if (!is_apply_race(r) && classify(r) != ErrorClass::transient) {
            ctx_.note_error("schema apply", r);
            ctx_.log.error("schema apply failed (SQLSTATE " + r.sqlstate + "): " + r.message +
                           "; the sweeper carries on and its calls will report what is missing");
            co_return false;
        }
        ctx_.note_error("schema apply", r);
        ctx_.publish_pool();
        co_await sleep_(backoff);
        backoff = std::min<int64_t>(backoff * 2, 5000);
    }
    co_return false;
}

}  // namespace qsw
