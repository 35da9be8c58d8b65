// The thread-local last error behind queen_sweeper_last_error(), and the rules for putting
// text that came from outside (configuration, environment, server messages) into a message.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace qsw {

// Records the message for the calling thread; returned by queen_sweeper_last_error().
// The stored text is always well-formed UTF-8 without NUL bytes (hosts decode it as UTF-8
// and read it as a C string), and bounded: a message is never a copy of unbounded input.
void set_last_error(std::string message);
// Clears it (a successful call does not have to clear; failing calls always set).
void clear_last_error();
// The calling thread's message; never null.
const char *last_error_cstr();

// Byte offset of the first byte of `s` that is not part of well-formed UTF-8 (overlong
// forms, UTF-16 surrogates and code points past U+10FFFF are not well-formed), or
// std::string_view::npos when all of `s` is well-formed.
size_t utf8_invalid_at(std::string_view s);

// `s` as a message may show it, without the quotes around it: well-formed UTF-8 is kept,
// except that control characters become \n, \t or \u00XX, and a backslash and the quote
// characters ' and " are escaped; a byte that is not well-formed UTF-8 becomes \xHH. At
// most `max_bytes` of `s` are shown, then "... (N bytes)" says how long the whole is.
std::string printable(std::string_view s, size_t max_bytes = 64);

// Makes any text safe to store as a message: `printable` with a large bound, except that
// newlines and tabs are kept (server messages span lines).
std::string safe_message_text(std::string_view s, size_t max_bytes = 16384);

}  // namespace qsw
