#include "pg/pool.hpp"

#include "base/log_limit.hpp"

#include <algorithm>
#include <random>

namespace qsw {

const char *lane_name(Lane l) {
    switch (l) {
    case Lane::push: return "push";
    case Lane::pop: return "pop";
    case Lane::ack: return "ack";
    case Lane::maint: return "maint";
    }
    return "?";
}

Pool::Pool(uv_loop_t *loop, PoolOptions opts, Logger &log) : loop_(loop), opts_(std::move(opts)), log_(log) {
    idle_ = new uv_idle_t;
    uv_idle_init(loop_, idle_);
    idle_->data = this;
    canceller_ = std::make_unique<Canceller>(loop_);
}

Pool::~Pool() = default;

void Pool::start() {
    for (int i = 0; i < opts_.pool_size; ++i) {
        PgConn::Hooks hooks;
        hooks.on_ready = [this](PgConn &c) { on_ready(c); };
        hooks.on_broken = [this](PgConn &c, const std::string &why, bool connecting) { on_broken(c, why, connecting); };
        conns_.push_back(std::make_unique<PgConn>(loop_, i, opts_.conninfo, opts_.connect_timeout_ms,
                                                  opts_.stmt_timeout_ms, std::move(hooks), canceller_.get()));
    }
    for (auto &c : conns_) c->connect();
}

void Pool::post(std::function<void()> fn) {
    posted_.push_back(std::move(fn));
    if (idle_ && !uv_is_active(reinterpret_cast<uv_handle_t *>(idle_))) {
        uv_idle_start(idle_, [](uv_idle_t *h) { static_cast<Pool *>(h->data)->on_post(nullptr); });
    }
}

void Pool::on_post(uv_async_t *) {
    // Run only what was posted before this turn; callbacks may post more.
    std::deque<std::function<void()>> batch;
    batch.swap(posted_);
    if (posted_.empty() && idle_) uv_idle_stop(idle_);
    for (auto &fn : batch) fn();
    if (!posted_.empty() && idle_ && !uv_is_active(reinterpret_cast<uv_handle_t *>(idle_)))
        uv_idle_start(idle_, [](uv_idle_t *h) { static_cast<Pool *>(h->data)->on_post(nullptr); });
}

static PgResult failure(const std::string &msg) {
    PgResult r;
    r.ok = false;
    r.message = msg;
    r.origin = Origin::refused;  // never sent
    return r;
}

std::atomic<void (*)(const std::string &)> g_test_call_observer{nullptr};

void Pool::call(Lane lane, Query q, QueryCallback cb) {
    if (auto *seam = g_test_call_observer.load(std::memory_order_relaxed)) seam(q.sql);
    ++calls_total_;
    ++lane_calls_[static_cast<int>(lane)];
    if (shut_) {
        ++calls_failed_total_;
        post([cb = std::move(cb)] { cb(failure("sweeper is stopping")); });
        return;
    }
    if (opts_.lane_slots[static_cast<int>(lane)] <= 0) {
        ++calls_failed_total_;
        post([cb = std::move(cb), lane] {
            cb(failure(std::string("lane ") + lane_name(lane) + " has no admission slots"));
        });
        return;
    }
    admit(Waiter{lane, std::move(q), std::move(cb), uv_now(loop_)});
}

CallbackAwaiter<PgResult> Pool::query(Lane lane, Query q) {
    return CallbackAwaiter<PgResult>{
        [this, lane, q = std::move(q)](std::function<void(PgResult)> done) mutable {
            call(lane, std::move(q), std::move(done));
        },
        {}, {}, false};
}

void Pool::admit(Waiter w) {
    const int l = static_cast<int>(w.lane);
    if (in_use_[l] < opts_.lane_slots[l]) {
        ++in_use_[l];
        with_slot(std::move(w));
    } else {
        slot_waiters_[l].push_back(std::move(w));
    }
}

void Pool::with_slot(Waiter w) {
    max_slot_wait_ms_ = std::max<int64_t>(max_slot_wait_ms_, static_cast<int64_t>(uv_now(loop_) - w.enqueued_ms));
    // Only now, holding the slot, may the call ask for a connection.
    conn_waiters_.push_back(std::move(w));
    dispatch();
}

void Pool::release_slot(Lane lane) {
    const int l = static_cast<int>(lane);
    --in_use_[l];
    if (!slot_waiters_[l].empty() && !shut_) {
        Waiter w = std::move(slot_waiters_[l].front());
        slot_waiters_[l].pop_front();
        ++in_use_[l];
        with_slot(std::move(w));
    }
}

void Pool::dispatch() {
    while (!conn_waiters_.empty()) {
        PgConn *idle = nullptr;
        bool usable = false;
        for (auto &c : conns_) {
            auto s = c->state();
            if (s == PgConn::State::idle) {
                idle = c.get();
                break;
            }
            if (s == PgConn::State::busy || s == PgConn::State::setup) usable = true;
        }
        if (!idle) {
            // No connection can serve and the last attempt failed: the database is
            // down. Fail fast rather than park the cycle; the caller's backoff
            // paces the retries and the backstop keeps running meanwhile.
            if (!usable && consecutive_failures_ > 0) {
                fail_connection_waiters("database unavailable: " + last_error_);
            }
            return;
        }
        Waiter w = std::move(conn_waiters_.front());
        conn_waiters_.pop_front();
        const Lane lane = w.lane;
        auto cb = std::move(w.cb);
        std::vector<std::string> answers = w.q.answer_sqlstates;
        idle->run(std::move(w.q), [this, lane, cb = std::move(cb), answers = std::move(answers)](PgResult r) mutable {
            // The connection is back (idle) or gone (down) by now: offer it first,
            // then give back the slot, then tell the caller.
            const bool answer = !r.sqlstate.empty() &&
                                std::find(answers.begin(), answers.end(), r.sqlstate) != answers.end();
            if (!r.ok && !answer) ++calls_failed_total_;
            if (!shut_) dispatch();
            release_slot(lane);
            post([cb = std::move(cb), r = std::move(r)]() mutable { cb(std::move(r)); });
        });
    }
}

void Pool::fail_connection_waiters(const std::string &why) {
    std::deque<Waiter> ws;
    ws.swap(conn_waiters_);
    for (auto &w : ws) {
        ++calls_failed_total_;
        release_slot(w.lane);
        post([cb = std::move(w.cb), why] { cb(failure(why)); });
    }
    // release_slot may have admitted new waiters into conn_waiters_; they fail too.
    if (!conn_waiters_.empty()) fail_connection_waiters(why);
}

void Pool::on_ready(PgConn &ready) {
    ++connects_total_;
    consecutive_failures_ = 0;
    down_since_ms_ = 0;
    if (!db_up_) {
        db_up_ = true;
        // Sessions refused in a row: one passing setup proves nothing (the next call meets
        // the same server), so the others keep their place behind the pool's fault gate.
        const bool refusing = fault_gate_.faults > 0 && fault_gate_.last_fault_ms >= 0 &&
                              static_cast<int64_t>(uv_now(loop_)) - fault_gate_.last_fault_ms < kSessionFaultQuietMs;
        if (refusing) log_.limited(QUEEN_SWEEPER_LOG_INFO, "pool|up-between-refusals", "database connection up",
                                   static_cast<int64_t>(uv_now(loop_)));
        else if (down_logged_ || !ever_up_) log_.info("database connection up");
        const bool was_down = ever_up_;
        ever_up_ = true;
        down_logged_ = false;
        // The others are waiting out a backoff: the database answers, so try them now.
        if (!refusing)
            for (auto &o : conns_)
                if (o.get() != &ready && o->state() == PgConn::State::down) o->connect_after(0);
        if (was_down && opts_.on_up) opts_.on_up();
    }
    dispatch();
}

int64_t session_fault_spacing_ms(int faults, double jitter) {
    const int shift = std::clamp(faults - 1, 0, 7);
    const int64_t base = std::min<int64_t>(kSessionFaultCapMs, int64_t(100) << shift);
    if (!(jitter >= 0.0 && jitter <= 1.0)) jitter = 0.0;
    return base / 2 + static_cast<int64_t>(jitter * static_cast<double>(base / 2));
}

SessionFaultStep session_fault_step(SessionFaultGate g, int64_t now_ms, double jitter) {
    const bool in_row = g.last_fault_ms >= 0 && now_ms >= g.last_fault_ms && now_ms - g.last_fault_ms < kSessionFaultQuietMs;
    const int faults = in_row ? std::min(g.faults, 1000) + 1 : 1;
    // Behind every session already waiting for its turn, never more than a few caps away
    // (a gate left far ahead by a clock that jumped must not park the pool).
    int64_t after = in_row ? std::max(now_ms, g.next_open_ms) : now_ms;
    after = std::min(after, now_ms + 8 * kSessionFaultCapMs);
    const int64_t open = after + session_fault_spacing_ms(faults, jitter);
    SessionFaultStep s;
    s.next = SessionFaultGate{faults, now_ms, open};
    s.delay_ms = open - now_ms;
    return s;
}

int64_t reconnect_delay_ms(int failures, int64_t outage_ms, double jitter) {
    const int shift = std::clamp(failures, 0, 7);
    const int64_t cap = outage_ms < 30000 ? 250 : 5000;
    const int64_t base = std::min<int64_t>(cap, int64_t(50) << shift);
    if (!(jitter >= 0.0 && jitter <= 1.0)) jitter = 0.0;
    return std::max<int64_t>(25, base / 2 + static_cast<int64_t>(jitter * static_cast<double>(base / 2)));
}

void Pool::on_broken(PgConn &c, const std::string &why, bool while_connecting) {
    if (shut_) return;
    ++disconnects_total_;
    last_error_ = why;
    if (why.find("deadline") != std::string::npos) ++deadline_cancels_total_;
    // A connection we closed (a deadline) or the server closed (pg_terminate_backend)
    // is replaced at once; only a failed attempt to connect says the database is down.
    if (while_connecting) ++consecutive_failures_;
    bool usable = false;
    for (auto &o : conns_) {
        auto s = o->state();
        if (s == PgConn::State::idle || s == PgConn::State::busy || s == PgConn::State::setup) usable = true;
    }
    const int64_t now_ms = static_cast<int64_t>(uv_now(loop_));
    if (c.refused()) {
        ++setup_failures_total_;
        log_.limited(QUEEN_SWEEPER_LOG_WARN, log_cause("session", "", why),
                     "the server refused a session (" + why + "); new sessions are opened one at a time, up to " +
                         std::to_string(kSessionFaultCapMs / 1000) + " s apart",
                     now_ms);
    }
    if (!usable) {
        db_up_ = false;
        if (consecutive_failures_ > 0) {
            if (!down_logged_ && !c.refused()) {
                log_.warn("database unavailable (" + why + "); reconnecting with backoff");
                down_logged_ = true;
            }
            fail_connection_waiters("database unavailable: " + why);
        }
    }
    static thread_local std::minstd_rand rng{std::random_device{}()};
    std::uniform_real_distribution<double> jitter(0.0, 1.0);
    if (c.refused()) {
        // The server will answer the next session the same way: paced per pool.
        const SessionFaultStep st = session_fault_step(fault_gate_, now_ms, jitter(rng));
        fault_gate_ = st.next;
        last_reconnect_delay_ms_ = st.delay_ms;
        c.connect_after(st.delay_ms);
        return;
    }
    if (!while_connecting) {
        last_reconnect_delay_ms_ = 0;
        c.connect_after(0);
        return;
    }
    // Exponential backoff with jitter while the server keeps refusing (reconnect_delay_ms).
    const uint64_t now = uv_now(loop_);
    if (down_since_ms_ == 0) down_since_ms_ = now;
    last_reconnect_delay_ms_ =
        reconnect_delay_ms(consecutive_failures_, static_cast<int64_t>(now - down_since_ms_), jitter(rng));
    c.connect_after(last_reconnect_delay_ms_);
}

void Pool::shutdown(const std::string &why) {
    if (shut_) return;
    shut_ = true;
    for (int l = 0; l < kLaneCount; ++l) {
        while (!slot_waiters_[l].empty()) {
            Waiter w = std::move(slot_waiters_[l].front());
            slot_waiters_[l].pop_front();
            ++calls_failed_total_;
            post([cb = std::move(w.cb), why] { cb(failure(why)); });
        }
    }
    fail_connection_waiters(why);
    for (auto &c : conns_) c->close(why);
    db_up_ = false;
}

void Pool::close_handles() {
    // Cancels still on their way are sent if their socket is ready and abandoned
    // otherwise: the pinned statement_timeout ends such a call on the server anyway.
    if (canceller_) canceller_->close_all();
    if (idle_) {
        uv_idle_stop(idle_);
        uv_close(reinterpret_cast<uv_handle_t *>(idle_), [](uv_handle_t *h) { delete reinterpret_cast<uv_idle_t *>(h); });
        idle_ = nullptr;
    }
}

bool Pool::drain_posted() {
    // Used at teardown: run what is still queued (failures handed to coroutines).
    bool any = !posted_.empty();
    while (!posted_.empty()) on_post(nullptr);
    return any;
}

PoolFigures Pool::figures() const {
    PoolFigures f;
    f.db_state = db_up_ ? "up" : (consecutive_failures_ > 0 ? "down" : "connecting");
    if (shut_) f.db_state = "closed";
    f.last_error = last_error_;
    f.connections = static_cast<int>(conns_.size());
    for (auto &c : conns_) {
        switch (c->state()) {
        case PgConn::State::idle: ++f.idle; break;
        case PgConn::State::busy: ++f.busy; break;
        case PgConn::State::setup:
        case PgConn::State::connecting: ++f.connecting; break;
        default: ++f.down; break;
        }
    }
    f.connects_total = connects_total_;
    f.disconnects_total = disconnects_total_;
    f.deadline_cancels_total = deadline_cancels_total_;
    f.calls_total = calls_total_;
    f.calls_failed_total = calls_failed_total_;
    f.waiting_for_connection = static_cast<int>(conn_waiters_.size());
    for (int l = 0; l < kLaneCount; ++l) {
        f.slots_in_use[l] = in_use_[l];
        f.slots[l] = opts_.lane_slots[l];
        f.waiting_for_slot[l] = static_cast<int>(slot_waiters_[l].size());
        f.lane_calls_total[l] = lane_calls_[l];
    }
    f.max_slot_wait_ms = max_slot_wait_ms_;
    f.setup_failures_total = setup_failures_total_;
    const bool quiet = fault_gate_.last_fault_ms < 0 ||
                       static_cast<int64_t>(uv_now(loop_)) - fault_gate_.last_fault_ms >= kSessionFaultQuietMs;
    f.session_faults_in_row = quiet ? 0 : fault_gate_.faults;
    f.reconnect_delay_ms = last_reconnect_delay_ms_;
    return f;
}

int Pool::cut_short_at_stop(const std::string &why) {
    int n = 0;
    for (auto &c : conns_)
        if (c->cut_short(why)) ++n;
    return n;
}

std::vector<int> Pool::backend_pids() const {
    std::vector<int> v;
    for (auto &c : conns_)
        if (c->backend_pid()) v.push_back(c->backend_pid());
    return v;
}

}  // namespace qsw
