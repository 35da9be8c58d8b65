// "A fault costs little and says so once": a failure that repeats (a fire on a full
// tablespace, a session setup the server refuses every time) is logged at its first
// occurrence, then at most once per cause per kLogRepeatIntervalMs, that line saying how
// many were left out ("... (repeated N times in the last 10s)"). Ten seconds: an operator
// tailing the log still sees within seconds that the fault goes on and how often, and a
// fault failing 30 times a second costs six lines a minute instead of 1,800.
//
// A cause is a stable key built from the phase, the SQLSTATE and the message with every
// digit removed (counts, durations, OIDs in file names), so "fire of 12 timer(s)" and "fire
// of 13 timer(s)" are one cause. Messages already never carry a timer key, a KV key, a
// payload or a password (base/log.hpp); neither does a cause, built from them.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace qsw {

constexpr int64_t kLogRepeatIntervalMs = 10000;

// What the limiter remembers of one cause. window_start_ms < 0: never seen.
struct LogGate {
    int64_t window_start_ms = -1;  // when the last line of this cause was written
    int64_t suppressed = 0;        // occurrences left out since then
};

struct LogGateStep {
    LogGate next;
    bool emit = false;      // write this occurrence now
    int64_t repeated = 0;   // occurrences left out before it, to say on its line
    int64_t over_ms = 0;    // over how long they happened
};

// The pure decision for one occurrence at now_ms (a monotonic clock the caller reads).
LogGateStep log_gate_step(LogGate g, int64_t now_ms, int64_t interval_ms = kLogRepeatIntervalMs);
// The pure decision of a periodic flush: a cause whose interval has ended with occurrences
// left out gets its summary line now, so the count is said even if the fault then stops.
LogGateStep log_gate_flush(LogGate g, int64_t now_ms, int64_t interval_ms = kLogRepeatIntervalMs);

// phase + SQLSTATE + the message without digits.
std::string log_cause(std::string_view phase, std::string_view sqlstate, std::string_view message);
// " (repeated N times in the last Ns)", or "" when nothing was left out.
std::string repeated_suffix(int64_t repeated, int64_t over_ms);

// The per-cause state (not thread-safe: the Logger holds it under its mutex).
class LogLimiter {
public:
    struct Line {
        bool emit = false;
        std::string text;
    };
    Line occur(int level, const std::string &cause, const std::string &msg, int64_t now_ms);
    // Summary lines of causes whose interval ended with something left out (with their level).
    template <class Fn>
    void flush(int64_t now_ms, Fn &&write) {
        for (auto it = causes_.begin(); it != causes_.end();) {
            const LogGateStep s = log_gate_flush(it->second.gate, now_ms);
            it->second.gate = s.next;
            if (s.emit) write(it->second.level, it->second.last_msg + repeated_suffix(s.repeated, s.over_ms));
            // A cause quiet for a whole interval is forgotten: the map stays as small as the
            // set of faults happening now.
            if (!s.emit && it->second.gate.suppressed == 0 && now_ms - it->second.gate.window_start_ms >= kLogRepeatIntervalMs)
                it = causes_.erase(it);
            else
                ++it;
        }
    }
    int64_t suppressed_total() const { return suppressed_total_; }

private:
    struct Cause {
        LogGate gate;
        std::string last_msg;
        int level = 0;
    };
    std::map<std::string, Cause> causes_;
    int64_t suppressed_total_ = 0;
};

}  // namespace qsw
