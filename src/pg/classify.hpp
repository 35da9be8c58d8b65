// The one SQLSTATE classifier: what a failure means for the phase that saw it.
#pragma once
#include <string_view>

namespace qsw {

enum class ErrorClass {
    transient,  // no SQLSTATE (connection lost, timeout), 40001, 40P01, classes 08, 53, 57, 58
    config,     // class 42: a missing function or a revoked right; the optional phases turn off
    permanent,  // everything else
};

ErrorClass classify_sqlstate(std::string_view sqlstate);
const char *error_class_name(ErrorClass c);

}  // namespace qsw
