// Logging through the host's callback, or to stderr when the host installed
// none. Never log a timer key, a KV key, a payload or a password: messages are
// built from counts, names of phases and SQLSTATEs only.
#pragma once
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/log_limit.hpp"
#include "base/reentry.hpp"
#include "queen_sweeper.h"

namespace qsw {

class Logger {
public:
    void set_callback(queen_sweeper_log_fn fn, void *user) {
        std::lock_guard<std::mutex> g(mu_);
        fn_ = fn;
        user_ = user;
    }
    bool has_callback() {
        std::lock_guard<std::mutex> g(mu_);
        return fn_ != nullptr;
    }
    void set_level(int level) { level_.store(level); }
    // Without a callback, warnings and errors go to stderr unless the host said
    // "log_stderr": false: a sweeper failing every cycle must never be silent.
    void set_stderr(bool on) { stderr_.store(on); }
    bool enabled(int level) const { return level <= level_.load(); }
    void log(int level, const std::string &msg) {
        if (!enabled(level)) return;
        std::lock_guard<std::mutex> g(mu_);
        if (fn_) {
            CallbackScope in_callback;
            fn_(user_, level, msg.c_str());
        }
        else if (level <= QUEEN_SWEEPER_LOG_WARN && stderr_.load()) {
            // One line per message (libpq's own messages carry newlines) and one write per
            // line, so lines of concurrent sweepers do not interleave.
            std::string line = msg;
            for (char &c : line)
                if (c == '\n' || c == '\r' || c == '\t') c = ' ';
            std::fprintf(stderr, "queen_sweeper %s: %s\n", level == QUEEN_SWEEPER_LOG_ERROR ? "error" : "warning",
                         line.c_str());
        }
    }
    void error(const std::string &m) { log(QUEEN_SWEEPER_LOG_ERROR, m); }
    void warn(const std::string &m) { log(QUEEN_SWEEPER_LOG_WARN, m); }
    void info(const std::string &m) { log(QUEEN_SWEEPER_LOG_INFO, m); }
    void debug(const std::string &m) { log(QUEEN_SWEEPER_LOG_DEBUG, m); }
    // A failure that may repeat: its first occurrence now, then at most one line per cause
    // per kLogRepeatIntervalMs carrying the count left out (base/log_limit.hpp). now_ms is
    // the caller's loop clock.
    void limited(int level, const std::string &cause, const std::string &m, int64_t now_ms) {
        LogLimiter::Line l;
        {
            std::lock_guard<std::mutex> g(limit_mu_);
            l = limiter_.occur(level, cause, m, now_ms);
        }
        if (l.emit) log(level, l.text);
    }
    // Says the counts of causes whose interval ended (called from the loop, once a cycle).
    void flush_limited(int64_t now_ms) {
        std::vector<std::pair<int, std::string>> lines;
        {
            std::lock_guard<std::mutex> g(limit_mu_);
            limiter_.flush(now_ms, [&](int level, std::string text) { lines.emplace_back(level, std::move(text)); });
        }
        for (auto &[level, text] : lines) log(level, text);
    }
    int64_t suppressed_total() {
        std::lock_guard<std::mutex> g(limit_mu_);
        return limiter_.suppressed_total();
    }

private:
    std::mutex mu_;
    queen_sweeper_log_fn fn_ = nullptr;
    void *user_ = nullptr;
    std::atomic<int> level_{QUEEN_SWEEPER_LOG_INFO};
    std::atomic<bool> stderr_{true};
    std::mutex limit_mu_;  // apart from mu_: a line is written outside it
    LogLimiter limiter_;
};

}  // namespace qsw
