/*
 * queen_ephemeral.h - the public C ABI of libqueen_ephemeral.so (ABI v1).
 *
 * The in-RAM ephemeral queue engine of queen-sweeper: rings of messages per
 * (queue, partition), consumer groups with independent cursors, leases with
 * redelivery and a retry limit, ttl head-drop, byte and length bounds, and
 * garbage collection of idle implicit queues. Nothing here touches a disk or
 * a database.
 *
 * The engine keeps itself tidy opportunistically: every push, pop and ack of
 * a queue first runs that queue's lease expiry, ttl head-drop and idle GC.
 * queen_ephemeral_sweep() is the backstop for queues nobody touches; a host
 * hands it to libqueen_sweeper.so in one call:
 *
 *     queen_sweeper_backstop provider;
 *     queen_ephemeral_backstop(engine, &provider, sizeof provider);
 *     queen_sweeper_set_backstop(sweeper, &provider);
 *
 * Time is never read from a clock inside the engine: every call that needs
 * one takes `now_unix_ms` (unix milliseconds) from the caller, so behaviour
 * is a function of the inputs and tests are deterministic.
 *
 * This header is the contract: what is not declared here is not API. It is
 * C99, includes only <stddef.h> and <stdint.h>, and compiles on its own with
 * -std=c99 -pedantic -Werror.
 *
 * Sections, in order: version, types, lifecycle, control, introspection,
 * memory, plugin entry.
 *
 * Conventions:
 *   - Every function returning int returns QUEEN_EPHEMERAL_OK (0) or a
 *     negative QUEEN_EPHEMERAL_E* code (the same values libqueen_sweeper.so
 *     uses). The human-readable detail of the last failure on the calling
 *     thread is queen_ephemeral_last_error(); it names the offending argument
 *     or bound.
 *   - No C++ exception and no abort() ever crosses this boundary.
 *   - Whatever the library allocates, the library frees.
 *   - Names (queue, partition, group) are NUL-terminated, non-empty and at
 *     most QUEEN_EPHEMERAL_MAX_NAME bytes; they are borrowed for the call.
 *   - Structs that cross the boundary start with struct_size and only grow
 *     at the end.
 *
 * Offsets: every push takes the next offset of its partition, so within a
 * ring they are consecutive and only grow. An offset is never handed out
 * twice for the same (queue, partition) while the engine lives, not even
 * after the queue is collected and its name used again: the recreated ring
 * goes on past the highest offset of every ring collected so far. That is
 * what makes an ack by offset alone safe however late it comes: one naming an
 * offset of a collected ring gets ENOENT, never a newer message. The engine
 * keeps a single number for it, not a record per collected name, so
 * collection still frees everything else; the price is that a new
 * partition's first offset is 0 only until the engine first collects a queue.
 */
#ifndef QUEEN_EPHEMERAL_H
#define QUEEN_EPHEMERAL_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define QUEEN_EPHEMERAL_API
#elif defined(__GNUC__) || defined(__clang__)
#define QUEEN_EPHEMERAL_API __attribute__((visibility("default")))
#else
#define QUEEN_EPHEMERAL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * 1. Version
 * ==================================================================== */

/** ABI major: a host built against another major must refuse this library. */
#define QUEEN_EPHEMERAL_ABI_MAJOR 1
/** ABI minor: grows when functions or trailing struct fields are appended. */
#define QUEEN_EPHEMERAL_ABI_MINOR 0

/**
 * The ABI version of the loaded library, packed as (major << 16) | minor.
 *
 * Returns: the packed version; never fails.
 * Thread safety: any thread, any time.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API uint32_t queen_ephemeral_abi_version(void);

/**
 * The library's release version as a static NUL-terminated string such as
 * "1.0.0". Owned by the library; never freed by the caller.
 *
 * Thread safety: any thread, any time.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API const char *queen_ephemeral_version(void);

/* ======================================================================
 * 2. Types
 * ==================================================================== */

/** Success. */
#define QUEEN_EPHEMERAL_OK 0
/** A bad argument or configuration; the last error names what is wrong. */
#define QUEEN_EPHEMERAL_EINVAL (-22)
/** Out of memory. */
#define QUEEN_EPHEMERAL_ENOMEM (-12)
/** No such queue, partition, group or open delivery. */
#define QUEEN_EPHEMERAL_ENOENT (-2)
/** Nothing to pop: every message is delivered, leased or absent. */
#define QUEEN_EPHEMERAL_EAGAIN (-11)
/** A bound rejected the call; the last error names the bound and its value. */
#define QUEEN_EPHEMERAL_EFULL (-28)
/** The lease given to an ack was superseded by a later delivery. */
#define QUEEN_EPHEMERAL_ESTALE (-116)
/** An unexpected internal failure; the last error says what. */
#define QUEEN_EPHEMERAL_EINTERNAL (-5)

/** Longest accepted queue, partition or group name, in bytes. */
#define QUEEN_EPHEMERAL_MAX_NAME 255

/** Overflow policies: what a push does when a bound is reached. */
#define QUEEN_EPHEMERAL_OVERFLOW_REJECT 0      /**< the push fails with EFULL */
#define QUEEN_EPHEMERAL_OVERFLOW_DROP_OLDEST 1 /**< the queue's oldest messages make room */

/** Ack outcomes. */
#define QUEEN_EPHEMERAL_ACK_COMPLETED 0 /**< done for this group */
#define QUEEN_EPHEMERAL_ACK_RETRY 1     /**< visible again at once for this group; spends an attempt */
#define QUEEN_EPHEMERAL_ACK_FAILED 2    /**< dropped for this group, counted as failed */

/** The opaque engine handle. */
typedef struct queen_ephemeral queen_ephemeral;

/**
 * Engine configuration. Fill it with queen_ephemeral_config_init() and change
 * what you need: every field is then taken literally.
 *
 * Bounds count payload bytes and messages held (delivered-but-unacked
 * messages included); 0 means unbounded. The per-queue fields are the
 * defaults of every queue; a declared queue may override them.
 *
 * When a push would pass the engine's bound under DROP_OLDEST, the oldest
 * messages of the queue being pushed to make room (one queue never evicts
 * another's messages); if that queue holds nothing, the push is rejected.
 */
typedef struct queen_ephemeral_config {
    size_t struct_size;           /**< sizeof(queen_ephemeral_config) as the caller knows it */
    uint64_t max_bytes;           /**< engine-wide payload bytes (default 256 MiB; 0 unbounded) */
    uint64_t max_messages;        /**< engine-wide messages (default 1,000,000; 0 unbounded) */
    uint64_t queue_max_bytes;     /**< default per-queue payload bytes (default 0) */
    uint64_t queue_max_messages;  /**< default per-queue messages (default 0) */
    int32_t overflow;             /**< QUEEN_EPHEMERAL_OVERFLOW_* for engine and queue bounds (default REJECT) */
    uint32_t lease_ms;            /**< default lease, > 0 (default 30000) */
    uint32_t max_retries;         /**< redeliveries allowed after the first delivery (default 3) */
    uint64_t ttl_ms;              /**< default message ttl; 0 none (default 0) */
    uint64_t idle_gc_ms;          /**< an implicit queue holding no message is collected after this long
                                       without push, pop or ack; 0 never (default 300000). Messages are
                                       retired by ttl and bounds, never by idleness. Collection forgets
                                       the queue's groups, not its offsets (see "Offsets" above). */
    uint64_t max_payload_bytes;   /**< largest single payload, > 0 (default 1 MiB) */
    uint32_t max_queues;          /**< queues alive at once; 0 unbounded (default 65536) */
    uint32_t max_groups;          /**< consumer groups per queue; 0 unbounded (default 1024) */
} queen_ephemeral_config;

/** Sentinel for queen_ephemeral_queue_options fields: use the engine default. */
#define QUEEN_EPHEMERAL_INHERIT (-1)

/**
 * Options of a declared queue. queen_ephemeral_queue_options_init() sets
 * every field to QUEEN_EPHEMERAL_INHERIT; any field left so takes the engine
 * configuration's value. Other values mean what the config fields mean.
 */
typedef struct queen_ephemeral_queue_options {
    size_t struct_size;  /**< sizeof(queen_ephemeral_queue_options) as the caller knows it */
    int64_t max_bytes;
    int64_t max_messages;
    int64_t overflow;
    int64_t lease_ms;
    int64_t max_retries;
    int64_t ttl_ms;
} queen_ephemeral_queue_options;

/**
 * One delivered message, filled by queen_ephemeral_pop(). The caller owns
 * the struct; the library owns `payload` until queen_ephemeral_message_free().
 */
typedef struct queen_ephemeral_message {
    size_t struct_size;            /**< set by the caller to sizeof(queen_ephemeral_message) */
    int64_t offset;                /**< the message's offset in its partition, never reused (see "Offsets") */
    uint64_t lease_id;             /**< identifies this delivery; never 0 */
    uint32_t attempt;              /**< 1 for the first delivery to this group, then 2, ... */
    int64_t lease_expires_unix_ms; /**< when the lease lapses and the message is redelivered */
    int64_t pushed_unix_ms;        /**< the `now` of the push */
    uint8_t *payload;              /**< a copy; NULL when payload_len is 0 */
    size_t payload_len;
} queen_ephemeral_message;

/** What one sweep did (the same fields as queen_sweeper_backstop_result). */
typedef struct queen_ephemeral_sweep_result {
    size_t struct_size;          /**< set by the caller to sizeof(queen_ephemeral_sweep_result) */
    uint64_t redelivered;        /**< leases that expired and were made visible again */
    uint64_t exhausted;          /**< expired leases past their retry limit, dropped for their group */
    uint64_t ttl_dropped;        /**< unconsumed messages dropped for their ttl */
    uint64_t queues_collected;   /**< idle implicit queues collected */
    int64_t next_expiry_unix_ms; /**< nearest lease or ttl instant still armed, or -1 for none */
} queen_ephemeral_sweep_result;

/** A queue's shape, filled by queen_ephemeral_queue_info(). */
typedef struct queen_ephemeral_queue_state {
    size_t struct_size;          /**< set by the caller to sizeof(queen_ephemeral_queue_state) */
    int32_t declared;            /**< 1 declared (kept forever), 0 implicit */
    uint32_t partitions;
    uint32_t groups;
    uint64_t messages;           /**< held: not yet consumed by every group */
    uint64_t bytes;
    uint64_t in_flight;          /**< deliveries under a live lease, over all groups */
    int64_t next_expiry_unix_ms; /**< nearest lease or ttl instant, or -1 */
} queen_ephemeral_queue_state;

/**
 * A wake entry point (same signature as queen_sweeper_wake_fn): ring the
 * owner for an instant in unix ms. Must be lock-free and must not call back
 * into the engine.
 */
typedef void (*queen_ephemeral_wake_fn)(void *wake_ctx, int64_t at_unix_ms);

/* ======================================================================
 * 3. Lifecycle
 * ==================================================================== */

/**
 * Fill a configuration with the defaults and set its struct_size.
 *
 * cfg: caller-owned; NULL is ignored.
 * Thread safety: any thread.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API void queen_ephemeral_config_init(queen_ephemeral_config *cfg);

/**
 * Create an engine.
 *
 * cfg: borrowed for the call; NULL means the defaults. struct_size must be at
 *   least sizeof(queen_ephemeral_config) of ABI 1.0.
 * out: receives the new handle, owned by the caller until
 *   queen_ephemeral_destroy(); set to NULL on failure.
 * Returns: OK; EINVAL for a NULL out, a too-small struct_size, an unknown
 *   overflow policy, lease_ms 0 or max_payload_bytes 0 (the last error names
 *   the field); ENOMEM.
 * Thread safety: any thread.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API int queen_ephemeral_create(const queen_ephemeral_config *cfg,
                                               queen_ephemeral **out);

/**
 * Destroy an engine and every message it holds, and set *e to NULL. NULL and
 * a pointer to NULL are accepted and do nothing. A waker still attached is
 * never called again.
 *
 * Thread safety: no other call on the same engine may run concurrently, and
 * a sweeper holding it as its backstop must be stopped first.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API void queen_ephemeral_destroy(queen_ephemeral **e);

/* ======================================================================
 * 4. Control
 * ==================================================================== */

/**
 * Set every field of queue options to QUEEN_EPHEMERAL_INHERIT and set its
 * struct_size.
 *
 * opts: caller-owned; NULL is ignored.
 * Thread safety: any thread.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API void queen_ephemeral_queue_options_init(queen_ephemeral_queue_options *opts);

/**
 * Declare a queue: it is kept until the engine is destroyed, never collected
 * for idleness. Declaring an existing queue (implicit or declared) keeps its
 * messages and groups, makes it declared and replaces its options; new
 * bounds apply from the next push.
 *
 * queue: the queue name, borrowed.
 * opts: borrowed; NULL means every option inherits the engine's.
 * Returns: OK; EINVAL for a NULL engine, a bad name, a too-small struct_size
 *   or an out-of-range option (named); EFULL when max_queues is reached;
 *   ENOMEM.
 * Thread safety: any thread, concurrently with everything but destroy.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API int queen_ephemeral_declare(queen_ephemeral *e, const char *queue,
                                                const queen_ephemeral_queue_options *opts);

/**
 * Append a message to the ring of (queue, partition). An unknown queue is
 * created implicitly (collected again once idle and empty); an unknown
 * partition is created. The queue's maintenance (lease expiry, ttl drop,
 * idle GC) runs first. When the queue has a ttl the message's expiry is armed
 * and the waker rung if it is the earliest instant armed.
 *
 * payload, len: borrowed; copied. payload may be NULL only when len is 0.
 * now_unix_ms: the caller's clock.
 * out_offset: optional; receives the message's offset in its partition
 *   (see "Offsets" at the top: a partition created after a collection
 *   need not start at 0).
 * Returns: OK; EINVAL for NULL engine, bad names, NULL payload with len > 0,
 *   or len above max_payload_bytes; EFULL when a bound rejects the push (the
 *   last error names queue_max_bytes / queue_max_messages / max_bytes /
 *   max_messages / max_queues); ENOMEM.
 * Thread safety: any thread, concurrently with everything but destroy.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API int queen_ephemeral_push(queen_ephemeral *e, const char *queue,
                                             const char *partition, const void *payload,
                                             size_t len, int64_t now_unix_ms,
                                             int64_t *out_offset);

/**
 * Lease the next message of (queue, partition) for a consumer group. A
 * message made visible again (retry or lapsed lease) goes out first, lowest
 * offset first; then the group's cursor advances. An unknown queue is created
 * implicitly and an unknown group is created at the ring's oldest held
 * message; from then on the group holds back trimming of every partition of
 * the queue until it has consumed past a message.
 *
 * group: the consumer group name, borrowed.
 * lease_ms: the lease for this delivery; 0 means the queue's default.
 * out: caller-owned, struct_size set; on success filled and its payload owned
 *   by the library until queen_ephemeral_message_free(); on failure payload
 *   is NULL and payload_len 0.
 * Returns: OK; EAGAIN when nothing is visible; EINVAL for bad arguments or a
 *   too-small struct_size; EFULL when max_queues or max_groups is reached;
 *   ENOMEM.
 * Thread safety: any thread, concurrently with everything but destroy.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API int queen_ephemeral_pop(queen_ephemeral *e, const char *queue,
                                            const char *partition, const char *group,
                                            uint32_t lease_ms, int64_t now_unix_ms,
                                            queen_ephemeral_message *out);

/**
 * Settle a delivery for a group.
 *
 * offset: the message's offset, or -1 to find it by lease_id.
 * lease_id: 0 to settle by offset alone (any open delivery of that offset);
 *   otherwise it must be the message's latest lease. A lease that lapsed is
 *   still honoured until the message is delivered again (or exhausted).
 *   Offsets are never reused (see "Offsets"), so an ack by offset alone that
 *   arrives after its queue was collected gets ENOENT; it cannot settle the
 *   message that a recreated queue pushed since.
 * outcome: QUEEN_EPHEMERAL_ACK_COMPLETED (done for the group),
 *   QUEEN_EPHEMERAL_ACK_RETRY (visible again at once; spends an attempt, so
 *   past max_retries it is exhausted instead) or QUEEN_EPHEMERAL_ACK_FAILED
 *   (dropped for the group). A message every group is done with is trimmed.
 * Returns: OK; ENOENT for an unknown queue, partition or group, or an offset
 *   not open for this group (never delivered, already settled, dropped by
 *   ttl or a bound, or delivered by a queue since collected); ESTALE for a
 *   superseded lease; EINVAL for bad arguments (offset -1 with lease_id 0,
 *   unknown outcome).
 * Thread safety: any thread, concurrently with everything but destroy.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API int queen_ephemeral_ack(queen_ephemeral *e, const char *queue,
                                            const char *partition, const char *group,
                                            int64_t offset, uint64_t lease_id, int outcome,
                                            int64_t now_unix_ms);

/**
 * The backstop pass over every queue: lease expiry (redelivery, or
 * exhaustion past max_retries), ttl head-drop, and collection of implicit
 * queues idle for idle_gc_ms that hold no message. Takes no lock but the
 * engine's own, one queue at a time.
 *
 * out: optional; struct_size set by the caller; filled with what this pass
 *   did and the nearest instant still armed.
 * Returns: OK; EINVAL for a NULL engine or a too-small struct_size.
 * Thread safety: any thread, concurrently with everything but destroy.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API int queen_ephemeral_sweep(queen_ephemeral *e, int64_t now_unix_ms,
                                              queen_ephemeral_sweep_result *out);

/**
 * Attach the waker the engine rings when it arms a lease or a ttl earlier
 * than any instant it has already announced since the last sweep. NULL wake
 * detaches; once this call returns, the previous waker is never called again
 * (a call in flight on another thread is waited for).
 *
 * Returns: OK; EINVAL for a NULL engine.
 * Thread safety: any thread, concurrently with everything but destroy; must
 *   not be called from inside the waker.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API int queen_ephemeral_attach_waker(queen_ephemeral *e,
                                                     queen_ephemeral_wake_fn wake,
                                                     void *wake_ctx);

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
QUEEN_EPHEMERAL_API const char *queen_ephemeral_last_error(void);

/**
 * A JSON snapshot, snprintf-style: writes at most cap bytes including the
 * terminating NUL (a too-small buffer gets a terminated prefix) and returns
 * the length the full text needs, excluding the NUL. buf may be NULL when
 * cap is 0. Keys: queues, declared_queues, messages, bytes, in_flight, the
 * bounds, and the totals pushed, popped, acked, retried, failed, redelivered,
 * exhausted, ttl_dropped, overflow_dropped, collected, rejected (each with a
 * _total suffix).
 *
 * Returns: the needed length (>= 0); EINVAL if e is NULL or buf is NULL with
 *   cap > 0.
 * Thread safety: any thread, concurrently with everything but destroy.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API int64_t queen_ephemeral_stats(queen_ephemeral *e, char *buf, size_t cap);

/**
 * Describe one queue without touching it (no maintenance, no idle reset).
 *
 * out: caller-owned, struct_size set.
 * Returns: OK; ENOENT if the queue does not exist; EINVAL for bad arguments.
 * Thread safety: any thread, concurrently with everything but destroy.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API int queen_ephemeral_queue_info(queen_ephemeral *e, const char *queue,
                                                   queen_ephemeral_queue_state *out);

/* ======================================================================
 * 6. Memory
 * ==================================================================== */

/**
 * Free the payload of a popped message and set payload to NULL and
 * payload_len to 0. The struct itself stays the caller's. NULL-safe;
 * freeing twice is harmless.
 *
 * Thread safety: any thread; not concurrently on the same message.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API void queen_ephemeral_message_free(queen_ephemeral_message *msg);

/* ======================================================================
 * 7. Plugin entry
 * ==================================================================== */

/**
 * Fill a queen_sweeper_backstop (declared in queen_sweeper.h) so that the
 * engine serves as the sweeper's backstop provider: struct_size, ctx = e,
 * sweep and attach_waker. Hand the result to queen_sweeper_set_backstop().
 * The engine must outlive the sweeper's stop.
 *
 * out_provider: caller-owned; MUST point to a queen_sweeper_backstop.
 * out_size: sizeof(queen_sweeper_backstop) as the caller knows it.
 * Returns: OK; EINVAL for NULL arguments or an out_size smaller than the
 *   ABI 1.0 queen_sweeper_backstop.
 * Thread safety: any thread.
 * Since: 1.0
 */
QUEEN_EPHEMERAL_API int queen_ephemeral_backstop(queen_ephemeral *e, void *out_provider,
                                                 size_t out_size);

#ifdef __cplusplus
}
#endif

#endif /* QUEEN_EPHEMERAL_H */
