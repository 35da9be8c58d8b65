#include "base/last_error.hpp"

#include <algorithm>
#include <cstdio>

namespace qsw {
namespace {
thread_local std::string t_last_error;

// Length of the well-formed UTF-8 sequence that starts at s[i], or 0 when there is none
// (the table of well-formed byte sequences in the Unicode standard, chapter 3).
size_t utf8_sequence_at(std::string_view s, size_t i) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(i);
    if (c < 0x80) return 1;
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;  // no surrogates
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;  // nothing past U+10FFFF
    else return 0;
    if (i + len > s.size()) return 0;
    if (b(i + 1) < lo || b(i + 1) > hi) return 0;
    for (size_t k = 2; k < len; ++k)
        if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
    return len;
}

std::string render(std::string_view s, size_t max_bytes, bool keep_layout, bool escape_quotes) {
    std::string out;
    out.reserve(std::min(s.size(), max_bytes) + 16);
    size_t i = 0;
    char hex[8];
    while (i < s.size() && i < max_bytes) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        const size_t n = utf8_sequence_at(s, i);
        if (n == 0) {
            std::snprintf(hex, sizeof hex, "\\x%02X", c);
            out += hex;
            ++i;
            continue;
        }
        if (n > 1) {
            // A sequence cut by the bound is dropped whole, never split.
            if (i + n > max_bytes) break;
            out.append(s.substr(i, n));
            i += n;
            continue;
        }
        if (keep_layout && (c == '\n' || c == '\t')) out += static_cast<char>(c);
        else if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\r') out += "\\r";
        else if (c < 0x20 || c == 0x7F) {
            std::snprintf(hex, sizeof hex, "\\u%04X", c);
            out += hex;
        } else if (escape_quotes && (c == '\\' || c == '\'' || c == '"')) {
            out += '\\';
            out += static_cast<char>(c);
        } else
            out += static_cast<char>(c);
        ++i;
    }
    if (i < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
    return out;
}

}  // namespace

void set_last_error(std::string message) {
    if (utf8_invalid_at(message) == std::string_view::npos && message.size() <= 16384 &&
        message.find('\0') == std::string::npos)
        t_last_error = std::move(message);
    else
        t_last_error = safe_message_text(message);
}
void clear_last_error() { t_last_error.clear(); }
const char *last_error_cstr() { return t_last_error.c_str(); }

size_t utf8_invalid_at(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const size_t n = utf8_sequence_at(s, i);
        if (n == 0) return i;
        i += n;
    }
    return std::string_view::npos;
}

std::string printable(std::string_view s, size_t max_bytes) { return render(s, max_bytes, false, true); }

std::string safe_message_text(std::string_view s, size_t max_bytes) { return render(s, max_bytes, true, false); }

}  // namespace qsw
