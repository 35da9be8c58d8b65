// One asynchronous libpq connection driven by the sweeper's loop: a small state
// machine (connecting, setup, idle, busy, down) whose poll direction always comes
// from the last libpq status. A call past its deadline is cancelled on the server
// and its connection is closed, never reused.
#pragma once
#include <libpq-fe.h>
#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pg/cancel.hpp"

namespace qsw {

struct QueryParam {
    std::string value;
    bool is_null = false;
    bool binary = false;  // value holds the binary wire form (e.g. a bytea[] array)
    Oid type = 0;
};

struct Query {
    std::string sql;
    std::vector<QueryParam> params;
    bool simple = false;      // several statements, no parameters (PQsendQuery)
    bool pinned = true;       // run inside BEGIN ... COMMIT with the session settings pinned
    bool binary_result = false;  // the statement's columns in binary (a bytea not doubled into hex)
    int64_t lock_timeout_ms = 0;  // > 0: this call's lock_timeout (pinned calls only), else 0 = none
    int64_t timeout_ms = 30000;
    // SQLSTATEs that answer the caller's question rather than fail the call (e.g. "no such
    // function" to "which schema version is here?"). The result is still !ok with that
    // SQLSTATE, for the caller to read; the pool only leaves it out of calls_failed_total,
    // the figure an operator alerts on.
    std::vector<std::string> answer_sqlstates;
    // A call whose answer is of no use once the sweeper stops (the walk from the index
    // head): a graceful stop cuts it short (Pool::cut_short_at_stop) instead of waiting.
    bool cut_at_stop = false;
};

// Where a failed call's failure came from, recorded where it happened, so that no caller
// reads it back out of a message's text (pg/classify.hpp reads it).
enum class Origin {
    answer,     // the server answered (ok, or an error with a SQLSTATE)
    transport,  // sent, then no answer: the connection broke or the deadline passed
    refused,    // never sent: no connection could serve it (database down, stopping)
    internal,   // this library's own code failed around the call (an exception)
};

struct PgResult {
    bool ok = false;
    std::string sqlstate;  // empty when the failure was not the server's answer
    std::string message;
    Origin origin = Origin::answer;
    std::shared_ptr<PGresult> res;
    // From the call's send to its answer (or its failure), microseconds: the server's time
    // plus one round trip on the session (the admission and the pool's wait not included).
    int64_t elapsed_us = 0;

    int rows() const { return res ? PQntuples(res.get()) : 0; }
    bool is_null(int r, int c) const { return PQgetisnull(res.get(), r, c); }
    std::string get(int r, int c) const {
        return std::string(PQgetvalue(res.get(), r, c), static_cast<size_t>(PQgetlength(res.get(), r, c)));
    }
    int column(const char *name) const { return res ? PQfnumber(res.get(), name) : -1; }
};

using QueryCallback = std::function<void(PgResult)>;

class PgConn {
public:
    enum class State { down, connecting, setup, idle, busy, closed };

    struct Hooks {
        std::function<void(PgConn &)> on_ready;                        // became idle (after connect or a call)
        // connection lost (while_connecting false) or an attempt to connect failed (true)
        std::function<void(PgConn &, const std::string &, bool while_connecting)> on_broken;
    };

    PgConn(uv_loop_t *loop, int id, std::string conninfo, int64_t connect_timeout_ms, int64_t stmt_timeout_ms,
           Hooks hooks, Canceller *canceller = nullptr);
    ~PgConn();
    PgConn(const PgConn &) = delete;
    PgConn &operator=(const PgConn &) = delete;

    void connect();                                  // from down: start connecting now
    void connect_after(int64_t delay_ms);            // from down: start connecting after a delay
    void run(Query q, QueryCallback cb);             // requires idle
    void close(const std::string &why);              // abandon: cancel in flight, finish, closed forever
    // The call in flight, when it is marked cut_at_stop: cancelled on the server, the
    // connection replaced, the caller answered with a transport failure. True if it was.
    bool cut_short(const std::string &why);
    State state() const { return state_; }
    int id() const { return id_; }
    int backend_pid() const { return backend_pid_; }
    // The last session ended because the server refused it with an answer it will repeat
    // (setup_refusal_repeats, or a call left it in a failed transaction): the pool spaces
    // the next session out (pool.hpp session_fault_step). Cleared by the next connect.
    bool refused() const { return refused_; }

private:
    void start_poll(int events);
    void stop_poll();
    void on_poll(int status, int events);
    void on_timer();
    void continue_connect();
    void drive_query(int events);
    // drive_query's steps: read what arrived and finish sending (false: wait, or broken);
    // one result taken into the call's answer (true: read on at once; false: r cleared,
    // look whether the connection survived); its error fields; the pipeline's last sync;
    // an error the server sent before it went away, delivered, then the connection replaced.
    bool read_and_flush(int events);
    bool take_result(PGresult *r);
    void note_error_result(const PGresult *r);
    void end_or_roll_back();  // the call's results are all in: roll back an aborted block, or finish
    void deliver_then_replace();
    void finish_call(PgResult r);
    void broken(const std::string &why, bool cancel_on_server);
    void reset_handles();
    void begin_setup();
    std::string pin_sql() const;

    uv_loop_t *loop_;
    Canceller *canceller_;
    int id_;
    std::string conninfo_;
    int64_t connect_timeout_ms_;
    int64_t stmt_timeout_ms_;
    Hooks hooks_;
    State state_ = State::down;
    PGconn *pg_ = nullptr;
    uv_poll_t *poll_ = nullptr;
    int poll_fd_ = -1;
    int poll_events_ = 0;
    uv_timer_t *timer_ = nullptr;
    enum class TimerRole { none, reconnect, connect_deadline, call_deadline } timer_role_ = TimerRole::none;
    QueryCallback cb_;
    bool cut_at_stop_ = false;  // the call in flight's Query::cut_at_stop
    PgResult pending_;
    bool flushing_ = false;
    int64_t stmt_deadline_ms_ = 0;
    int backend_pid_ = 0;
    int server_version_ = 0;
    // Pipeline bookkeeping of a pinned call: which of BEGIN / pin / statement / COMMIT
    // the next result belongs to.
    bool pipeline_ = false;
    int pipe_index_ = 0;
    int syncs_left_ = 0;
    // A failed pinned call left its explicit block aborted: its ROLLBACK is in flight, and
    // the call's answer is delivered once the session is out of the block.
    bool rolling_back_ = false;
    bool in_setup_ = false;      // the session check after connect: a failure backs off like a connect
    bool read_only_seen_ = false;  // the server refused read-write: reconnect, never blame a timer
    bool refused_ = false;
};

// The pinned statement (exposed for tests): every setting the plugin's correctness
// depends on, as SET LOCAL, so it holds for this transaction only, also behind a
// transaction-pooling bouncer, and never leaks into the next client of the server session.
std::string pinned_settings_sql(int64_t stmt_timeout_ms, int server_version);

// The first statement of every pinned call.
constexpr const char *kPinnedBegin = "BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE";

const char *conn_state_name(PgConn::State s);

// Whether the server's answer to a session's setup will be the same for the next session.
// No SQLSTATE (the connection broke), class 08, 57P01-57P03 (shut down, starting up) and
// 25006 (read-only: a standby, a failover under way) are a server in motion, not a refusal.
bool setup_refusal_repeats(const std::string &sqlstate);

}  // namespace qsw
