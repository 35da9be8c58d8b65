#include "pg_conn.hpp"

#include <cmath>
#include <cstring>

namespace qsw {
namespace {

void delete_poll(uv_handle_t *h) { delete reinterpret_cast<uv_poll_t *>(h); }
void delete_timer(uv_handle_t *h) { delete reinterpret_cast<uv_timer_t *>(h); }

// PQcancel opens a connection of its own and blocks, so it runs on libuv's
// worker pool rather than on the loop thread.
struct CancelWork {
    uv_work_t req;
    PGcancel *cancel;
};

void queue_server_cancel(uv_loop_t *loop, PGconn *pg) {
    PGcancel *c = PQgetCancel(pg);
    if (!c) return;
    auto *w = new CancelWork{};
    w->cancel = c;
    w->req.data = w;
    int rc = uv_queue_work(
        loop, &w->req,
        [](uv_work_t *req) {
            auto *cw = static_cast<CancelWork *>(req->data);
            char err[256];
            PQcancel(cw->cancel, err, sizeof err);
        },
        [](uv_work_t *req, int) {
            auto *cw = static_cast<CancelWork *>(req->data);
            PQfreeCancel(cw->cancel);
            delete cw;
        });
    if (rc != 0) {
        PQfreeCancel(c);
        delete w;
    }
}

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
               Hooks hooks)
    : loop_(loop), id_(id), conninfo_(std::move(conninfo)), connect_timeout_ms_(connect_timeout_ms),
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
    std::string timeout_s = std::to_string(std::max<int64_t>(1, (connect_timeout_ms_ + 999) / 1000));
    const char *keys[] = {"dbname", "fallback_application_name", "connect_timeout", nullptr};
    const char *vals[] = {conninfo_.empty() ? nullptr : conninfo_.c_str(), "queen-sweeper", timeout_s.c_str(),
                          nullptr};
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
    switch (PQconnectPoll(pg_)) {
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
        // The server-side statement_timeout sits above our own deadline as a
        // second line; client_connection_check_interval (PostgreSQL 14+) makes a
        // backend whose client vanished stop promptly instead of finishing.
        Query setup;
        setup.sql = "SELECT set_config('statement_timeout', $1, false), "
                    "(SELECT set_config(name, '1000', false) FROM pg_settings "
                    " WHERE name = 'client_connection_check_interval')";
        setup.params.push_back(QueryParam{std::to_string(stmt_timeout_ms_ + 1000)});
        setup.timeout_ms = connect_timeout_ms_;
        state_ = State::idle;  // run() requires idle
        run(std::move(setup), [this](PgResult r) {
            if (!r.ok) {
                // A broken connection already went down; only a refused setup lands here idle.
                if (state_ == State::idle) broken("session setup failed: " + r.message, false);
                return;
            }
            if (hooks_.on_ready) hooks_.on_ready(*this);
        });
        state_ = state_ == State::busy ? State::setup : state_;
        return;
    }
    default:
        start_poll(UV_READABLE | UV_WRITABLE);
        return;
    }
}

void PgConn::run(Query q, QueryCallback cb) {
    cb_ = std::move(cb);
    pending_ = PgResult{};
    state_ = State::busy;
    int sent;
    if (q.simple) {
        sent = PQsendQuery(pg_, q.sql.c_str());
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
    if (events & UV_READABLE) {
        if (!PQconsumeInput(pg_)) {
            broken(trim_msg(PQerrorMessage(pg_)), false);
            return;
        }
    }
    if (flushing_) {
        int f = PQflush(pg_);
        if (f < 0) {
            broken(trim_msg(PQerrorMessage(pg_)), false);
            return;
        }
        if (f == 1) {
            start_poll(UV_READABLE | UV_WRITABLE);
            return;
        }
        flushing_ = false;
    }
    while (!PQisBusy(pg_)) {
        PGresult *r = PQgetResult(pg_);
        if (!r) {
            finish_call(std::move(pending_));
            return;
        }
        ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
            if (pending_.sqlstate.empty() && pending_.message.empty()) {
                pending_.ok = true;
                pending_.res = std::shared_ptr<PGresult>(r, PQclear);
                continue;
            }
        } else if (st == PGRES_FATAL_ERROR || st == PGRES_NONFATAL_ERROR || st == PGRES_BAD_RESPONSE) {
            if (pending_.message.empty()) {
                const char *ss = PQresultErrorField(r, PG_DIAG_SQLSTATE);
                const char *primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
                pending_.ok = false;
                pending_.res.reset();
                pending_.sqlstate = ss ? ss : "";
                pending_.message = primary ? primary : trim_msg(PQresultErrorMessage(r));
            }
        }
        PQclear(r);
        if (PQstatus(pg_) == CONNECTION_BAD) break;
    }
    if (PQstatus(pg_) == CONNECTION_BAD) {
        // The server answered with an error and then went away (pg_terminate_backend,
        // a shutdown): deliver what it said, then replace the connection.
        PgResult r = std::move(pending_);
        if (r.message.empty()) r.message = trim_msg(PQerrorMessage(pg_));
        r.ok = false;
        auto cb = std::move(cb_);
        cb_ = nullptr;
        broken(r.message, false);
        if (cb) cb(std::move(r));
        return;
    }
    start_poll(UV_READABLE);
}

void PgConn::finish_call(PgResult r) {
    uv_timer_stop(timer_);
    timer_role_ = TimerRole::none;
    state_ = State::idle;
    auto cb = std::move(cb_);
    cb_ = nullptr;
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
}

void PgConn::broken(const std::string &why, bool cancel_on_server) {
    if (cancel_on_server && pg_) queue_server_cancel(loop_, pg_);
    const bool closing = state_ == State::closed;
    const bool while_connecting = state_ == State::connecting || state_ == State::setup || state_ == State::down;
    reset_handles();
    if (!closing) state_ = State::down;
    auto cb = std::move(cb_);
    cb_ = nullptr;
    if (cb) {
        PgResult r;
        r.ok = false;
        r.message = why;
        cb(std::move(r));
    }
    if (!closing && state_ == State::down && hooks_.on_broken) hooks_.on_broken(*this, why, while_connecting);
}

void PgConn::close(const std::string &why) {
    if (state_ == State::closed) return;
    const bool busy = state_ == State::busy || state_ == State::setup;
    state_ = State::closed;
    if (busy && pg_) queue_server_cancel(loop_, pg_);
    reset_handles();
    auto cb = std::move(cb_);
    cb_ = nullptr;
    if (cb) {
        PgResult r;
        r.ok = false;
        r.message = why;
        cb(std::move(r));
    }
    if (timer_) {
        uv_close(reinterpret_cast<uv_handle_t *>(timer_), delete_timer);
        timer_ = nullptr;
    }
}

}  // namespace qsw
