// The schema step at start: apply the embedded sql/ (skipped when the database already
// records this library's version) or only check the recorded version, and tell Readiness
// the outcome and, while not ready, what to do about it. While the schema keeps the
// sweeper from being ready, the step is taken again: before every cycle while the database
// does not answer it (so ready follows the first cycle that succeeds), every 5 s while it
// answers with something an operator must fix (so a schema applied or grants given later
// make the sweeper ready).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "base/task.hpp"
#include "sweeper/context.hpp"
#include "sweeper/readiness.hpp"

namespace qsw {

// The schema version this library's sql/ records (sql/008_version.sql). Bumped with any
// change in sql/ that a broker or a sweeper sees, together with that file.
constexpr int64_t kSchemaVersion = 38;

class SchemaStep {
public:
    using Sleep = std::function<Task<void>(int64_t ms)>;  // the loop's sleep, cut short by a stop
    SchemaStep(const LoopContext &ctx, Readiness &readiness, Sleep sleep)
        : ctx_(ctx), readiness_(readiness), sleep_(std::move(sleep)) {}

    Task<void> run();
    // Not ready because of the schema, and time to look again.
    bool recheck_due() const;

private:
    struct Version {
        bool ok = false;       // the call answered
        bool absent = false;   // no queen.schema_version_v1(): unversioned or no schema
        int64_t version = -1;
        PgResult error;
    };
    Task<Version> read_version();
    Task<bool> apply();
    Task<void> apply_and_verify(int64_t want);
    Task<void> unversioned_build(bool first);
    void show_database_version(const Version &v);
    void say_what_to_do(const Version &v, int64_t want);
    std::string last_stats_error();

    const LoopContext &ctx_;
    Readiness &readiness_;
    Sleep sleep_;
    uint64_t next_check_mono_ = 0;  // 0 until the first step
    bool unanswered_ = false;       // the last version check got no answer (a transient failure)
};

}  // namespace qsw
