// What the integration tests share besides the database (db.hpp): a sweeper's stats and
// metrics read through the C ABI, and a bounded wait for a condition.
#pragma once
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>

#include "queen_sweeper.h"

namespace testhelp {

// The figures move between two calls, so the buffer grows until the text fits.
inline std::string read_grown(queen_sweeper *sw, int64_t (*read)(queen_sweeper *, char *, size_t), size_t size) {
    std::string s(size, '\0');
    for (;;) {
        const int64_t n = read(sw, s.data(), s.size());
        if (n < 0) throw std::runtime_error(queen_sweeper_last_error());
        if (static_cast<size_t>(n) < s.size()) {
            s.resize(static_cast<size_t>(n));
            return s;
        }
        s.assign(static_cast<size_t>(n) * 2, '\0');
    }
}

// queen_sweeper_stats, parsed.
inline nlohmann::json stats_of(queen_sweeper *sw) {
    return nlohmann::json::parse(read_grown(sw, queen_sweeper_stats, 4096));
}

// queen_sweeper_metrics: the Prometheus text.
inline std::string metrics_of(queen_sweeper *sw) { return read_grown(sw, queen_sweeper_metrics, 1 << 16); }

// Polls f every poll_ms until it holds or ms have passed; then f once more.
template <class F> bool wait_for(F f, int ms, int poll_ms = 20) {
    using namespace std::chrono;
    auto end = steady_clock::now() + milliseconds(ms);
    while (steady_clock::now() < end) {
        if (f()) return true;
        std::this_thread::sleep_for(milliseconds(poll_ms));
    }
    return f();
}

}  // namespace testhelp
