#include "pg/classify.hpp"

namespace qsw {

ErrorClass classify_sqlstate(std::string_view s) {
    // No SQLSTATE at all means the failure was not the server's answer: the
    // connection broke or the deadline passed. Retrying costs nothing.
    if (s.size() != 5) return ErrorClass::transient;
    if (s == "40001" || s == "40P01") return ErrorClass::transient;
    // A read-only server (a standby, a primary demoted under us, 25006) says nothing about
    // the timer: the connection is replaced and the call retried on whatever is primary.
    if (s == "25006") return ErrorClass::transient;
    const std::string_view cls = s.substr(0, 2);
    if (cls == "08" || cls == "53" || cls == "57" || cls == "58") return ErrorClass::transient;
    if (cls == "42") return ErrorClass::config;
    return ErrorClass::permanent;
}

ErrorClass classify(const PgResult &r) {
    if (r.origin == Origin::internal) return ErrorClass::permanent;
    return classify_sqlstate(r.sqlstate);
}

bool is_read_only(const PgResult &r) { return !r.ok && r.sqlstate == "25006"; }

bool is_answer_lost(const PgResult &r) {
    if (r.ok || r.origin == Origin::internal) return false;
    if (r.origin == Origin::transport || r.origin == Origin::refused) return true;
    const std::string &s = r.sqlstate;
    return s.empty() || is_read_only(r) || s.rfind("08", 0) == 0 || s == "57P01" || s == "57P02" || s == "57P03";
}

bool is_lock_timeout(const PgResult &r) { return !r.ok && r.sqlstate == "55P03"; }

bool is_privilege_denied(const PgResult &r) { return !r.ok && r.sqlstate == "42501"; }

bool is_schema_absent(const PgResult &r) {
    if (r.ok) return false;
    for (auto s : kSchemaAbsentSqlstates)
        if (r.sqlstate == s) return true;
    return false;
}

bool is_apply_race(const PgResult &r) {
    const std::string &s = r.sqlstate;
    return !r.ok && (s == "23505" || s == "42P07" || s == "42710" || s == "XX000" || s == "40P01");
}

const char *error_class_name(ErrorClass c) {
    switch (c) {
    case ErrorClass::transient: return "transient";
    case ErrorClass::config: return "config";
    case ErrorClass::permanent: return "permanent";
    }
    return "permanent";
}

}  // namespace qsw
