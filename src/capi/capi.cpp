// The C ABI shim: every exported function is a guard (check arguments, catch
// everything, set the last error) around one call into C++. No exception and no
// abort from a bad argument ever crosses into the host.
#include <cstring>
#include <new>

#include "base/last_error.hpp"
#include "base/reentry.hpp"
#include "config/config.hpp"
#include "queen_sweeper.h"
#include "sweeper/sweeper.hpp"

using qsw::set_last_error;
using qsw::Sweeper;

struct queen_sweeper {
    Sweeper impl;
    explicit queen_sweeper(qsw::Config c) : impl(std::move(c)) {}
};

namespace {

template <class F> int guarded(const char *fn, F &&f) {
    try {
        return f();
    } catch (const std::bad_alloc &) {
        set_last_error(std::string(fn) + ": out of memory");
        return QUEEN_SWEEPER_ENOMEM;
    } catch (const std::exception &e) {
        set_last_error(std::string(fn) + ": internal error: " + e.what());
        return QUEEN_SWEEPER_EINTERNAL;
    } catch (...) {
        set_last_error(std::string(fn) + ": internal error");
        return QUEEN_SWEEPER_EINTERNAL;
    }
}

// The lifecycle calls refuse from inside a host callback: they would wait for the very
// thread that is calling them (the loop) or for a lock it holds (start's).
int from_callback(const char *fn) {
    set_last_error(std::string(fn) +
                   ": called from inside a queen_sweeper callback (on_log, on_fired or the backstop); "
                   "lifecycle calls must come from a host thread");
    return QUEEN_SWEEPER_ESTATE;
}

int null_handle(const char *fn) {
    set_last_error(std::string(fn) + ": sw is NULL");
    return QUEEN_SWEEPER_EINVAL;
}

int64_t render(const std::string &text, char *buf, size_t cap) {
    if (cap > 0) {
        const size_t n = std::min(text.size(), cap - 1);
        std::memcpy(buf, text.data(), n);
        buf[n] = '\0';
    }
    return static_cast<int64_t>(text.size());
}

}  // namespace

extern "C" {

QUEEN_SWEEPER_API uint32_t queen_sweeper_abi_version(void) {
    return (static_cast<uint32_t>(QUEEN_SWEEPER_ABI_MAJOR) << 16) | QUEEN_SWEEPER_ABI_MINOR;
}

QUEEN_SWEEPER_API const char *queen_sweeper_version(void) { return QUEEN_SWEEPER_VERSION_STRING; }

QUEEN_SWEEPER_API const char *queen_sweeper_last_error(void) { return qsw::last_error_cstr(); }

QUEEN_SWEEPER_API int queen_sweeper_create(const char *config_json, queen_sweeper **out) {
    if (!out) {
        set_last_error("queen_sweeper_create: out is NULL");
        return QUEEN_SWEEPER_EINVAL;
    }
    *out = nullptr;
    return guarded("queen_sweeper_create", [&] {
        qsw::Config cfg;
        std::string err;
        if (!qsw::parse_config(config_json, cfg, err)) {
            set_last_error("queen_sweeper_create: " + err);
            return QUEEN_SWEEPER_EINVAL;
        }
        *out = new queen_sweeper(std::move(cfg));
        return QUEEN_SWEEPER_OK;
    });
}

QUEEN_SWEEPER_API int queen_sweeper_set_log_callback(queen_sweeper *sw, queen_sweeper_log_fn fn, void *user) {
    if (!sw) return null_handle("queen_sweeper_set_log_callback");
    if (qsw::in_host_callback()) return from_callback("queen_sweeper_set_log_callback");
    return guarded("queen_sweeper_set_log_callback", [&] { return sw->impl.set_log_callback(fn, user); });
}

QUEEN_SWEEPER_API int queen_sweeper_set_fired_callback(queen_sweeper *sw, queen_sweeper_fired_fn fn, void *user) {
    if (!sw) return null_handle("queen_sweeper_set_fired_callback");
    if (qsw::in_host_callback()) return from_callback("queen_sweeper_set_fired_callback");
    return guarded("queen_sweeper_set_fired_callback", [&] { return sw->impl.set_fired_callback(fn, user); });
}

QUEEN_SWEEPER_API int queen_sweeper_set_backstop(queen_sweeper *sw, const queen_sweeper_backstop *provider) {
    if (!sw) return null_handle("queen_sweeper_set_backstop");
    if (qsw::in_host_callback()) return from_callback("queen_sweeper_set_backstop");
    return guarded("queen_sweeper_set_backstop", [&] { return sw->impl.set_backstop(provider); });
}

QUEEN_SWEEPER_API int queen_sweeper_start(queen_sweeper *sw) {
    if (!sw) return null_handle("queen_sweeper_start");
    if (qsw::in_host_callback()) return from_callback("queen_sweeper_start");
    return guarded("queen_sweeper_start", [&] { return sw->impl.start(); });
}

QUEEN_SWEEPER_API int queen_sweeper_stop(queen_sweeper *sw, uint32_t timeout_ms) {
    if (!sw) return null_handle("queen_sweeper_stop");
    if (qsw::in_host_callback()) return from_callback("queen_sweeper_stop");
    return guarded("queen_sweeper_stop", [&] { return sw->impl.stop(timeout_ms); });
}

QUEEN_SWEEPER_API void queen_sweeper_destroy(queen_sweeper **sw) {
    if (!sw || !*sw) return;
    if (qsw::in_host_callback()) {
        // Destroying the sweeper whose loop is running this callback cannot be done from
        // here; the call is ignored and *sw left as it is (documented in the header).
        from_callback("queen_sweeper_destroy");
        return;
    }
    try {
        (*sw)->impl.stop(5000);
    } catch (...) {
    }
    delete *sw;
    *sw = nullptr;
}

QUEEN_SWEEPER_API void queen_sweeper_wake(queen_sweeper *sw, int64_t deliver_at_unix_ms) {
    if (sw) sw->impl.wake(deliver_at_unix_ms);
}

QUEEN_SWEEPER_API int64_t queen_sweeper_stats(queen_sweeper *sw, char *buf, size_t cap) {
    if (!sw) return null_handle("queen_sweeper_stats");
    if (!buf && cap > 0) {
        set_last_error("queen_sweeper_stats: buf is NULL but cap is " + std::to_string(cap));
        return QUEEN_SWEEPER_EINVAL;
    }
    try {
        return render(sw->impl.stats().to_json().dump(), buf, cap);
    } catch (const std::bad_alloc &) {
        set_last_error("queen_sweeper_stats: out of memory");
        return QUEEN_SWEEPER_ENOMEM;
    } catch (const std::exception &e) {
        set_last_error(std::string("queen_sweeper_stats: internal error: ") + e.what());
        return QUEEN_SWEEPER_EINTERNAL;
    }
}

QUEEN_SWEEPER_API int64_t queen_sweeper_metrics(queen_sweeper *sw, char *buf, size_t cap) {
    if (!sw) return null_handle("queen_sweeper_metrics");
    if (!buf && cap > 0) {
        set_last_error("queen_sweeper_metrics: buf is NULL but cap is " + std::to_string(cap));
        return QUEEN_SWEEPER_EINVAL;
    }
    try {
        return render(sw->impl.stats().to_prometheus(), buf, cap);
    } catch (const std::bad_alloc &) {
        set_last_error("queen_sweeper_metrics: out of memory");
        return QUEEN_SWEEPER_ENOMEM;
    } catch (const std::exception &e) {
        set_last_error(std::string("queen_sweeper_metrics: internal error: ") + e.what());
        return QUEEN_SWEEPER_EINTERNAL;
    }
}

QUEEN_SWEEPER_API int queen_sweeper_wait_ready(queen_sweeper *sw, uint32_t timeout_ms) {
    if (!sw) return null_handle("queen_sweeper_wait_ready");
    if (qsw::in_host_callback()) return from_callback("queen_sweeper_wait_ready");
    return guarded("queen_sweeper_wait_ready", [&] { return sw->impl.wait_ready(timeout_ms); });
}

QUEEN_SWEEPER_API const char *queen_sweeper_status_name(int status) {
    switch (status) {
    case QUEEN_SWEEPER_OK: return "QUEEN_SWEEPER_OK";
    case QUEEN_SWEEPER_EINVAL: return "QUEEN_SWEEPER_EINVAL";
    case QUEEN_SWEEPER_ENOMEM: return "QUEEN_SWEEPER_ENOMEM";
    case QUEEN_SWEEPER_ESTATE: return "QUEEN_SWEEPER_ESTATE";
    case QUEEN_SWEEPER_ETIMEDOUT: return "QUEEN_SWEEPER_ETIMEDOUT";
    case QUEEN_SWEEPER_ECORRUPT: return "QUEEN_SWEEPER_ECORRUPT";
    case QUEEN_SWEEPER_EVERSION: return "QUEEN_SWEEPER_EVERSION";
    case QUEEN_SWEEPER_EINTERNAL: return "QUEEN_SWEEPER_EINTERNAL";
    default: return "QUEEN_SWEEPER_UNKNOWN";
    }
}

static const queen_sweeper_api kApiV1 = {
    sizeof(queen_sweeper_api),
    QUEEN_SWEEPER_ABI_MAJOR,
    QUEEN_SWEEPER_ABI_MINOR,
    queen_sweeper_abi_version,
    queen_sweeper_version,
    queen_sweeper_create,
    queen_sweeper_set_log_callback,
    queen_sweeper_set_fired_callback,
    queen_sweeper_set_backstop,
    queen_sweeper_start,
    queen_sweeper_stop,
    queen_sweeper_destroy,
    queen_sweeper_wake,
    queen_sweeper_last_error,
    queen_sweeper_stats,
    queen_sweeper_metrics,
    queen_sweeper_segment_decode,
    queen_sweeper_segment_count,
    queen_sweeper_segment_frame,
    queen_sweeper_segment_free,
    queen_sweeper_txn_hash,
    queen_sweeper_wait_ready,
    queen_sweeper_status_name,
};

QUEEN_SWEEPER_API const queen_sweeper_api *queen_sweeper_get_api(uint32_t abi_major) {
    if (abi_major != QUEEN_SWEEPER_ABI_MAJOR) {
        set_last_error("queen_sweeper_get_api: this library implements ABI " + std::to_string(QUEEN_SWEEPER_ABI_MAJOR) +
                       "." + std::to_string(QUEEN_SWEEPER_ABI_MINOR) + ", the host asked for major " +
                       std::to_string(abi_major));
        return nullptr;
    }
    return &kApiV1;
}

}  // extern "C"
