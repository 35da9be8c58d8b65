// Server-side cancel without blocking anyone. libpq's PQcancel connects, sends and then
// waits for the server to hang up, all blocking: against a frozen server (SIGSTOP) it
// waits for as long as the freeze lasts, and a stop that waits for it is unbounded.
// The Canceller sends the same 16-byte CancelRequest from the loop, non-blocking, each
// attempt bounded by a timer, and every attempt still open is abandoned at teardown.
#pragma once
#include <libpq-fe.h>
#include <uv.h>

#include <cstdint>
#include <list>
#include <memory>

namespace qsw {

class Canceller {
public:
    explicit Canceller(uv_loop_t *loop);
    ~Canceller();
    Canceller(const Canceller &) = delete;
    Canceller &operator=(const Canceller &) = delete;

    // Asks the server to cancel what `pg`'s backend is running. Never blocks; gives up
    // after `budget_ms`. Returns false when no request could be started (the caller then
    // relies on the pinned statement_timeout and client_connection_check_interval).
    bool cancel(PGconn *pg, int64_t budget_ms = 2000);
    // Teardown: abandons every attempt in flight (their handles are closed).
    void close_all();

    int64_t sent_total() const { return sent_total_; }
    int64_t abandoned_total() const { return abandoned_total_; }

    struct Attempt;

private:
    void finish(Attempt *a, bool sent);
    uv_loop_t *loop_;
    std::list<std::unique_ptr<Attempt>> live_;
    int64_t sent_total_ = 0;
    int64_t abandoned_total_ = 0;
};

// The cancel key of a connection: address, backend pid and secret, read from the
// PGcancel libpq builds. Exposed for tests. False when the layout cannot be verified.
struct CancelTarget {
    unsigned char addr[128];
    uint32_t addr_len = 0;
    int be_pid = 0;
    int be_key = 0;
};
bool cancel_target_of(PGconn *pg, CancelTarget &out);

}  // namespace qsw
