// The ephemeral backstop (backstop.hpp).
#include "sweeper/backstop.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "base/last_error.hpp"
#include "base/reentry.hpp"
#include "sweeper/phase.hpp"

namespace qsw {

int Backstop::set_provider(const queen_sweeper_backstop *p) {
    if (!p) {
        has_ = false;
        provider_ = {};
        return QUEEN_SWEEPER_OK;
    }
    const size_t need = offsetof(queen_sweeper_backstop, attach_waker) + sizeof(p->attach_waker);
    if (p->struct_size < offsetof(queen_sweeper_backstop, sweep) + sizeof(p->sweep)) {
        set_last_error("queen_sweeper_set_backstop: provider->struct_size " + std::to_string(p->struct_size) +
                       " is too small (expected " + std::to_string(sizeof(queen_sweeper_backstop)) + ")");
        return QUEEN_SWEEPER_EINVAL;
    }
    if (!p->sweep) {
        set_last_error("queen_sweeper_set_backstop: provider->sweep is NULL");
        return QUEEN_SWEEPER_EINVAL;
    }
    provider_ = {};
    std::memcpy(&provider_, p, std::min(p->struct_size, sizeof provider_));
    if (p->struct_size < need) provider_.attach_waker = nullptr;
    provider_.struct_size = sizeof provider_;
    has_ = true;
    return QUEEN_SWEEPER_OK;
}

void Backstop::init_handles() {
    uv_async_init(&loop_, &async_, [](uv_async_t *a) {
        auto *b = static_cast<Backstop *>(a->data);
        b->hint_.store(INT64_MAX);  // re-armed: the next earlier instant rings again
        b->schedule();
    });
    async_.data = this;
    uv_timer_init(&loop_, &timer_);
    timer_.data = this;
}

void Backstop::attach_waker() {
    if (!has_ || !provider_.attach_waker) return;
    CallbackScope in_callback;
    provider_.attach_waker(provider_.ctx, &Backstop::on_hint, this);
}

void Backstop::begin() {
    if (!has_) return;
    last_run_unix_ms_ = wall_now_ms();
    uv_timer_start(&timer_, [](uv_timer_t *t) { static_cast<Backstop *>(t->data)->run(); }, 1000, 0);
}

void Backstop::detach_waker() {
    if (!has_ || !provider_.attach_waker) return;
    CallbackScope in_callback;
    provider_.attach_waker(provider_.ctx, nullptr, nullptr);
}

void Backstop::close_handles() {
    uv_timer_stop(&timer_);
    for (auto *h : {reinterpret_cast<uv_handle_t *>(&async_), reinterpret_cast<uv_handle_t *>(&timer_)})
        if (!uv_is_closing(h)) uv_close(h, nullptr);
}

void Backstop::on_hint(void *ctx, int64_t at) {
    auto *b = static_cast<Backstop *>(ctx);
    b->stats_.backstop_wakes_total.fetch_add(1, std::memory_order_relaxed);
    // Record the instant before ringing: the doorbell coalesces, so the loop reads
    // the earliest owed instant from here rather than from the ring itself.
    int64_t due = b->due_.load();
    while (at < due && !b->due_.compare_exchange_weak(due, at)) {
    }
    int64_t cur = b->hint_.load();
    while (at < cur) {
        if (b->hint_.compare_exchange_weak(cur, at)) {
            b->ring_(&b->async_);
            return;
        }
    }
}

// No connection, no slot, no lock outside the engine: it runs on its own timer so a
// slow or absent database never delays it.
void Backstop::run() {
    if (!has_ || stopping_.load()) return;
    const int64_t now = wall_now_ms();
    last_run_unix_ms_ = now;
    // Everything owed up to now is this pass's; an instant rung while it runs stays owed.
    due_.store(INT64_MAX);
    queen_sweeper_backstop_result r{};
    r.struct_size = sizeof r;
    r.next_expiry_unix_ms = -1;
    int rc = QUEEN_SWEEPER_EINTERNAL;
    try {
        CallbackScope in_callback;
        rc = provider_.sweep(provider_.ctx, now, &r);
    } catch (...) {
        rc = QUEEN_SWEEPER_EINTERNAL;
    }
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        auto &f = stats_.f;
        ++f.backstop_runs_total;
        if (rc != 0) {
            ++f.backstop_failures_total;
        } else {
            f.backstop_redelivered_total += static_cast<int64_t>(r.redelivered);
            f.backstop_exhausted_total += static_cast<int64_t>(r.exhausted);
            f.backstop_ttl_dropped_total += static_cast<int64_t>(r.ttl_dropped);
            f.backstop_queues_collected_total += static_cast<int64_t>(r.queues_collected);
            f.backstop_next_expiry_unix_ms = r.next_expiry_unix_ms;
        }
    }
    if (rc != 0) log_.warn("ephemeral backstop sweep failed with status " + std::to_string(rc));
    // The engine announces an instant only once per pass (it rings when a lease or
    // ttl is armed earlier than every one announced since the last sweep), so the
    // nearest instant this pass saw is owed too. One that is not in the future was
    // left armed by the engine itself: trusting it would spin, the second covers it.
    if (rc == 0 && r.next_expiry_unix_ms > now) {
        int64_t due = due_.load();
        while (r.next_expiry_unix_ms < due && !due_.compare_exchange_weak(due, r.next_expiry_unix_ms)) {
        }
    }
    schedule();
}

void Backstop::schedule() {
    if (!has_ || stopping_.load()) return;
    // A pass at the next lease or ttl instant owed (rung by the engine, or seen by
    // the last pass), to the millisecond, and in any case one second after the last
    // pass: the second is the floor under a lost hint, not a cap on a hint. Every
    // call re-arms the timer, so a nearer instant always moves it closer.
    uv_update_time(&loop_);  // the timer counts from the loop's clock: make it now
    const int64_t now = wall_now_ms();
    const int64_t target = std::min(last_run_unix_ms_ + 1000, due_.load());
    uv_timer_start(&timer_, [](uv_timer_t *t) { static_cast<Backstop *>(t->data)->run(); },
                   static_cast<uint64_t>(std::max<int64_t>(target - now, 0)), 0);
}

}  // namespace qsw
