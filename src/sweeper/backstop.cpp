// The ephemeral backstop (backstop.hpp).
#include "sweeper/backstop.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "base/last_error.hpp"
#include "base/reentry.hpp"
#include "sweeper/context.hpp"

namespace qsw {

int Backstop::set_provider(const queen_sweeper_backstop *p) {
    if (!p) {
        has_ = false;
        provider_ = {};
        fig_.phase_backstop = "off";
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
    fig_.phase_backstop = "on";
    return QUEEN_SWEEPER_OK;
}

void Backstop::init_handles() {
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
    // A repeating timer: the next pass is due a second after this one was, however long
    // the pass took and whatever the engine reported meanwhile.
    uv_timer_start(&timer_, [](uv_timer_t *t) { static_cast<Backstop *>(t->data)->run(); }, kPassEveryMs,
                   kPassEveryMs);
}

void Backstop::detach_waker() {
    if (!has_ || !provider_.attach_waker) return;
    CallbackScope in_callback;
    provider_.attach_waker(provider_.ctx, nullptr, nullptr);
}

void Backstop::close_handles() {
    uv_timer_stop(&timer_);
    auto *h = reinterpret_cast<uv_handle_t *>(&timer_);
    if (!uv_is_closing(h)) uv_close(h, nullptr);
}

void Backstop::on_hint(void *ctx, int64_t) {
    // Counted, not run: a pass at every instant the engine arms walked every queue hundreds
    // of times a second under a busy engine (2,955 passes in 6 s at 500 pushes and pops a
    // second), while the touch path already honours those instants for whoever touches the
    // queue. Lock-free, as the engine requires of its waker.
    static_cast<Backstop *>(ctx)->stats_.backstop_wakes_total.fetch_add(1, std::memory_order_relaxed);
}

// No connection, no slot, no lock outside the engine: it runs on its own timer so a
// slow or absent database never delays it.
void Backstop::run() {
    if (!has_ || stopping_.load()) return;
    const int64_t now = wall_now_ms();
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
    ++fig_.backstop_runs_total;
    if (rc != 0) {
        ++fig_.backstop_failures_total;
    } else {
        fig_.backstop_redelivered_total += static_cast<int64_t>(r.redelivered);
        fig_.backstop_exhausted_total += static_cast<int64_t>(r.exhausted);
        fig_.backstop_ttl_dropped_total += static_cast<int64_t>(r.ttl_dropped);
        fig_.backstop_queues_collected_total += static_cast<int64_t>(r.queues_collected);
        fig_.backstop_next_expiry_unix_ms = r.next_expiry_unix_ms;
    }
    if (rc != 0) log_.warn("ephemeral backstop sweep failed with status " + std::to_string(rc));
    if (publish_) publish_();
}

}  // namespace qsw
