#include "pg/pg_conn.hpp"

#include "config/config.hpp"

#include <cmath>
#include <cstring>

namespace qsw {
namespace {

void delete_poll(uv_handle_t *h) { delete reinterpret_cast<uv_poll_t *>(h); }
void delete_timer(uv_handle_t *h) { delete reinterpret_cast<uv_timer_t *>(h); }

std::string trim_msg(const char *m) {
    std::string s = m ? m : "";
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

}  // namespace

const char *conn_state_name(PgConn::State s) {
    switch (s) {
    case PgConn::State::down: return "down";
    case PgConn::State::connecting: return "connecting";
    case PgConn::State::setup: return "setup";
    case PgConn::State::idle: return "idle";
    case PgConn::State::busy: return "busy";
    case PgConn::State::closed: return "closed";
    }
    return "?";
}

PgConn::PgConn(uv_loop_t *loop, int id, std::string conninfo, int64_t connect_timeout_ms, int64_t stmt_timeout_ms,
               Hooks hooks, Canceller *canceller)
    : loop_(loop), canceller_(canceller), id_(id), conninfo_(std::move(conninfo)), connect_timeout_ms_(connect_timeout_ms),
      stmt_timeout_ms_(stmt_timeout_ms), hooks_(std::move(hooks)) {
    timer_ = new uv_timer_t;
    uv_timer_init(loop_, timer_);
    timer_->data = this;
}

PgConn::~PgConn() {
    // close() must have run on the loop thread; this only guards against leaks.
    if (pg_) PQfinish(pg_);
}

void PgConn::connect_after(int64_t delay_ms) {
    if (state_ == State::closed) return;
    state_ = State::down;
    timer_role_ = TimerRole::reconnect;
    uv_timer_start(timer_, [](uv_timer_t *t) { static_cast<PgConn *>(t->data)->on_timer(); },
                   static_cast<uint64_t>(std::max<int64_t>(delay_ms, 0)), 0);
}

void PgConn::connect() {
    if (state_ == State::closed) return;
    uv_timer_stop(timer_);
    refused_ = false;
    std::string timeout_s = std::to_string(std::max<int64_t>(1, (connect_timeout_ms_ + 999) / 1000));
    // client_encoding travels in the startup packet, after dbname so it overrides the
    // conninfo's own: it outranks ALTER ROLE/DATABASE ... SET, and PgBouncer tracks it per
    // client. Every other setting is pinned per transaction (pinned_settings_sql).
    const char *keys[] = {"dbname", "fallback_application_name", "connect_timeout", "client_encoding", nullptr};
    const char *vals[] = {conninfo_.empty() ? nullptr : conninfo_.c_str(), "queen-sweeper", timeout_s.c_str(),
                          "UTF8", nullptr};
    pg_ = PQconnectStartParams(keys, vals, 1);
    if (!pg_) {
        broken("cannot allocate a connection", false);
        return;
    }
    if (PQstatus(pg_) == CONNECTION_BAD) {
        broken(trim_msg(PQerrorMessage(pg_)), false);
        return;
    }
    // Server notices (e.g. "already exists, skipping" while the schema applies)
    // must never reach the host's stderr.
    PQsetNoticeProcessor(pg_, [](void *, const char *) {}, nullptr);
    state_ = State::connecting;
    timer_role_ = TimerRole::connect_deadline;
    uv_timer_start(timer_, [](uv_timer_t *t) { static_cast<PgConn *>(t->data)->on_timer(); },
                   static_cast<uint64_t>(connect_timeout_ms_), 0);
    // libpq: behave as if PQconnectPoll had last returned PGRES_POLLING_WRITING.
    start_poll(UV_WRITABLE);
}

void PgConn::start_poll(int events) {
    int fd = PQsocket(pg_);
    if (fd < 0) {
        broken("connection has no socket", false);
        return;
    }
    if (poll_ && poll_fd_ != fd) stop_poll();  // the socket may change while connecting
    if (!poll_) {
        poll_ = new uv_poll_t;
        if (uv_poll_init(loop_, poll_, fd) != 0) {
            delete poll_;
            poll_ = nullptr;
            broken("cannot poll the connection's socket", false);
            return;
        }
        poll_->data = this;
        poll_fd_ = fd;
        poll_events_ = 0;
    }
    if (poll_events_ == events) return;
    poll_events_ = events;
    uv_poll_start(poll_, events, [](uv_poll_t *p, int status, int ev) {
        static_cast<PgConn *>(p->data)->on_poll(status, ev);
    });
}

void PgConn::stop_poll() {
    if (!poll_) return;
    uv_poll_stop(poll_);
    uv_close(reinterpret_cast<uv_handle_t *>(poll_), delete_poll);
    poll_ = nullptr;
    poll_fd_ = -1;
    poll_events_ = 0;
}

void PgConn::on_poll(int status, int events) {
    if (status < 0 && status != UV_EBADF) {
        broken(std::string("socket error: ") + uv_strerror(status), state_ == State::busy);
        return;
    }
    if (state_ == State::connecting) {
        continue_connect();
    } else if (state_ == State::busy || state_ == State::setup) {
        drive_query(status < 0 ? UV_READABLE : events);
    } else if (state_ == State::idle) {
        // An idle connection that becomes readable is usually being closed by
        // the server (pg_terminate_backend, a restart): notice it now.
        if (!PQconsumeInput(pg_) || PQstatus(pg_) == CONNECTION_BAD) {
            broken(trim_msg(PQerrorMessage(pg_)), false);
            return;
        }
        while (!PQisBusy(pg_)) {
            PGresult *r = PQgetResult(pg_);
            if (!r) break;
            PQclear(r);
        }
        if (PQstatus(pg_) == CONNECTION_BAD) broken(trim_msg(PQerrorMessage(pg_)), false);
    }
}

void PgConn::continue_connect() {
    const PostgresPollingStatusType st = PQconnectPoll(pg_);
    // While connecting, libpq may close its socket and open another (the next host of a
    // multi-host conninfo, the next address of a name, SSL refused and retried plain).
    // The new socket usually gets the same descriptor number, so comparing numbers is not
    // enough: the old registration died with the old socket and epoll would never report
    // the new one. A fresh poll handle for every step costs nothing next to a connect.
    if (st != PGRES_POLLING_OK) stop_poll();
    switch (st) {
    case PGRES_POLLING_FAILED:
        broken(trim_msg(PQerrorMessage(pg_)), false);
        return;
    case PGRES_POLLING_READING:
        start_poll(UV_READABLE);
        return;
    case PGRES_POLLING_WRITING:
        start_poll(UV_WRITABLE);
        return;
    case PGRES_POLLING_OK: {
        uv_timer_stop(timer_);
        timer_role_ = TimerRole::none;
        PQsetnonblocking(pg_, 1);
        backend_pid_ = PQbackendPID(pg_);
        server_version_ = PQserverVersion(pg_);
        begin_setup();
        return;
    }
    default:
        start_poll(UV_READABLE | UV_WRITABLE);
        return;
    }
}

bool setup_refusal_repeats(const std::string &sqlstate) {
    if (sqlstate.size() != 5) return false;
    if (sqlstate == "25006") return false;
    if (sqlstate.compare(0, 2, "08") == 0) return false;
    if (sqlstate.compare(0, 3, "57P") == 0) return false;
    return true;
}

std::string pinned_settings_sql(int64_t stmt_timeout_ms, int server_version) {
    // Each value is what the plugin's SQL and its decoders assume. A role or database
    // default (ALTER ROLE ... SET bytea_output = 'escape', DateStyle, a lock_timeout of
    // 1 ms, a hostile search_path) would otherwise change what the fire reads or make it
    // fail for reasons no timer owns. set_config(..., true) is SET LOCAL: it ends with the
    // transaction, so nothing outlives the call on a pooled server session.
    std::vector<std::pair<const char *, std::string>> pins = {
        {"search_path", "pg_catalog, queen, pg_temp"},
        {"bytea_output", "hex"},
        {"DateStyle", "ISO, MDY"},
        {"IntervalStyle", "postgres"},
        {"TimeZone", "UTC"},
        {"extra_float_digits", "3"},
        {"standard_conforming_strings", "on"},
        {"lock_timeout", "0"},
        {"idle_in_transaction_session_timeout", "0"},
        {"row_security", "on"},
        // The top-level call's plan too (every function pins its own: sql/README.md "Plan
        // pins"): never JIT-compiled, never parallel, however large the tables grow.
        {"jit", "off"},
        {"max_parallel_workers_per_gather", "0"},
        // The server-side second line behind the client deadline: a call the client
        // gave up on stops on the server too, even if the cancel is lost.
        {"statement_timeout", std::to_string(stmt_timeout_ms + 1000)},
    };
    // PostgreSQL 14+: a backend whose client vanished stops promptly instead of finishing.
    if (server_version >= 140000) pins.push_back({"client_connection_check_interval", "1000"});
    std::string sql = "SELECT ";
    for (size_t i = 0; i < pins.size(); ++i) {
        if (i) sql += ", ";
        sql += "pg_catalog.set_config('";
        sql += pins[i].first;
        sql += "', '";
        sql += pins[i].second;
        sql += "', true)";
    }
    return sql;
}

std::string PgConn::pin_sql() const { return pinned_settings_sql(stmt_timeout_ms_, server_version_); }

void PgConn::begin_setup() {
    // The startup packet asked for UTF8; a server or bouncer that answered otherwise would
    // change every txn's bytes (and so the dedup identity): refuse the session.
    const char *enc = PQparameterStatus(pg_, "client_encoding");
    if (!enc || std::string(enc) != "UTF8") {
        in_setup_ = true;
        refused_ = true;  // the same server answers every session so
        broken(std::string("session setup failed: client_encoding is ") + (enc ? enc : "unknown") +
                   ", the sweeper needs UTF8",
               false);
        in_setup_ = false;
        return;
    }
    // One pinned round trip proves the session can do what every call does: open a
    // read-write transaction (a standby or a demoted primary refuses here, 25006) and take
    // the pinned settings (a role statement_timeout too short for even that fails here).
    Query setup;
    setup.sql = "SELECT pg_catalog.pg_is_in_recovery()";
    setup.timeout_ms = connect_timeout_ms_;
    in_setup_ = true;
    state_ = State::idle;  // run() requires idle
    run(std::move(setup), [this](PgResult r) {
        in_setup_ = false;
        if (!r.ok) {
            // A broken connection already went down; only a refused setup lands here idle.
            if (state_ == State::idle) {
                in_setup_ = true;
                refused_ = setup_refusal_repeats(r.sqlstate);
                broken("session setup failed" + (r.sqlstate.empty() ? "" : " (SQLSTATE " + r.sqlstate + ")") + ": " +
                           r.message,
                       false);
                in_setup_ = false;
            }
            return;
        }
        if (hooks_.on_ready) hooks_.on_ready(*this);
    });
    if (state_ == State::busy) state_ = State::setup;
}

void PgConn::run(Query q, QueryCallback cb) {
    // Every way the call ends (an answer, a failure, its deadline, a close) passes here.
    cb_ = [t0 = uv_hrtime(), cb = std::move(cb)](PgResult r) {
        r.elapsed_us = static_cast<int64_t>((uv_hrtime() - t0) / 1000);
        if (cb) cb(std::move(r));
    };
    pending_ = PgResult{};
    state_ = State::busy;
    cut_at_stop_ = q.cut_at_stop;
    int sent;
    pipeline_ = false;
    pipe_index_ = 0;
    rolling_back_ = false;
    if (q.simple) {
        // Several statements in one simple query run as one transaction; the pin opens it.
        sent = q.pinned ? PQsendQuery(pg_, (std::string(kPinnedBegin) + ";\n" + pin_sql() + ";\n" + q.sql +
                                            "\n;\nCOMMIT")
                                               .c_str())
                        : PQsendQuery(pg_, q.sql.c_str());
    } else if (q.pinned) {
        // One round trip: BEGIN, the pinned settings, the statement, COMMIT, Sync. A failure
        // anywhere aborts the rest and the Sync rolls the transaction back.
        std::vector<const char *> values(q.params.size());
        std::vector<int> lengths(q.params.size()), formats(q.params.size());
        std::vector<Oid> types(q.params.size());
        for (size_t i = 0; i < q.params.size(); ++i) {
            values[i] = q.params[i].is_null ? nullptr : q.params[i].value.data();
            lengths[i] = static_cast<int>(q.params[i].value.size());
            formats[i] = q.params[i].binary ? 1 : 0;
            types[i] = q.params[i].type;
        }
        std::string pin = pin_sql();
        if (q.lock_timeout_ms > 0)
            pin += ", pg_catalog.set_config('lock_timeout', '" + std::to_string(q.lock_timeout_ms) + "ms', true)";
        sent = PQenterPipelineMode(pg_) && PQsendQueryParams(pg_, kPinnedBegin, 0, nullptr, nullptr, nullptr, nullptr, 0) &&
               PQsendQueryParams(pg_, pin.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 0) &&
               PQsendQueryParams(pg_, q.sql.c_str(), static_cast<int>(q.params.size()), types.data(), values.data(),
                                 lengths.data(), formats.data(), q.binary_result ? 1 : 0) &&
               PQsendQueryParams(pg_, "COMMIT", 0, nullptr, nullptr, nullptr, nullptr, 0) && PQpipelineSync(pg_);
        // A Sync does not end an explicit transaction block: after a failure the session
        // sits in an aborted block, and the call ends with a ROLLBACK (end_or_roll_back), a
        // second round trip on failures only. It used to follow every call in the same
        // round trip, which after a COMMIT made the server log "there is no transaction in
        // progress" once per call (about 100 lines a second under load).
        pipeline_ = true;
        syncs_left_ = 1;
    } else {
        std::vector<const char *> values(q.params.size());
        std::vector<int> lengths(q.params.size()), formats(q.params.size());
        std::vector<Oid> types(q.params.size());
        for (size_t i = 0; i < q.params.size(); ++i) {
            values[i] = q.params[i].is_null ? nullptr : q.params[i].value.data();
            lengths[i] = static_cast<int>(q.params[i].value.size());
            formats[i] = q.params[i].binary ? 1 : 0;
            types[i] = q.params[i].type;
        }
        sent = PQsendQueryParams(pg_, q.sql.c_str(), static_cast<int>(q.params.size()), types.data(),
                                 values.data(), lengths.data(), formats.data(), 0);
    }
    if (!sent) {
        broken(trim_msg(PQerrorMessage(pg_)), false);
        return;
    }
    timer_role_ = TimerRole::call_deadline;
    stmt_deadline_ms_ = q.timeout_ms;
    uv_timer_start(timer_, [](uv_timer_t *t) { static_cast<PgConn *>(t->data)->on_timer(); },
                   static_cast<uint64_t>(std::max<int64_t>(q.timeout_ms, 1)), 0);
    flushing_ = true;
    drive_query(UV_WRITABLE);
}

void PgConn::drive_query(int events) {
    if (!pg_) return;
    if (!read_and_flush(events)) return;
    while (!PQisBusy(pg_)) {
        PGresult *r = PQgetResult(pg_);
        if (!r) {
            if (pipeline_) {
                ++pipe_index_;  // end of one pipelined statement's results
                continue;
            }
            end_or_roll_back();
            return;
        }
        if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
            PQclear(r);
            if (--syncs_left_ > 0) continue;
            PQexitPipelineMode(pg_);
            pipeline_ = false;
            end_or_roll_back();
            return;
        }
        if (take_result(r)) continue;
        if (PQstatus(pg_) == CONNECTION_BAD) break;
    }
    if (PQstatus(pg_) == CONNECTION_BAD) {
        deliver_then_replace();
        return;
    }
    start_poll(UV_READABLE);
}

bool PgConn::read_and_flush(int events) {
    if (events & UV_READABLE) {
        if (!PQconsumeInput(pg_)) {
            broken(trim_msg(PQerrorMessage(pg_)), false);
            return false;
        }
    }
    if (flushing_) {
        int f = PQflush(pg_);
        if (f < 0) {
            broken(trim_msg(PQerrorMessage(pg_)), false);
            return false;
        }
        if (f == 1) {
            start_poll(UV_READABLE | UV_WRITABLE);
            return false;
        }
        flushing_ = false;
    }
    return true;
}

void PgConn::end_or_roll_back() {
    // A pinned call that failed inside its block leaves the block aborted (the simple form's
    // explicit BEGIN, and the pipeline's: a Sync does not end it). Roll it back on the same
    // session before the answer goes out, so the session is handed back outside any
    // transaction and nothing is logged on the success path. A ROLLBACK that fails, or a
    // session still in a block after it, is replaced by finish_call.
    if (!rolling_back_ && PQtransactionStatus(pg_) == PQTRANS_INERROR) {
        if (!PQsendQuery(pg_, "ROLLBACK")) {
            broken(trim_msg(PQerrorMessage(pg_)), false);
            return;
        }
        rolling_back_ = true;
        flushing_ = true;
        drive_query(UV_WRITABLE);
        return;
    }
    rolling_back_ = false;
    if (pending_.message.empty() && !pending_.ok) pending_.message = "the statement returned no result";
    finish_call(std::move(pending_));
}

bool PgConn::take_result(PGresult *r) {
    const ExecStatusType st = PQresultStatus(r);
    // In a pinned pipeline only the statement's own result is the answer (index 2);
    // BEGIN, the pin and COMMIT only count when they fail.
    const bool answer = !pipeline_ || pipe_index_ == 2;
    if (rolling_back_) {  // the ROLLBACK after a failure: never the answer, never an error
        PQclear(r);
        return true;
    }
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
        if (answer && pending_.sqlstate.empty() && pending_.message.empty()) {
            pending_.ok = true;
            pending_.res = std::shared_ptr<PGresult>(r, PQclear);
            return true;
        }
    } else if (st == PGRES_FATAL_ERROR || st == PGRES_NONFATAL_ERROR || st == PGRES_BAD_RESPONSE) {
        if (pending_.message.empty()) note_error_result(r);
    }
    PQclear(r);
    return false;
}

void PgConn::note_error_result(const PGresult *r) {
    const char *ss = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    const char *primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    pending_.ok = false;
    pending_.res.reset();
    pending_.sqlstate = ss ? ss : "";
    pending_.message = primary ? primary : trim_msg(PQresultErrorMessage(r));
    // A server in recovery refuses the pinned BEGIN ... READ WRITE with 0A000
    // ("cannot set transaction read-write mode during recovery"): that is a
    // read-only server, never a fault of the statement, so it is reported as one.
    if (pipeline_ && pipe_index_ == 0 && pending_.sqlstate == "0A000") {
        pending_.sqlstate = "25006";
        pending_.message = "server is read-only (in recovery: a standby): " + pending_.message;
    }
    if (pending_.sqlstate == "25006") read_only_seen_ = true;
}

void PgConn::deliver_then_replace() {
    // The server answered with an error and then went away (pg_terminate_backend,
    // a shutdown): deliver what it said, then replace the connection.
    PgResult r = std::move(pending_);
    if (r.message.empty()) r.message = trim_msg(PQerrorMessage(pg_));
    r.ok = false;
    if (r.sqlstate.empty()) r.origin = Origin::transport;
    auto cb = std::move(cb_);
    cb_ = nullptr;
    broken(r.message, false);
    if (cb) cb(std::move(r));
}

void PgConn::finish_call(PgResult r) {
    uv_timer_stop(timer_);
    timer_role_ = TimerRole::none;
    state_ = State::idle;
    auto cb = std::move(cb_);
    cb_ = nullptr;
    if (read_only_seen_ && !in_setup_) {
        // The server refused a read-write transaction (a standby, a primary demoted under
        // us): no call on this session can succeed. Tell the caller (classified transient:
        // no timer spends an attempt on it), then reconnect, which finds the primary of a
        // multi-host conninfo; the backoff paces it while no primary answers.
        read_only_seen_ = false;
        in_setup_ = true;  // counts as a failed connect: backoff, db_state down
        broken("server is read-only (SQLSTATE 25006: a standby or a demoted primary); reconnecting", false);
        in_setup_ = false;
        if (cb) cb(std::move(r));
        return;
    }
    read_only_seen_ = false;
    if (PQtransactionStatus(pg_) != PQTRANS_IDLE) {
        // Never hand out a session inside a transaction (a failed simple query leaves its
        // explicit block open): replace it rather than let the next call inherit it. The
        // server's answer (a failed block, a refused ROLLBACK) will meet the next session
        // too, so the replacement is paced (pool.hpp session_fault_step).
        refused_ = true;
        broken("session left inside a transaction; replaced", false);
        if (cb) cb(std::move(r));
        return;
    }
    start_poll(UV_READABLE);  // so a server-side close of an idle connection is noticed
    if (cb) cb(std::move(r));
}

void PgConn::on_timer() {
    switch (timer_role_) {
    case TimerRole::reconnect:
        timer_role_ = TimerRole::none;
        connect();
        break;
    case TimerRole::connect_deadline:
        broken("connect timed out after " + std::to_string(connect_timeout_ms_) + " ms", false);
        break;
    case TimerRole::call_deadline:
        broken("statement deadline of " + std::to_string(stmt_deadline_ms_) +
                   " ms exceeded: cancelled on the server, connection closed",
               true);
        break;
    case TimerRole::none:
        break;
    }
}

void PgConn::reset_handles() {
    stop_poll();
    uv_timer_stop(timer_);
    timer_role_ = TimerRole::none;
    if (pg_) {
        PQfinish(pg_);
        pg_ = nullptr;
    }
    backend_pid_ = 0;
    flushing_ = false;
    pipeline_ = false;
    pipe_index_ = 0;
    rolling_back_ = false;
    read_only_seen_ = false;
}

void PgConn::broken(const std::string &raw_why, bool cancel_on_server) {
    // libpq echoes the conninfo in some errors (a malformed URI, for one): nothing that
    // leaves this connection may carry the password, whatever form it was written in.
    const std::string why = redact_secrets(raw_why, conninfo_);
    if (cancel_on_server && pg_ && canceller_) canceller_->cancel(pg_);
    const bool closing = state_ == State::closed;
    const bool while_connecting =
        in_setup_ || state_ == State::connecting || state_ == State::setup || state_ == State::down;
    reset_handles();
    if (!closing) state_ = State::down;
    auto cb = std::move(cb_);
    cb_ = nullptr;
    if (cb) {
        PgResult r;
        r.ok = false;
        r.message = why;
        r.origin = Origin::transport;
        cb(std::move(r));
    }
    if (!closing && state_ == State::down && hooks_.on_broken) hooks_.on_broken(*this, why, while_connecting);
}

bool PgConn::cut_short(const std::string &why) {
    if (state_ != State::busy || !cut_at_stop_ || !cb_) return false;
    broken(why, true);
    return true;
}

void PgConn::close(const std::string &why) {
    if (state_ == State::closed) return;
    const bool busy = state_ == State::busy || state_ == State::setup;
    state_ = State::closed;
    if (busy && pg_ && canceller_) canceller_->cancel(pg_);
    reset_handles();
    auto cb = std::move(cb_);
    cb_ = nullptr;
    if (cb) {
        PgResult r;
        r.ok = false;
        r.message = why;
        r.origin = Origin::transport;
        cb(std::move(r));
    }
    if (timer_) {
        uv_close(reinterpret_cast<uv_handle_t *>(timer_), delete_timer);
        timer_ = nullptr;
    }
}

}  // namespace qsw
