/*
 * queen_sweeper.h - the public C ABI of libqueen_sweeper.so (ABI v1.1).
 *
 * The background sweeper of a PostgreSQL-backed message broker: it fires due
 * timers out of queen.log_timers into the log, prunes expired queen.kv rows,
 * and runs the once-a-second backstop of an in-RAM ephemeral queue engine.
 * A host loads this library (directly or with dlopen), creates one sweeper per
 * process, starts it, rings queen_sweeper_wake() after every commit that
 * scheduled a timer, reads stats, and stops it.
 *
 * This header is the contract: what is not declared here is not API. It is
 * C99, includes only <stddef.h> and <stdint.h>, and compiles on its own with
 * -std=c99 -pedantic -Werror.
 *
 * Sections, in order: version, types, lifecycle, control, introspection,
 * memory and codec, plugin entry.
 *
 * Conventions:
 *   - Every function returning int returns QUEEN_SWEEPER_OK (0) or a negative
 *     QUEEN_SWEEPER_E* code. The human-readable detail of the last failure on
 *     the calling thread is queen_sweeper_last_error().
 *   - No C++ exception and no abort() ever crosses this boundary because of a
 *     bad argument.
 *   - Whatever the library allocates, the library frees.
 *   - Re-entrancy: from inside any of the library's callbacks (the log callback,
 *     on_fired, a backstop provider's sweep or attach_waker), the lifecycle calls
 *     (set_*_callback, set_backstop, start, stop, wait_ready) return
 *     QUEEN_SWEEPER_ESTATE at once with last_error saying why, and destroy is
 *     ignored (leaving *sw as it was): they would otherwise wait for the thread
 *     that is running the callback. wake, stats, metrics, last_error and the
 *     codec functions are safe there. Never deadlocks, never blocks.
 *   - wake accepts every int64: instants before the epoch mean "due now".
 */
#ifndef QUEEN_SWEEPER_H
#define QUEEN_SWEEPER_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define QUEEN_SWEEPER_API
#elif defined(__GNUC__) || defined(__clang__)
#define QUEEN_SWEEPER_API __attribute__((visibility("default")))
#else
#define QUEEN_SWEEPER_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * 1. Version
 * ==================================================================== */

/** ABI major: a host built against another major must refuse this library. */
#define QUEEN_SWEEPER_ABI_MAJOR 1
/** ABI minor: grows when functions or trailing struct fields are appended. */
#define QUEEN_SWEEPER_ABI_MINOR 1

/** Release version of the library this header ships with (queen_sweeper_version() at run time). */
#define QUEEN_SWEEPER_VERSION_MAJOR 1
#define QUEEN_SWEEPER_VERSION_MINOR 1
#define QUEEN_SWEEPER_VERSION_PATCH 0

/**
 * The ABI version of the loaded library, packed as (major << 16) | minor.
 *
 * Returns: the packed version; never fails.
 * Thread safety: any thread, any time.
 * Since: 1.0
 */
QUEEN_SWEEPER_API uint32_t queen_sweeper_abi_version(void);

/**
 * The library's release version as a static NUL-terminated string such as
 * "1.0.0". Owned by the library; never freed by the caller.
 *
 * Thread safety: any thread, any time.
 * Since: 1.0
 */
QUEEN_SWEEPER_API const char *queen_sweeper_version(void);

/* ======================================================================
 * 2. Types
 * ==================================================================== */

/** Success. */
#define QUEEN_SWEEPER_OK 0
/** A bad argument or configuration; the last error names what is wrong. */
#define QUEEN_SWEEPER_EINVAL (-22)
/** Out of memory. */
#define QUEEN_SWEEPER_ENOMEM (-12)
/** The call is not valid in the sweeper's current state (e.g. a setter after start). */
#define QUEEN_SWEEPER_ESTATE (-16)
/** queen_sweeper_stop() could not finish within its timeout. */
#define QUEEN_SWEEPER_ETIMEDOUT (-110)
/** A segment blob is corrupt or truncated. */
#define QUEEN_SWEEPER_ECORRUPT (-74)
/** A different ABI major was asked for. */
#define QUEEN_SWEEPER_EVERSION (-95)
/** An unexpected internal failure; the last error says what. */
#define QUEEN_SWEEPER_EINTERNAL (-5)

/** The opaque sweeper handle: one per host process is the intended use. */
typedef struct queen_sweeper queen_sweeper;

/** Log levels passed to the log callback. */
#define QUEEN_SWEEPER_LOG_ERROR 0
#define QUEEN_SWEEPER_LOG_WARN 1
#define QUEEN_SWEEPER_LOG_INFO 2
#define QUEEN_SWEEPER_LOG_DEBUG 3

/**
 * Log callback. Called on the sweeper's own thread (or, for messages about
 * start/stop, on the thread calling those). `message` is NUL-terminated and
 * valid only during the call. It never carries a timer key, a KV key, a
 * payload or a password. The callback must not call queen_sweeper_stop() or
 * queen_sweeper_destroy() on the same sweeper.
 */
typedef void (*queen_sweeper_log_fn)(void *user, int level, const char *message);

/**
 * Called after each fire transaction commits, once per fired segment.
 * `tenant` is the tenant uuid in text form; `queue` and `partition` are the
 * names; `count` is the number of messages appended; `base_offset` is the log
 * offset of the first of them. All strings are valid only during the call.
 * Called on the sweeper's thread: keep it short (wake parked consumers).
 */
typedef void (*queen_sweeper_fired_fn)(void *user, const char *tenant, const char *queue,
                                       const char *partition, uint32_t count,
                                       int64_t base_offset);

/**
 * A wake entry point as handed to a backstop provider: ring the sweeper for
 * an instant (unix milliseconds). Lock-free, never blocks, never fails.
 */
typedef void (*queen_sweeper_wake_fn)(void *wake_ctx, int64_t at_unix_ms);

/** What one backstop sweep did. The provider fills it; struct_size is set by the caller. */
typedef struct queen_sweeper_backstop_result {
    size_t struct_size;          /**< sizeof(queen_sweeper_backstop_result) as the caller knows it */
    uint64_t redelivered;        /**< leases that expired and were made visible again */
    uint64_t exhausted;          /**< messages past their retry limit */
    uint64_t ttl_dropped;        /**< unconsumed messages dropped for their ttl */
    uint64_t queues_collected;   /**< idle implicit queues collected */
    int64_t next_expiry_unix_ms; /**< nearest lease or ttl instant seen, or -1 for none */
} queen_sweeper_backstop_result;

/**
 * A backstop provider: the in-RAM ephemeral queue engine behind a small
 * interface. The sweeper copies this struct at queen_sweeper_set_backstop().
 *
 * sweep: required. Called on the sweeper's thread once a second (never more
 *   often, whatever instants the engine reports: its own touch path honours
 *   those for whoever touches a queue), with the current unix time in ms;
 *   fills `out`; returns 0 or a negative code (the sweeper logs a failure and
 *   tries again at the next pass). It must not block on a database: the
 *   backstop runs while the database is down.
 * attach_waker: optional. Called once at start with the sweeper's wake entry
 *   point, which the engine may call when it arms a lease or a ttl (the
 *   sweeper counts those calls, hint_wakes_total in stats, and runs no extra
 *   pass for them); called again with wake == NULL at stop, after which the
 *   engine must not call the previous one.
 * ctx is owned by the host (or the engine); the sweeper never frees it.
 */
typedef struct queen_sweeper_backstop {
    size_t struct_size; /**< sizeof(queen_sweeper_backstop) as the host knows it */
    void *ctx;
    int (*sweep)(void *ctx, int64_t now_unix_ms, queen_sweeper_backstop_result *out);
    void (*attach_waker)(void *ctx, queen_sweeper_wake_fn wake, void *wake_ctx);
} queen_sweeper_backstop;

/** One frame of a decoded segment; pointers are valid while the segment lives. */
typedef struct queen_sweeper_frame {
    size_t struct_size;      /**< set by the caller to sizeof(queen_sweeper_frame) */
    uint8_t flags;           /**< 1 trace id present, 2 producer sub present, 4 encrypted */
    uint8_t message_id[16];  /**< uuid bytes */
    uint8_t trace_id[16];    /**< zero unless flags & 1 */
    const char *txn;         /**< not NUL-terminated; txn_len bytes */
    size_t txn_len;
    const char *producer_sub; /**< NULL unless flags & 2; not NUL-terminated */
    size_t producer_sub_len;
    const uint8_t *payload;  /**< the rest of the frame body */
    size_t payload_len;
} queen_sweeper_frame;

/** A decoded segment (opaque). */
typedef struct queen_sweeper_segment queen_sweeper_segment;

/* ======================================================================
 * 3. Lifecycle
 * ==================================================================== */

/**
 * Create a sweeper from a JSON configuration object.
 *
 * config_json: NUL-terminated JSON object, borrowed for the call; NULL or ""
 *   means "{}". Keys are the knob names in lower case without the QUEEN_
 *   prefix (sweeper_min_sleep_ms, kv_expire_batch, ...) plus conninfo,
 *   broker_id, pool_size, apply_schema, read_env, log_level and the lane slot
 *   counts. Precedence: JSON, then QUEEN_* environment (unless read_env is
 *   false), then defaults. "log_stderr" (default true): while no log callback
 *   is set, warnings and errors are written to stderr, one line each.
 *   Unknown variables are warned about here (while read_env is true), and
 *   listed in the stats as "config_warnings": every QUEEN_SWEEPER_* name that
 *   is not a knob (except QUEEN_SWEEPER_LIBRARY, _LIB_DIR and _BUILD_DIR, read
 *   by the bindings), and any other QUEEN_* name within two edits of a knob's
 *   variable; QUEEN_EPHEMERAL_* and QUEEN_TEST_* are never reported. At create
 *   no callback can be set yet: they reach stderr, and a callback set before
 *   start receives them again at start.
 * out: receives the new handle, owned by the caller until
 *   queen_sweeper_destroy(); set to NULL on failure.
 *
 * Returns: QUEEN_SWEEPER_OK; QUEEN_SWEEPER_EINVAL for invalid JSON, an
 *   unknown key, a wrong type, an out-of-range value or a malformed boolean
 *   (the last error names the key, or the environment variable, and what was
 *   wrong); QUEEN_SWEEPER_ENOMEM.
 * Thread safety: any thread.
 * Since: 1.0
 */
QUEEN_SWEEPER_API int queen_sweeper_create(const char *config_json, queen_sweeper **out);

/**
 * Set the log callback (before start). NULL fn removes it. Messages below the
 * configured log_level are not delivered. Without a callback, warnings and
 * errors go to stderr unless "log_stderr" is false.
 *
 * Returns: OK; EINVAL if sw is NULL; ESTATE after start.
 * Thread safety: not concurrently with other calls on the same sweeper.
 * Since: 1.0
 */
QUEEN_SWEEPER_API int queen_sweeper_set_log_callback(queen_sweeper *sw, queen_sweeper_log_fn fn,
                                                     void *user);

/**
 * Set the callback run after every fire commit (before start). NULL removes it.
 *
 * Returns: OK; EINVAL if sw is NULL; ESTATE after start.
 * Thread safety: not concurrently with other calls on the same sweeper.
 * Since: 1.0
 */
QUEEN_SWEEPER_API int queen_sweeper_set_fired_callback(queen_sweeper *sw,
                                                       queen_sweeper_fired_fn fn, void *user);

/**
 * Set the ephemeral backstop provider (before start). The struct is copied;
 * its ctx stays owned by the caller and must outlive the sweeper's stop.
 * NULL provider removes it.
 *
 * Returns: OK; EINVAL if sw is NULL, struct_size is too small or sweep is
 *   NULL; ESTATE after start.
 * Thread safety: not concurrently with other calls on the same sweeper.
 * Since: 1.0
 */
QUEEN_SWEEPER_API int queen_sweeper_set_backstop(queen_sweeper *sw,
                                                 const queen_sweeper_backstop *provider);

/**
 * Start the sweeper: spawns its loop thread and returns at once. A database
 * that is down is not a start failure: the sweeper retries with backoff and
 * says so in stats and logs. With "sweeper": false (or QUEEN_SWEEPER=false)
 * nothing is spawned and the choice is logged once.
 *
 * Returns: OK; EINVAL if sw is NULL; ESTATE if already started or stopped;
 *   EINTERNAL if the thread or loop could not be created.
 * Thread safety: not concurrently with stop/destroy on the same sweeper.
 * Since: 1.0
 */
QUEEN_SWEEPER_API int queen_sweeper_start(queen_sweeper *sw);

/**
 * Stop gracefully: finish or roll back the transaction in flight, release
 * every claim this sweeper still holds (so no other broker waits out a
 * lease), close every handle and join the thread. Idempotent; a stop before
 * start is a no-op that returns OK.
 *
 * timeout_ms: upper bound for the graceful part; past it in-flight queries
 *   are cancelled and connections closed without releasing claims.
 * Returns: OK; EINVAL if sw is NULL; ETIMEDOUT if the graceful part did not
 *   finish in time (the sweeper is still fully stopped and joined; the call
 *   returns within timeout_ms + 1 s whatever the server does, a frozen server
 *   included); ESTATE if called from inside one of the library's callbacks.
 * Thread safety: any thread except the sweeper's own callbacks (ESTATE there);
 *   concurrent stops are serialised.
 * Since: 1.0
 */
QUEEN_SWEEPER_API int queen_sweeper_stop(queen_sweeper *sw, uint32_t timeout_ms);

/**
 * Destroy a sweeper, stopping it first if needed (with a 5 s timeout), and set
 * *sw to NULL. NULL and a pointer to NULL are accepted and do nothing.
 *
 * Thread safety: no other call on the same sweeper may run concurrently.
 *   From inside one of the library's callbacks the call is ignored.
 * Since: 1.0
 */
QUEEN_SWEEPER_API void queen_sweeper_destroy(queen_sweeper **sw);

/* ======================================================================
 * 4. Control
 * ==================================================================== */

/**
 * Tell the sweeper a timer now exists for deliver_at_unix_ms. Call it AFTER
 * the transaction that scheduled the timer commits, never before: a wake for
 * a transaction that rolls back teaches the loop that work exists which does
 * not. Only an instant earlier than the one already promised rings the loop,
 * so a million timers for next week is one signal. A wake is losable by
 * design: the sleep ceiling is its safety net.
 *
 * Never fails, never blocks, lock-free; harmless on a NULL, not-yet-started
 * or stopped sweeper.
 * Thread safety: any thread, concurrently with everything but destroy.
 * Since: 1.0
 */
QUEEN_SWEEPER_API void queen_sweeper_wake(queen_sweeper *sw, int64_t deliver_at_unix_ms);

/* ======================================================================
 * 5. Introspection
 * ==================================================================== */

/**
 * The last error on the calling thread, as a NUL-terminated string owned by
 * the library and valid until the next failing call on this thread. Never
 * NULL ("" when there is none).
 *
 * Thread safety: thread-local.
 * Since: 1.0
 */
QUEEN_SWEEPER_API const char *queen_sweeper_last_error(void);

/**
 * A JSON snapshot of the sweeper's state and counters, snprintf-style: writes
 * at most cap bytes including the terminating NUL (a too-small buffer gets a
 * terminated prefix) and returns the length the full text needs, excluding
 * the NUL. buf may be NULL when cap is 0.
 *
 * Returns: the needed length (>= 0), or EINVAL if sw is NULL or buf is NULL
 *   with cap > 0.
 * Thread safety: any thread, concurrently with everything but destroy.
 * Since: 1.0
 */
QUEEN_SWEEPER_API int64_t queen_sweeper_stats(queen_sweeper *sw, char *buf, size_t cap);

/**
 * The same figures as Prometheus text exposition, with the same snprintf
 * semantics and return values as queen_sweeper_stats(). Names start with
 * queen_sweeper_, are in base units (_seconds, _bytes), counters end in
 * _total; queen_sweeper_healthy (0/1), queen_sweeper_ready and
 * queen_sweeper_errors_total{phase,class} are the ones to alert on;
 * queen_sweeper_build_info{version,abi} names the library.
 *
 * Thread safety: any thread, concurrently with everything but destroy.
 * Since: 1.0
 */
QUEEN_SWEEPER_API int64_t queen_sweeper_metrics(queen_sweeper *sw, char *buf, size_t cap);

/**
 * Wait until the sweeper is ready: the schema step succeeded (the apply when
 * apply_schema is true, skipped when the database already records this
 * library's schema version; otherwise a check of the recorded version) and a
 * first probe of the timers completed. Readiness is latched: once ready, the
 * call returns OK at once. Whether the sweeper works now is "healthy" in the
 * stats and queen_sweeper_healthy in the metrics. The stats carry "ready" and,
 * while not ready, "ready_reason".
 *
 * sw: the sweeper, started.
 * timeout_ms: the longest wait; 0 only looks.
 * Returns: OK when ready; ETIMEDOUT when not ready within the time (the last
 *   error carries the reason, e.g. a failed schema apply); ESTATE when the
 *   sweeper is not started, disabled by configuration, stopping or stopped;
 *   EINVAL if sw is NULL.
 * Thread safety: any thread, concurrently with everything but destroy; a stop
 *   on another thread ends the wait with ESTATE.
 * Since: 1.1
 */
QUEEN_SWEEPER_API int queen_sweeper_wait_ready(queen_sweeper *sw, uint32_t timeout_ms);

/**
 * The symbolic name of a status code, as a static string: "QUEEN_SWEEPER_OK",
 * "QUEEN_SWEEPER_ETIMEDOUT", ...; "QUEEN_SWEEPER_UNKNOWN" for a value that is
 * not one of this header's codes. Never NULL, never freed by the caller.
 *
 * Thread safety: any thread, any time.
 * Since: 1.1
 */
QUEEN_SWEEPER_API const char *queen_sweeper_status_name(int status);

/* ======================================================================
 * 6. Memory and codec
 * ==================================================================== */

/**
 * Decode a packed segment blob (zstd of concatenated frames, as stored in
 * queen.log_segments.blob) into its frames.
 *
 * blob, len: borrowed for the call; the result keeps its own copy.
 * out: receives the decoded segment, freed with queen_sweeper_segment_free();
 *   set to NULL on failure.
 * Returns: OK; EINVAL for NULL arguments; ECORRUPT for a corrupt or truncated
 *   blob (the last error says where); ENOMEM.
 * Thread safety: any thread.
 * Since: 1.0
 */
QUEEN_SWEEPER_API int queen_sweeper_segment_decode(const uint8_t *blob, size_t len,
                                                   queen_sweeper_segment **out);

/**
 * Number of frames in a decoded segment (0 for NULL).
 * Thread safety: any thread; the segment is immutable.
 * Since: 1.0
 */
QUEEN_SWEEPER_API size_t queen_sweeper_segment_count(const queen_sweeper_segment *seg);

/**
 * Read frame `index` of a decoded segment. out->struct_size must be set by
 * the caller; pointers in *out stay valid until the segment is freed.
 *
 * Returns: OK; EINVAL for NULL arguments, a too-small struct_size or an index
 *   out of range.
 * Thread safety: any thread; the segment is immutable.
 * Since: 1.0
 */
QUEEN_SWEEPER_API int queen_sweeper_segment_frame(const queen_sweeper_segment *seg, size_t index,
                                                  queen_sweeper_frame *out);

/**
 * Free a decoded segment and set *seg to NULL. NULL-safe.
 * Since: 1.0
 */
QUEEN_SWEEPER_API void queen_sweeper_segment_free(queen_sweeper_segment **seg);

/**
 * The transaction-id hash stored in queen.log_txns.hashes: xxh3-128 of the
 * txn bytes, 16 bytes big-endian (high 64 bits first), written to out16.
 *
 * Returns: OK; EINVAL if out16 is NULL or txn is NULL with len > 0.
 * Thread safety: any thread.
 * Since: 1.0
 */
QUEEN_SWEEPER_API int queen_sweeper_txn_hash(const char *txn, size_t len, uint8_t out16[16]);

/* ======================================================================
 * 7. Plugin entry
 * ==================================================================== */

/**
 * The whole ABI as one table, for hosts that resolve a single symbol with
 * dlsym. The table starts with its own size and only ever grows at the end:
 * a host built against an older minor reads only the fields it knows.
 */
typedef struct queen_sweeper_api {
    size_t struct_size;
    uint32_t abi_major;
    uint32_t abi_minor;
    uint32_t (*abi_version)(void);
    const char *(*version)(void);
    int (*create)(const char *config_json, queen_sweeper **out);
    int (*set_log_callback)(queen_sweeper *sw, queen_sweeper_log_fn fn, void *user);
    int (*set_fired_callback)(queen_sweeper *sw, queen_sweeper_fired_fn fn, void *user);
    int (*set_backstop)(queen_sweeper *sw, const queen_sweeper_backstop *provider);
    int (*start)(queen_sweeper *sw);
    int (*stop)(queen_sweeper *sw, uint32_t timeout_ms);
    void (*destroy)(queen_sweeper **sw);
    void (*wake)(queen_sweeper *sw, int64_t deliver_at_unix_ms);
    const char *(*last_error)(void);
    int64_t (*stats)(queen_sweeper *sw, char *buf, size_t cap);
    int64_t (*metrics)(queen_sweeper *sw, char *buf, size_t cap);
    int (*segment_decode)(const uint8_t *blob, size_t len, queen_sweeper_segment **out);
    size_t (*segment_count)(const queen_sweeper_segment *seg);
    int (*segment_frame)(const queen_sweeper_segment *seg, size_t index, queen_sweeper_frame *out);
    void (*segment_free)(queen_sweeper_segment **seg);
    int (*txn_hash)(const char *txn, size_t len, uint8_t out16[16]);
    /* Since 1.1: read only when struct_size covers them. */
    int (*wait_ready)(queen_sweeper *sw, uint32_t timeout_ms);
    const char *(*status_name)(int status);
} queen_sweeper_api;

/** The type of queen_sweeper_get_api, for dlsym casts. */
typedef const queen_sweeper_api *(*queen_sweeper_get_api_fn)(uint32_t abi_major);

/**
 * The static function table for ABI major `abi_major`, or NULL when this
 * library does not implement that major (the last error names both
 * versions). The table is static: never freed.
 *
 * Thread safety: any thread, any time.
 * Since: 1.0
 */
QUEEN_SWEEPER_API const queen_sweeper_api *queen_sweeper_get_api(uint32_t abi_major);

#ifdef __cplusplus
}
#endif

#endif /* QUEEN_SWEEPER_H */
