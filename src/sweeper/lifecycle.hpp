// The sweeper's life as host threads see it: its phase (created, running, stopped,
// disabled) under the lock that serialises start, stop, the setters and wait_ready; the
// loop thread; the stop's two flags, which every phase reads (asked: finish what is in
// flight; hard, past the stop's timeout: abandon it); and the loop's word that its run is
// over, which the stop waits for.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>

namespace qsw {

class Lifecycle {
public:
    enum class Phase { created, running, stopped, disabled };

    // Host threads: an entry point that reads or moves the phase holds this for its whole call.
    [[nodiscard]] std::unique_lock<std::mutex> hold() { return std::unique_lock<std::mutex>(mu_); }
    Phase phase() const { return phase_; }   // under hold()
    void set_phase(Phase p) { phase_ = p; }  // under hold()

    // The loop thread, started once (a failure to create it throws) and joined by the stop.
    template <class F> void launch(F main) { thread_ = std::thread(std::move(main)); }
    void join() {
        if (thread_.joinable()) thread_.join();
    }

    // The stop: asked, then hard once its time ran out.
    void ask_stop() { stopping_.store(true); }
    void abandon() { hard_stop_.store(true); }
    bool stopping() const { return stopping_.load(); }
    bool hard_stop() const { return hard_stop_.load(); }
    // For the phases and parts that read them (LoopContext, Backstop, Readiness, WakeBell).
    const std::atomic<bool> &stopping_flag() const { return stopping_; }
    const std::atomic<bool> &hard_stop_flag() const { return hard_stop_; }

    // The loop thread: the run is over (graceful or not). The stop waits for it; false when
    // timeout_ms ran out first.
    void mark_done() {
        {
            std::lock_guard<std::mutex> g(done_mu_);
            graceful_done_ = true;
        }
        done_cv_.notify_all();
    }
    bool wait_done(uint32_t timeout_ms) {
        std::unique_lock<std::mutex> lk(done_mu_);
        return done_cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [this] { return graceful_done_; });
    }

private:
    std::mutex mu_;  // serialises start/stop
    Phase phase_ = Phase::created;
    std::thread thread_;
    std::atomic<bool> stopping_{false};
    std::atomic<bool> hard_stop_{false};
    std::mutex done_mu_;
    std::condition_variable done_cv_;
    bool graceful_done_ = false;  // under done_mu_
};

}  // namespace qsw
