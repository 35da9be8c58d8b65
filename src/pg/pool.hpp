// The connection pool and its admission lanes. A call takes its admission slot
// BEFORE its connection and gives the connection back BEFORE the slot: inverting
// the two deadlocks the pool under load (callers holding connections wait for
// slots held by callers waiting for connections). Each call is its own checkout:
// no connection is held between calls.
#pragma once
#include <uv.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/log.hpp"
#include "base/task.hpp"
#include "pg/pg_conn.hpp"

namespace qsw {

// Test seam (integration tests link the core): when set, called on the loop thread with the
// SQL of every call, in the order the pool is handed them. Null in production.
extern std::atomic<void (*)(const std::string &sql)> g_test_call_observer;

enum class Lane { push = 0, pop = 1, ack = 2, maint = 3 };
constexpr int kLaneCount = 4;
const char *lane_name(Lane l);

// The delay before the next attempt to connect after `failures` refused attempts in a row,
// an outage `outage_ms` old, jitter in [0, 1]: doubling from 50 ms, capped at 250 ms for the
// first 30 s of an outage (a failover: Patroni's new primary accepts writes a few seconds
// after the old one went, and every second of backoff past that is the sweeper's own gap)
// and at 5 s after it (a database that is down for long is not hammered). Never below 25 ms.
int64_t reconnect_delay_ms(int failures, int64_t outage_ms, double jitter);

// A session the server accepted and then refused with an answer it will repeat (its setup
// failed with a SQLSTATE, say 57014 under a role's statement_timeout of 1 ms, or a call left
// it in a failed transaction) is no sign the database is back: the next session meets the
// same answer. Such sessions are opened one at a time per pool, spaced by
// session_fault_spacing_ms: 100 ms doubling (jittered down to half), at least a second
// apart from the sixth fault in a row (about three seconds in), capped at 5 s like a long
// outage; a session that passes its setup in between resets nothing. A failover never lands
// here: a refused connect, a lost connection, a read-only server (25006) and the server
// ending sessions (class 08, 57P0x) keep reconnect_delay_ms and its short cap.
constexpr int64_t kSessionFaultCapMs = 5000;
// Faults this far apart are no longer "in a row": the spacing starts short again.
constexpr int64_t kSessionFaultQuietMs = 60000;

struct SessionFaultGate {
    int faults = 0;               // refused sessions in a row
    int64_t last_fault_ms = -1;   // loop clock of the last one (-1: none yet)
    int64_t next_open_ms = 0;     // the earliest instant the pool opens the next session
};

struct SessionFaultStep {
    SessionFaultGate next;
    int64_t delay_ms = 0;  // from now until this connection may open its next session
};

// The spacing after `faults` refused sessions in a row, jitter in [0, 1] (half to all of it).
int64_t session_fault_spacing_ms(int faults, double jitter);
// One more refused session at now_ms: its connection's delay and the pool's new gate.
SessionFaultStep session_fault_step(SessionFaultGate g, int64_t now_ms, double jitter);

struct PoolOptions {
    std::string conninfo;
    int pool_size = 4;
    std::array<int, kLaneCount> lane_slots{4, 4, 4, 4};
    int64_t connect_timeout_ms = 10000;
    int64_t stmt_timeout_ms = 30000;
    // Called on the loop thread when the database answers again after being down, so the
    // caller can cut a backoff short instead of waiting it out.
    std::function<void()> on_up;
};

struct PoolFigures {
    std::string db_state;  // connecting, up, down
    std::string last_error;
    int connections = 0, idle = 0, busy = 0, connecting = 0, down = 0;
    int64_t connects_total = 0, disconnects_total = 0, deadline_cancels_total = 0;
    int64_t calls_total = 0, calls_failed_total = 0;
    int waiting_for_connection = 0;
    std::array<int, kLaneCount> slots_in_use{}, slots{}, waiting_for_slot{};
    std::array<int64_t, kLaneCount> lane_calls_total{};
    int64_t max_slot_wait_ms = 0;
    // Sessions the server accepted and then refused (setup failed with a SQLSTATE, or a
    // call left them in a failed transaction); and the delay the last reconnect waited for.
    int64_t setup_failures_total = 0;
    int session_faults_in_row = 0;
    int64_t reconnect_delay_ms = 0;
};

class Pool {
public:
    Pool(uv_loop_t *loop, PoolOptions opts, Logger &log);
    ~Pool();

    void start();                     // opens every connection (asynchronously)
    void shutdown(const std::string &why);  // fails every waiter, closes every connection
    void close_handles();                   // last: the pool's own loop handle
    bool drain_posted();                    // runs queued completions; true if any ran

    // The callback is never called synchronously from inside call().
    void call(Lane lane, Query q, QueryCallback cb);
    // The awaitable form for the cycle's coroutines.
    CallbackAwaiter<PgResult> query(Lane lane, Query q);

    // At a graceful stop: every call in flight marked Query::cut_at_stop is cancelled on
    // the server and answered with a transport failure, its connection and slot freed for
    // what the stop still sends. How many were.
    int cut_short_at_stop(const std::string &why);

    PoolFigures figures() const;
    bool up() const { return db_up_; }
    std::vector<int> backend_pids() const;

private:
    struct Waiter {
        Lane lane;
        Query q;
        QueryCallback cb;
        uint64_t enqueued_ms;
    };
    void admit(Waiter w);
    void with_slot(Waiter w);
    void dispatch();
    void release_slot(Lane lane);
    void on_ready(PgConn &c);
    void on_broken(PgConn &c, const std::string &why, bool while_connecting);
    void fail_connection_waiters(const std::string &why);
    void post(std::function<void()> fn);
    void on_post(uv_async_t *a);

    uv_loop_t *loop_;
    PoolOptions opts_;
    Logger &log_;
    std::unique_ptr<Canceller> canceller_;  // server cancels, bounded and non-blocking
    std::vector<std::unique_ptr<PgConn>> conns_;
    std::array<int, kLaneCount> in_use_{};
    std::array<std::deque<Waiter>, kLaneCount> slot_waiters_;
    std::deque<Waiter> conn_waiters_;
    std::deque<std::function<void()>> posted_;
    uv_idle_t *idle_ = nullptr;
    bool db_up_ = false;
    bool ever_up_ = false;
    bool down_logged_ = false;
    bool shut_ = false;
    int consecutive_failures_ = 0;
    uint64_t down_since_ms_ = 0;  // loop clock of the first refused attempt of this outage
    SessionFaultGate fault_gate_;
    int64_t setup_failures_total_ = 0, last_reconnect_delay_ms_ = 0;
    std::string last_error_;
    int64_t connects_total_ = 0, disconnects_total_ = 0, deadline_cancels_total_ = 0;
    int64_t calls_total_ = 0, calls_failed_total_ = 0, max_slot_wait_ms_ = 0;
    std::array<int64_t, kLaneCount> lane_calls_{};
};

}  // namespace qsw
