#include "base/log_limit.hpp"

#include <cctype>

namespace qsw {

LogGateStep log_gate_step(LogGate g, int64_t now_ms, int64_t interval_ms) {
    LogGateStep s;
    // A clock that went backwards (it should not) opens a new interval rather than
    // silencing the cause until the clock catches up.
    if (g.window_start_ms < 0 || now_ms - g.window_start_ms >= interval_ms || now_ms < g.window_start_ms) {
        s.emit = true;
        s.repeated = g.suppressed;
        s.over_ms = g.window_start_ms < 0 || now_ms < g.window_start_ms ? 0 : now_ms - g.window_start_ms;
        s.next = LogGate{now_ms, 0};
        return s;
    }
    s.next = LogGate{g.window_start_ms, g.suppressed + 1};
    return s;
}

LogGateStep log_gate_flush(LogGate g, int64_t now_ms, int64_t interval_ms) {
    LogGateStep s;
    s.next = g;
    if (g.window_start_ms < 0 || g.suppressed == 0) return s;
    if (now_ms - g.window_start_ms < interval_ms && now_ms >= g.window_start_ms) return s;
    s.emit = true;
    s.repeated = g.suppressed;
    s.over_ms = now_ms < g.window_start_ms ? 0 : now_ms - g.window_start_ms;
    s.next = LogGate{now_ms, 0};
    return s;
}

std::string log_cause(std::string_view phase, std::string_view sqlstate, std::string_view message) {
    std::string k;
    k.reserve(phase.size() + sqlstate.size() + message.size() + 2);
    k.append(phase);
    k += '|';
    k.append(sqlstate);
    k += '|';
    for (char c : message)
        if (!std::isdigit(static_cast<unsigned char>(c))) k += c;
    return k;
}

std::string repeated_suffix(int64_t repeated, int64_t over_ms) {
    if (repeated <= 0) return "";
    const int64_t secs = (over_ms + 999) / 1000;
    return " (repeated " + std::to_string(repeated) + (repeated == 1 ? " time" : " times") + " in the last " +
           std::to_string(secs) + "s)";
}

LogLimiter::Line LogLimiter::occur(int level, const std::string &cause, const std::string &msg, int64_t now_ms) {
    Cause &c = causes_[cause];
    c.level = level;
    c.last_msg = msg;
    const LogGateStep s = log_gate_step(c.gate, now_ms);
    c.gate = s.next;
    Line l;
    if (!s.emit) {
        ++suppressed_total_;
        return l;
    }
    l.emit = true;
    l.text = msg + repeated_suffix(s.repeated, s.over_ms);
    return l;
}

}  // namespace qsw
