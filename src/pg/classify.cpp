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

const char *error_class_name(ErrorClass c) {
    switch (c) {
    case ErrorClass::transient: return "transient";
    case ErrorClass::config: return "config";
    case ErrorClass::permanent: return "permanent";
    }
    return "permanent";
}

}  // namespace qsw
