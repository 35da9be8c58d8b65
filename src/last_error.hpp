// The thread-local last error behind queen_sweeper_last_error().
#pragma once
#include <string>

namespace qsw {

// Records the message for the calling thread; returned by queen_sweeper_last_error().
void set_last_error(std::string message);
// Clears it (a successful call does not have to clear; failing calls always set).
void clear_last_error();
// The calling thread's message; never null.
const char *last_error_cstr();

}  // namespace qsw
