#include "pg/cancel.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace qsw {

namespace {

// The leading fields of libpq's struct pg_cancel (libpq-int.h), unchanged from
// PostgreSQL 9 through 17: the server address as a sockaddr_storage and its length,
// then the backend's pid and secret key. Read only after checking that the pid found
// there is the one PQbackendPID reports and that the address is a plausible socket
// address, so a libpq whose layout differs is detected and the cancel skipped, never
// sent with garbage.
struct PgCancelPrefix {
    sockaddr_storage addr;
    socklen_t salen;
    int be_pid;
    int be_key;
};

constexpr uint32_t kCancelRequestCode = (1234u << 16) | 5678u;

}  // namespace

bool cancel_target_of(PGconn *pg, CancelTarget &out) {
    if (!pg) return false;
    const int pid = PQbackendPID(pg);
    if (pid <= 0) return false;
    PGcancel *c = PQgetCancel(pg);
    if (!c) return false;
    PgCancelPrefix p;
    std::memcpy(&p, c, sizeof p);
    PQfreeCancel(c);
    if (p.be_pid != pid) return false;
    const int fam = p.addr.ss_family;
    if (fam != AF_INET && fam != AF_INET6 && fam != AF_UNIX) return false;
    if (p.salen == 0 || p.salen > sizeof(p.addr) || p.salen > sizeof(out.addr)) return false;
    std::memcpy(out.addr, &p.addr, p.salen);
    out.addr_len = static_cast<uint32_t>(p.salen);
    out.be_pid = p.be_pid;
    out.be_key = p.be_key;
    return true;
}

struct Canceller::Attempt {
    Canceller *owner = nullptr;
    int fd = -1;
    uv_poll_t *poll = nullptr;
    uv_timer_t *timer = nullptr;
    unsigned char packet[16];
    std::list<std::unique_ptr<Attempt>>::iterator self;
};

Canceller::Canceller(uv_loop_t *loop) : loop_(loop) {}
Canceller::~Canceller() { close_all(); }

bool Canceller::cancel(PGconn *pg, int64_t budget_ms) {
    CancelTarget t;
    if (!cancel_target_of(pg, t)) return false;
    const auto *sa = reinterpret_cast<const sockaddr *>(t.addr);
    int fd = ::socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    if (::connect(fd, sa, t.addr_len) != 0 && errno != EINPROGRESS) {
        ::close(fd);
        return false;
    }
    auto a = std::make_unique<Attempt>();
    a->owner = this;
    a->fd = fd;
    const uint32_t words[4] = {htonl(16), htonl(kCancelRequestCode), htonl(static_cast<uint32_t>(t.be_pid)),
                               htonl(static_cast<uint32_t>(t.be_key))};
    std::memcpy(a->packet, words, sizeof a->packet);
    a->poll = new uv_poll_t;
    if (uv_poll_init(loop_, a->poll, fd) != 0) {
        delete a->poll;
        ::close(fd);
        return false;
    }
    a->timer = new uv_timer_t;
    uv_timer_init(loop_, a->timer);
    Attempt *raw = a.get();
    a->poll->data = raw;
    a->timer->data = raw;
    live_.push_front(std::move(a));
    raw->self = live_.begin();
    uv_poll_start(raw->poll, UV_WRITABLE, [](uv_poll_t *h, int status, int) {
        auto *at = static_cast<Attempt *>(h->data);
        bool sent = false;
        if (status == 0) {
            int err = 0;
            socklen_t len = sizeof err;
            if (::getsockopt(at->fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
                // 16 bytes into a fresh socket's empty send buffer: all or nothing.
                sent = ::send(at->fd, at->packet, sizeof at->packet, MSG_NOSIGNAL) == sizeof at->packet;
            }
        }
        at->owner->finish(at, sent);
    });
    uv_timer_start(raw->timer, [](uv_timer_t *h) {
        auto *at = static_cast<Attempt *>(h->data);
        at->owner->finish(at, false);
    }, static_cast<uint64_t>(budget_ms > 0 ? budget_ms : 1), 0);
    return true;
}

void Canceller::finish(Attempt *a, bool sent) {
    if (sent) ++sent_total_;
    else ++abandoned_total_;
    // The server acts on the request once it has read it; we need not wait for its
    // goodbye. Closing now is what keeps every stop bounded.
    uv_poll_stop(a->poll);
    uv_close(reinterpret_cast<uv_handle_t *>(a->poll), [](uv_handle_t *h) { delete reinterpret_cast<uv_poll_t *>(h); });
    uv_timer_stop(a->timer);
    uv_close(reinterpret_cast<uv_handle_t *>(a->timer), [](uv_handle_t *h) { delete reinterpret_cast<uv_timer_t *>(h); });
    ::close(a->fd);
    live_.erase(a->self);  // destroys a
}

void Canceller::close_all() {
    // One last non-blocking try for each: on loopback the connect has usually completed
    // by now even though the loop never reported it. Either way nothing waits.
    while (!live_.empty()) {
        Attempt *a = live_.front().get();
        sockaddr_storage peer;
        socklen_t plen = sizeof peer;
        bool sent = false;
        if (::getpeername(a->fd, reinterpret_cast<sockaddr *>(&peer), &plen) == 0)
            sent = ::send(a->fd, a->packet, sizeof a->packet, MSG_NOSIGNAL | MSG_DONTWAIT) == sizeof a->packet;
        finish(a, sent);
    }
}

}  // namespace qsw
