// The one classifier of errors: what a failure means for the phase that saw it. Every
// SQLSTATE the library reacts to is named here and nowhere else; where a failure came from
// (the server's answer, a lost connection, a call never sent, our own code) is recorded in
// the result by the layer that saw it (PgResult::origin), never read back from a message.
#pragma once
#include <array>
#include <string_view>

#include "pg/pg_conn.hpp"

namespace qsw {

enum class ErrorClass {
    transient,  // no SQLSTATE (connection lost, timeout), 40001, 40P01, classes 08, 53, 57, 58
    config,     // class 42: a missing function or a revoked right; the optional phases turn off
    permanent,  // everything else
};

ErrorClass classify_sqlstate(std::string_view sqlstate);
const char *error_class_name(ErrorClass c);

// The class of a failed result: an internal failure (an exception in this library around
// the call) is never the timers' fault nor the database's, and is classed permanent only
// for the counters; is_internal() tells it apart.
ErrorClass classify(const PgResult &r);
inline bool is_internal(const PgResult &r) { return r.origin == Origin::internal; }

// A server that refused a read-write transaction: a standby, a primary demoted under us.
bool is_read_only(const PgResult &r);
// The call may have run but its answer is gone: sent, then the connection broke or the
// deadline passed; a connection exception (class 08); the server ending the session
// (57P01 terminate or shutdown, 57P02 crash, 57P03 starting up); or a read-only server.
// Nothing says the timer is at fault, and the rows claimed under it are still ours.
bool is_answer_lost(const PgResult &r);
// The pool refused the call before sending it: nothing ran.
inline bool is_never_sent(const PgResult &r) { return !r.ok && r.origin == Origin::refused; }
// A lock wait that ran out (55P03 lock_not_available under a lock_timeout): the object is
// someone else's for now, nothing about the call is wrong.
bool is_lock_timeout(const PgResult &r);
// 42501 insufficient_privilege.
bool is_privilege_denied(const PgResult &r);
// The schema is not there: no function (42883), no schema (3F000), no table (42P01). To a
// question such as "which schema version is here?" that is the answer, not a failure: a
// call that asks it names these (Query::answer_sqlstates) and the pool does not count them.
inline constexpr std::array<std::string_view, 3> kSchemaAbsentSqlstates{"42883", "3F000", "42P01"};
bool is_schema_absent(const PgResult &r);
// Two appliers of the idempotent schema met on catalog rows: applying again is the fix.
bool is_apply_race(const PgResult &r);

}  // namespace qsw
