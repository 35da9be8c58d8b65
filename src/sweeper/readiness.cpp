// Readiness and health (readiness.hpp).
#include "sweeper/readiness.hpp"

#include <chrono>

#include "base/last_error.hpp"
#include "queen_sweeper.h"

namespace qsw {

int Readiness::wait(uint32_t timeout_ms) {
    std::unique_lock<std::mutex> lk(mu_);
    const bool done =
        cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [this] { return ready_ || stopping_.load(); });
    if (done && ready_) return QUEEN_SWEEPER_OK;
    lk.unlock();
    if (done) {
        set_last_error("queen_sweeper_wait_ready: the sweeper is stopping");
        return QUEEN_SWEEPER_ESTATE;
    }
    std::string reason;
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        reason = stats_.f.ready_reason;
    }
    set_last_error("queen_sweeper_wait_ready: not ready after " + std::to_string(timeout_ms) + " ms: " + reason);
    return QUEEN_SWEEPER_ETIMEDOUT;
}

void Readiness::wake_waiters() {
    {
        // Under the mutex, so a waiter between its check and its wait cannot miss it.
        std::lock_guard<std::mutex> r(mu_);
    }
    cv_.notify_all();
}

void Readiness::set_schema_outcome(bool ok, const std::string &state, const std::string &reason) {
    schema_ok_ = ok;
    schema_reason_ = reason;
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        stats_.f.schema_state = state;
    }
    update();
}

void Readiness::note_probe(bool ok) {
    if (!ok || probe_done_) return;
    probe_done_ = true;
    update();
}

void Readiness::update() {
    // Ready is latched: it says start-up is complete. Whether the sweeper works now is
    // `healthy`, which turns with every failing cycle.
    bool now_ready = false;
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        auto &f = stats_.f;
        if (f.ready) return;
        if (!schema_ok_) f.ready_reason = schema_reason_;
        else if (!probe_done_)
            f.ready_reason = "no probe has completed yet" + (f.last_error.empty() ? "" : ": last error: " + f.last_error);
        else {
            f.ready = true;
            f.ready_reason.clear();
            now_ready = true;
        }
    }
    if (now_ready) {
        {
            std::lock_guard<std::mutex> r(mu_);
            ready_ = true;
        }
        cv_.notify_all();
        log_.info("sweeper ready");
    }
}

void Readiness::begin_cycle() {
    std::lock_guard<std::mutex> g(stats_.mu);
    errors_at_cycle_start_ = stats_.f.cycle_errors_total;
}

void Readiness::end_cycle() {
    std::lock_guard<std::mutex> g(stats_.mu);
    auto &f = stats_.f;
    if (f.cycle_errors_total > errors_at_cycle_start_) {
        ++f.failed_cycles_total;
        ++f.consecutive_failed_cycles;
    } else {
        f.consecutive_failed_cycles = 0;
    }
    errors_at_cycle_start_ = f.cycle_errors_total;
}

}  // namespace qsw
