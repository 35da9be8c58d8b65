// The C boundary: every exported function checks its arguments, calls one
// method of the engine, catches everything and records the last error. No
// exception and no abort from a bad argument ever reaches the host.
#include "engine.hpp"
#include "queen_ephemeral.h"
#include "queen_sweeper.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <type_traits>

struct queen_ephemeral {
    explicit queen_ephemeral(const queen_ephemeral_config &cfg) : engine(cfg) {}
    ephemeral_engine::Engine engine;
};

namespace {

using ephemeral_engine::Error;

// The two headers describe the same wire types; keep them in lock-step.
static_assert(std::is_same_v<queen_ephemeral_wake_fn, queen_sweeper_wake_fn>);
static_assert(sizeof(queen_ephemeral_sweep_result) == sizeof(queen_sweeper_backstop_result));
static_assert(QUEEN_EPHEMERAL_EINVAL == QUEEN_SWEEPER_EINVAL);
static_assert(QUEEN_EPHEMERAL_ENOMEM == QUEEN_SWEEPER_ENOMEM);
static_assert(QUEEN_EPHEMERAL_EINTERNAL == QUEEN_SWEEPER_EINTERNAL);

// Unix ms up to 2^60 (tens of millions of years): leaves room for now + any
// lease without overflow, and refuses a garbage clock instead of wrapping.
constexpr int64_t kMaxNow = int64_t{1} << 60;

thread_local std::string t_last_error;

int set_error(int status, std::string message) {
    t_last_error = std::move(message);
    return status;
}

int report(const Error &e) {
    if (e.status != QUEEN_EPHEMERAL_OK) t_last_error = e.message;
    return e.status;
}

// Runs body, turning any exception into a status and a last error.
template <class F> int guarded(const char *fn, F &&body) noexcept {
    try {
        return body();
    } catch (const std::bad_alloc &) {
        return set_error(QUEEN_EPHEMERAL_ENOMEM, std::string(fn) + ": out of memory");
    } catch (const std::exception &ex) {
        try {
            return set_error(QUEEN_EPHEMERAL_EINTERNAL, std::string(fn) + ": " + ex.what());
        } catch (...) {
            return QUEEN_EPHEMERAL_EINTERNAL;
        }
    } catch (...) {
        return set_error(QUEEN_EPHEMERAL_EINTERNAL, std::string(fn) + ": unknown failure");
    }
}

// Argument checks return 0 or a status with the last error set.
int check_engine(const char *fn, const queen_ephemeral *e) {
    return e ? 0 : set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": e is NULL");
}

int check_name(const char *fn, const char *arg, const char *name) {
    if (!name) return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": " + arg + " is NULL");
    const size_t n = strnlen(name, QUEEN_EPHEMERAL_MAX_NAME + 1);
    if (n == 0) return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": " + arg + " is empty");
    if (n > QUEEN_EPHEMERAL_MAX_NAME)
        return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": " + arg + " is longer than " +
                                                     std::to_string(QUEEN_EPHEMERAL_MAX_NAME) + " bytes");
    return 0;
}

int check_now(const char *fn, int64_t now) {
    if (now >= 0 && now <= kMaxNow) return 0;
    return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": now_unix_ms " + std::to_string(now) +
                                                 " is outside [0, 2^60]");
}

int check_size(const char *fn, const char *arg, size_t have, size_t need) {
    if (have >= need) return 0;
    return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": " + arg + " is " + std::to_string(have) +
                                                 ", smaller than the ABI 1.0 struct (" + std::to_string(need) + ")");
}

int bs_sweep(void *ctx, int64_t now_unix_ms, queen_sweeper_backstop_result *out) {
    if (out) {
        if (int rc = check_size("backstop sweep", "out->struct_size", out->struct_size,
                                sizeof(queen_sweeper_backstop_result)))
            return rc;
    }
    queen_ephemeral_sweep_result r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    const int rc = queen_ephemeral_sweep(static_cast<queen_ephemeral *>(ctx), now_unix_ms, &r);
    if (rc == QUEEN_EPHEMERAL_OK && out) {
        out->redelivered = r.redelivered;
        out->exhausted = r.exhausted;
        out->ttl_dropped = r.ttl_dropped;
        out->queues_collected = r.queues_collected;
        out->next_expiry_unix_ms = r.next_expiry_unix_ms;
    }
    return rc;
}

void bs_attach_waker(void *ctx, queen_sweeper_wake_fn wake, void *wake_ctx) {
    (void)queen_ephemeral_attach_waker(static_cast<queen_ephemeral *>(ctx), wake, wake_ctx);
}

} // namespace

extern "C" {

QUEEN_EPHEMERAL_API uint32_t queen_ephemeral_abi_version(void) {
    return (uint32_t{QUEEN_EPHEMERAL_ABI_MAJOR} << 16) | QUEEN_EPHEMERAL_ABI_MINOR;
}

QUEEN_EPHEMERAL_API const char *queen_ephemeral_version(void) { return "1.0.0"; }

QUEEN_EPHEMERAL_API void queen_ephemeral_config_init(queen_ephemeral_config *cfg) {
    if (!cfg) return;
    std::memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
    cfg->max_bytes = uint64_t{256} << 20;
    cfg->max_messages = 1000000;
    cfg->queue_max_bytes = 0;
    cfg->queue_max_messages = 0;
    cfg->overflow = QUEEN_EPHEMERAL_OVERFLOW_REJECT;
    cfg->lease_ms = 30000;
    cfg->max_retries = 3;
    cfg->ttl_ms = 0;
    cfg->idle_gc_ms = 300000;
    cfg->max_payload_bytes = uint64_t{1} << 20;
    cfg->max_queues = 65536;
    cfg->max_groups = 1024;
}

QUEEN_EPHEMERAL_API int queen_ephemeral_create(const queen_ephemeral_config *cfg, queen_ephemeral **out) {
    return guarded("queen_ephemeral_create", [&] {
        if (!out) return set_error(QUEEN_EPHEMERAL_EINVAL, "queen_ephemeral_create: out is NULL");
        *out = nullptr;
        queen_ephemeral_config c;
        queen_ephemeral_config_init(&c);
        if (cfg) {
            if (int rc = check_size("queen_ephemeral_create", "cfg->struct_size", cfg->struct_size, sizeof c))
                return rc;
            std::memcpy(&c, cfg, sizeof c);
            c.struct_size = sizeof c;
        }
        if (Error e = ephemeral_engine::validate_config(c); e.status != QUEEN_EPHEMERAL_OK)
            return set_error(e.status, "queen_ephemeral_create: " + e.message);
        *out = new queen_ephemeral(c);
        return QUEEN_EPHEMERAL_OK;
    });
}

QUEEN_EPHEMERAL_API void queen_ephemeral_destroy(queen_ephemeral **e) {
    if (!e || !*e) return;
    delete *e;
    *e = nullptr;
}

QUEEN_EPHEMERAL_API void queen_ephemeral_queue_options_init(queen_ephemeral_queue_options *opts) {
    if (!opts) return;
    opts->struct_size = sizeof *opts;
    opts->max_bytes = QUEEN_EPHEMERAL_INHERIT;
    opts->max_messages = QUEEN_EPHEMERAL_INHERIT;
    opts->overflow = QUEEN_EPHEMERAL_INHERIT;
    opts->lease_ms = QUEEN_EPHEMERAL_INHERIT;
    opts->max_retries = QUEEN_EPHEMERAL_INHERIT;
    opts->ttl_ms = QUEEN_EPHEMERAL_INHERIT;
}

QUEEN_EPHEMERAL_API int queen_ephemeral_declare(queen_ephemeral *e, const char *queue,
                                                const queen_ephemeral_queue_options *opts) {
    static const char fn[] = "queen_ephemeral_declare";
    return guarded(fn, [&] {
        if (int rc = check_engine(fn, e)) return rc;
        if (int rc = check_name(fn, "queue", queue)) return rc;
        Error err = e->engine.declare(queue, opts);
        if (err.status != QUEEN_EPHEMERAL_OK) err.message = std::string(fn) + ": " + err.message;
        return report(err);
    });
}

QUEEN_EPHEMERAL_API int queen_ephemeral_push(queen_ephemeral *e, const char *queue, const char *partition,
                                             const void *payload, size_t len, int64_t now_unix_ms,
                                             int64_t *out_offset) {
    static const char fn[] = "queen_ephemeral_push";
    return guarded(fn, [&] {
        if (int rc = check_engine(fn, e)) return rc;
        if (int rc = check_name(fn, "queue", queue)) return rc;
        if (int rc = check_name(fn, "partition", partition)) return rc;
        if (!payload && len > 0) return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": payload is NULL with len " + std::to_string(len));
        if (len > e->engine.config().max_payload_bytes)
            return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": len " + std::to_string(len) +
                                                         " is above max_payload_bytes (" +
                                                         std::to_string(e->engine.config().max_payload_bytes) + ")");
        if (int rc = check_now(fn, now_unix_ms)) return rc;
        Error err = e->engine.push(queue, partition, payload, len, now_unix_ms, out_offset);
        if (err.status != QUEEN_EPHEMERAL_OK) err.message = std::string(fn) + ": " + err.message;
        return report(err);
    });
}

QUEEN_EPHEMERAL_API int queen_ephemeral_pop(queen_ephemeral *e, const char *queue, const char *partition,
                                            const char *group, uint32_t lease_ms, int64_t now_unix_ms,
                                            queen_ephemeral_message *out) {
    static const char fn[] = "queen_ephemeral_pop";
    return guarded(fn, [&] {
        if (!out) return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": out is NULL");
        if (int rc = check_size(fn, "out->struct_size", out->struct_size, sizeof *out)) return rc;
        out->payload = nullptr;
        out->payload_len = 0;
        if (int rc = check_engine(fn, e)) return rc;
        if (int rc = check_name(fn, "queue", queue)) return rc;
        if (int rc = check_name(fn, "partition", partition)) return rc;
        if (int rc = check_name(fn, "group", group)) return rc;
        if (int rc = check_now(fn, now_unix_ms)) return rc;
        ephemeral_engine::PopResult r;
        Error err = e->engine.pop(queue, partition, group, lease_ms, now_unix_ms, r);
        if (err.status != QUEEN_EPHEMERAL_OK) {
            err.message = std::string(fn) + ": " + err.message;
            return report(err);
        }
        out->offset = r.offset;
        out->lease_id = r.lease_id;
        out->attempt = r.attempt;
        out->lease_expires_unix_ms = r.lease_expires;
        out->pushed_unix_ms = r.pushed_ms;
        out->payload = r.payload;
        out->payload_len = r.len;
        return QUEEN_EPHEMERAL_OK;
    });
}

QUEEN_EPHEMERAL_API int queen_ephemeral_ack(queen_ephemeral *e, const char *queue, const char *partition,
                                            const char *group, int64_t offset, uint64_t lease_id, int outcome,
                                            int64_t now_unix_ms) {
    static const char fn[] = "queen_ephemeral_ack";
    return guarded(fn, [&] {
        if (int rc = check_engine(fn, e)) return rc;
        if (int rc = check_name(fn, "queue", queue)) return rc;
        if (int rc = check_name(fn, "partition", partition)) return rc;
        if (int rc = check_name(fn, "group", group)) return rc;
        if (offset < -1)
            return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": offset " + std::to_string(offset) +
                                                         " is negative (use -1 to ack by lease_id)");
        if (offset == -1 && lease_id == 0)
            return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": offset is -1 and lease_id is 0: "
                                                                       "give one of them");
        if (outcome != QUEEN_EPHEMERAL_ACK_COMPLETED && outcome != QUEEN_EPHEMERAL_ACK_RETRY &&
            outcome != QUEEN_EPHEMERAL_ACK_FAILED)
            return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": outcome " + std::to_string(outcome) +
                                                         " is not QUEEN_EPHEMERAL_ACK_COMPLETED, _RETRY or _FAILED");
        if (int rc = check_now(fn, now_unix_ms)) return rc;
        Error err = e->engine.ack(queue, partition, group, offset, lease_id, outcome, now_unix_ms);
        if (err.status != QUEEN_EPHEMERAL_OK) err.message = std::string(fn) + ": " + err.message;
        return report(err);
    });
}

QUEEN_EPHEMERAL_API int queen_ephemeral_sweep(queen_ephemeral *e, int64_t now_unix_ms,
                                              queen_ephemeral_sweep_result *out) {
    static const char fn[] = "queen_ephemeral_sweep";
    return guarded(fn, [&] {
        if (int rc = check_engine(fn, e)) return rc;
        if (out) {
            if (int rc = check_size(fn, "out->struct_size", out->struct_size, sizeof *out)) return rc;
        }
        if (int rc = check_now(fn, now_unix_ms)) return rc;
        const ephemeral_engine::SweepResult r = e->engine.sweep(now_unix_ms);
        if (out) {
            out->redelivered = r.redelivered;
            out->exhausted = r.exhausted;
            out->ttl_dropped = r.ttl_dropped;
            out->queues_collected = r.collected;
            out->next_expiry_unix_ms = r.next_expiry;
        }
        return QUEEN_EPHEMERAL_OK;
    });
}

QUEEN_EPHEMERAL_API int queen_ephemeral_attach_waker(queen_ephemeral *e, queen_ephemeral_wake_fn wake,
                                                     void *wake_ctx) {
    static const char fn[] = "queen_ephemeral_attach_waker";
    return guarded(fn, [&] {
        if (int rc = check_engine(fn, e)) return rc;
        e->engine.attach_waker(wake, wake_ctx);
        return QUEEN_EPHEMERAL_OK;
    });
}

QUEEN_EPHEMERAL_API const char *queen_ephemeral_last_error(void) { return t_last_error.c_str(); }

QUEEN_EPHEMERAL_API int64_t queen_ephemeral_stats(queen_ephemeral *e, char *buf, size_t cap) {
    static const char fn[] = "queen_ephemeral_stats";
    int64_t needed = 0;
    const int rc = guarded(fn, [&] {
        if (int rc = check_engine(fn, e)) return rc;
        if (!buf && cap > 0) return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": buf is NULL with cap > 0");
        const std::string json = e->engine.stats_json();
        needed = static_cast<int64_t>(json.size());
        if (cap > 0) {
            const size_t n = json.size() < cap ? json.size() : cap - 1;
            std::memcpy(buf, json.data(), n);
            buf[n] = '\0';
        }
        return QUEEN_EPHEMERAL_OK;
    });
    return rc == QUEEN_EPHEMERAL_OK ? needed : rc;
}

QUEEN_EPHEMERAL_API int queen_ephemeral_queue_info(queen_ephemeral *e, const char *queue,
                                                   queen_ephemeral_queue_state *out) {
    static const char fn[] = "queen_ephemeral_queue_info";
    return guarded(fn, [&] {
        if (int rc = check_engine(fn, e)) return rc;
        if (int rc = check_name(fn, "queue", queue)) return rc;
        if (!out) return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": out is NULL");
        if (int rc = check_size(fn, "out->struct_size", out->struct_size, sizeof *out)) return rc;
        ephemeral_engine::QueueInfo info;
        Error err = e->engine.queue_info(queue, info);
        if (err.status != QUEEN_EPHEMERAL_OK) {
            err.message = std::string(fn) + ": " + err.message;
            return report(err);
        }
        out->declared = info.declared ? 1 : 0;
        out->partitions = info.partitions;
        out->groups = info.groups;
        out->messages = info.messages;
        out->bytes = info.bytes;
        out->in_flight = info.in_flight;
        out->next_expiry_unix_ms = info.next_expiry;
        return QUEEN_EPHEMERAL_OK;
    });
}

QUEEN_EPHEMERAL_API void queen_ephemeral_message_free(queen_ephemeral_message *msg) {
    if (!msg) return;
    std::free(msg->payload);
    msg->payload = nullptr;
    msg->payload_len = 0;
}

QUEEN_EPHEMERAL_API int queen_ephemeral_backstop(queen_ephemeral *e, void *out_provider, size_t out_size) {
    static const char fn[] = "queen_ephemeral_backstop";
    return guarded(fn, [&] {
        if (int rc = check_engine(fn, e)) return rc;
        if (!out_provider) return set_error(QUEEN_EPHEMERAL_EINVAL, std::string(fn) + ": out_provider is NULL");
        if (int rc = check_size(fn, "out_size", out_size, sizeof(queen_sweeper_backstop))) return rc;
        queen_sweeper_backstop p;
        std::memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        p.ctx = e;
        p.sweep = bs_sweep;
        p.attach_waker = bs_attach_waker;
        std::memcpy(out_provider, &p, sizeof p);
        return QUEEN_EPHEMERAL_OK;
    });
}

} // extern "C"
