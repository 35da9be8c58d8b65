// Helpers shared by the engine tests: an owning handle, push/pop wrappers
// that copy the payload out and free it, and a reader for one stats counter.
#pragma once

#include "queen_ephemeral.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>

namespace eph_test {

inline queen_ephemeral_config config(const std::function<void(queen_ephemeral_config &)> &edit = {}) {
    queen_ephemeral_config cfg;
    queen_ephemeral_config_init(&cfg);
    cfg.lease_ms = 1000;
    cfg.idle_gc_ms = 60000;
    if (edit) edit(cfg);
    return cfg;
}

// Owns an engine for the test's lifetime and proves destroy clears the pointer.
class Engine {
public:
    explicit Engine(const queen_ephemeral_config &cfg = config()) {
        const int rc = queen_ephemeral_create(&cfg, &e_);
        EXPECT_EQ(rc, QUEEN_EPHEMERAL_OK) << queen_ephemeral_last_error();
    }
    explicit Engine(const std::function<void(queen_ephemeral_config &)> &edit) : Engine(config(edit)) {}
    ~Engine() {
        queen_ephemeral_destroy(&e_);
        EXPECT_EQ(e_, nullptr);
    }
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;
    queen_ephemeral *get() const { return e_; }
    operator queen_ephemeral *() const { return e_; }

private:
    queen_ephemeral *e_ = nullptr;
};

struct Popped {
    int rc = 0;
    int64_t offset = -1;
    uint64_t lease_id = 0;
    uint32_t attempt = 0;
    int64_t lease_expires = 0;
    int64_t pushed = 0;
    std::string payload;
};

inline Popped pop(queen_ephemeral *e, const char *queue, const char *partition, const char *group,
                  int64_t now, uint32_t lease_ms = 0) {
    queen_ephemeral_message m{};
    m.struct_size = sizeof m;
    Popped p;
    p.rc = queen_ephemeral_pop(e, queue, partition, group, lease_ms, now, &m);
    if (p.rc == QUEEN_EPHEMERAL_OK) {
        p.offset = m.offset;
        p.lease_id = m.lease_id;
        p.attempt = m.attempt;
        p.lease_expires = m.lease_expires_unix_ms;
        p.pushed = m.pushed_unix_ms;
        p.payload.assign(reinterpret_cast<const char *>(m.payload), m.payload_len);
    } else {
        EXPECT_EQ(m.payload, nullptr);
    }
    queen_ephemeral_message_free(&m);
    return p;
}

inline int push(queen_ephemeral *e, const char *queue, const char *partition, const std::string &payload,
                int64_t now, int64_t *offset = nullptr) {
    return queen_ephemeral_push(e, queue, partition, payload.data(), payload.size(), now, offset);
}

inline int ack(queen_ephemeral *e, const char *queue, const char *partition, const char *group,
               const Popped &p, int outcome, int64_t now) {
    return queen_ephemeral_ack(e, queue, partition, group, p.offset, p.lease_id, outcome, now);
}

inline std::string stats(queen_ephemeral *e) {
    // The figures can grow between two calls while other threads run: retry
    // with the length the last call asked for until the text fits.
    std::string s(64, '\0');
    for (;;) {
        const int64_t n = queen_ephemeral_stats(e, s.data(), s.size());
        EXPECT_GE(n, 0) << queen_ephemeral_last_error();
        if (n < 0) return {};
        if (static_cast<size_t>(n) < s.size()) {
            EXPECT_EQ(s[static_cast<size_t>(n)], '\0');
            s.resize(static_cast<size_t>(n));
            return s;
        }
        s.assign(static_cast<size_t>(n) + 1, '\0');
    }
}

// One numeric field of the stats JSON; fails the test when it is absent.
inline uint64_t stat(queen_ephemeral *e, const std::string &key) {
    const std::string s = stats(e);
    const std::string needle = "\"" + key + "\":";
    const size_t at = s.find(needle);
    if (at == std::string::npos) {
        ADD_FAILURE() << "no " << key << " in " << s;
        return 0;
    }
    return std::strtoull(s.c_str() + at + needle.size(), nullptr, 10);
}

inline queen_ephemeral_queue_state info(queen_ephemeral *e, const char *queue, int *rc = nullptr) {
    queen_ephemeral_queue_state qi{};
    qi.struct_size = sizeof qi;
    const int r = queen_ephemeral_queue_info(e, queue, &qi);
    if (rc) *rc = r;
    else EXPECT_EQ(r, QUEEN_EPHEMERAL_OK) << queen_ephemeral_last_error();
    return qi;
}

inline queen_ephemeral_sweep_result sweep(queen_ephemeral *e, int64_t now) {
    queen_ephemeral_sweep_result r{};
    r.struct_size = sizeof r;
    EXPECT_EQ(queen_ephemeral_sweep(e, now, &r), QUEEN_EPHEMERAL_OK) << queen_ephemeral_last_error();
    return r;
}

} // namespace eph_test
