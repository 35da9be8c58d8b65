// The wake and the sleep between cycles (wake.hpp).
#include "sweeper/wake.hpp"

#include <algorithm>
#include <mutex>
#include <thread>
#include <utility>

#include "sweeper/context.hpp"
#include "sweeper/sleep.hpp"

namespace qsw {

void WakeBell::init_handles(std::function<void()> on_stop) {
    on_stop_ = std::move(on_stop);
    uv_async_init(&loop_, &wake_async_, [](uv_async_t *a) { static_cast<WakeBell *>(a->data)->on_wake_signal(); });
    uv_async_init(&loop_, &stop_async_, [](uv_async_t *a) { static_cast<WakeBell *>(a->data)->on_stop_(); });
    wake_async_.data = stop_async_.data = this;
    uv_timer_init(&loop_, &sleep_timer_);
    sleep_timer_.data = this;
}

void WakeBell::wake(int64_t at) noexcept {
    stats_.wakes_total.fetch_add(1, std::memory_order_relaxed);
    // Every int64 is a valid argument. An instant before the epoch means "due now"; the
    // clamp keeps `hint - now` in the sleep arithmetic from overflowing (INT64_MIN once
    // parked the loop for ~292 million years).
    if (at < 0) at = 0;
    int64_t cur = hint_.load(std::memory_order_acquire);
    // Only an instant earlier than the one already promised rings the loop.
    while (at < cur) {
        if (hint_.compare_exchange_weak(cur, at, std::memory_order_acq_rel)) {
            if (ring(&wake_async_)) stats_.wake_signals_total.fetch_add(1, std::memory_order_relaxed);
            return;
        }
    }
}

bool WakeBell::ring(uv_async_t *doorbell) noexcept {
    // The doorbell may only be rung while the loop accepts it: teardown flips
    // accepting_ and then waits until no ringer is between check and send.
    ringers_in_flight_.fetch_add(1);
    const bool rung = accepting_.load() && uv_async_send(doorbell) == 0;
    ringers_in_flight_.fetch_sub(1);
    return rung;
}

bool WakeBell::rearm() {
    hint_.store(INT64_MAX);
    return std::exchange(woken_, false);
}

void WakeBell::start_timer(int64_t in_ms) {
    uv_timer_start(&sleep_timer_, [](uv_timer_t *t) {
        auto *b = static_cast<WakeBell *>(t->data);
        auto h = std::exchange(b->sleeper_, nullptr);
        if (h) h.resume();
    }, static_cast<uint64_t>(in_ms), 0);
}

void WakeBell::on_wake_signal() {
    if (!sleeper_) return;  // mid-cycle: the sleep that follows reads the hint itself
    const int64_t hint = hint_.load();
    if (hint >= deadline_unix_ms_) return;  // the loop already looks by then
    // Bounded by the sleep already promised (monotonic) and by the ceiling: a wall clock
    // stepped back makes the hint look far away, and must not make this sleep longer.
    const uint64_t mono = uv_now(&loop_);
    const int64_t left = deadline_mono_ > mono ? static_cast<int64_t>(deadline_mono_ - mono) : 0;
    const int64_t in = wake_rearm_ms(hint, wall_now_ms(), left, cfg_.sweeper_max_sleep_ms);
    woken_ = true;
    deadline_unix_ms_ = hint;
    deadline_mono_ = mono + static_cast<uint64_t>(in);
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        ++stats_.f.wake_cut_sleeps_total;
    }
    start_timer(in);
}

void WakeBell::cut_short() {
    if (!sleeper_ || stopping_.load()) return;
    const int64_t now = wall_now_ms();
    int64_t hint = hint_.load();
    while (now < hint && !hint_.compare_exchange_weak(hint, now)) {
    }
    on_wake_signal();
}

void WakeBell::end_sleep() {
    if (sleeper_) {
        uv_timer_stop(&sleep_timer_);
        auto h = std::exchange(sleeper_, nullptr);
        h.resume();
    }
}

namespace {
struct SleepAwaiter {
    std::coroutine_handle<> *slot;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) noexcept { *slot = h; }
    void await_resume() const noexcept {}
};
}  // namespace

Task<void> WakeBell::sleep_for(int64_t ms) {
    if (stopping_.load()) co_return;
    // A wake that arrived while the cycle ran already lowered the hint.
    int64_t deadline = wall_now_ms() + ms;
    const int64_t hint = hint_.load();
    if (hint < deadline) {
        woken_ = true;
        deadline = std::max(hint, wall_now_ms());
    }
    deadline_unix_ms_ = deadline;
    const int64_t in = std::clamp<int64_t>(sat_sub(deadline, wall_now_ms()), 0, std::max<int64_t>(ms, 0));
    deadline_mono_ = uv_now(&loop_) + static_cast<uint64_t>(in);
    start_timer(in);
    co_await SleepAwaiter{&sleeper_};
    deadline_unix_ms_ = 0;
}

void WakeBell::close_handles() {
    // No ringer may be inside uv_async_send when the handle closes.
    accepting_.store(false);
    while (ringers_in_flight_.load() != 0) std::this_thread::yield();
    auto close = [](auto *h) {
        if (!uv_is_closing(reinterpret_cast<uv_handle_t *>(h))) uv_close(reinterpret_cast<uv_handle_t *>(h), nullptr);
    };
    uv_timer_stop(&sleep_timer_);
    close(&wake_async_);
    close(&stop_async_);
    close(&sleep_timer_);
}

}  // namespace qsw
