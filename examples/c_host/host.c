/*
 * example_c_host: a minimal broker host in C99 that loads libqueen_sweeper.so
 * with dlopen() and drives it through the single exported entry point
 * queen_sweeper_get_api(QUEEN_SWEEPER_ABI_MAJOR).
 *
 *   example_c_host [LIBRARY [CONNINFO]]
 *
 *   LIBRARY   path to libqueen_sweeper.so (default: $QUEEN_SWEEPER_LIBRARY)
 *   CONNINFO  libpq connection string (default: $QUEEN_TEST_CONNINFO, else the
 *             PG* environment)
 *   $EXAMPLE_TIMERS  how many timers to schedule (default 20, at most 4096)
 *
 * What it shows, in order:
 *   1. the sweeper is created with apply_schema true and started; the host
 *      waits until it is ready (wait_ready: the schema is in place and a
 *      first probe completed);
 *   2. a transaction that schedules timers and then ROLLS BACK rings nothing:
 *      wakes_total and wake_signals_total are the same before and after, and
 *      those timers never reach the log;
 *   3. a transaction schedules N timers with queen.log_timers_apply_v1,
 *      COMMITs, and only then rings wake() with the earliest deliverAt;
 *   4. every fired segment is printed from the on_fired callback, then read
 *      back with queen.log_read_v1 and decoded with the segment codec: each
 *      message's txn and its lateness;
 *   5. the sweeper stops cleanly; the exit status is 0 only if every scheduled
 *      timer is in the log exactly once and no rolled-back one is.
 *
 * The host has its own libpq connection (application_name example-c-host);
 * the sweeper has its own pool. Nothing here links the plugin at build time.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <stddef.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "queen_sweeper.h"

#define TENANT "00000000-0000-0000-0000-000000000001"
#define QUEUE "example-c"
#define PARTITIONS 3
#define MAX_TIMERS 4096
#define MAX_FIRED 8192
#define ROLLED_BACK 5

static const queen_sweeper_api *Q;

/* ---------------------------------------------------------------- helpers */

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}

/* A growable string, enough for building JSON text. */
typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static void buf_add(buf_t *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            fprintf(stderr, "out of memory\n");
            exit(2);
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void buf_puts(buf_t *b, const char *s) { buf_add(b, s, strlen(s)); }

/* Appends s as a JSON string literal. */
static void buf_json_str(buf_t *b, const char *s) {
    buf_puts(b, "\"");
    for (; *s; ++s) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            buf_add(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            buf_puts(b, esc);
        } else {
            buf_add(b, (const char *)&c, 1);
        }
    }
    buf_puts(b, "\"");
}

static void buf_base64(buf_t *b, const unsigned char *in, size_t n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t i;
    for (i = 0; i + 2 < n; i += 3) {
        char o[4] = {tab[in[i] >> 2], tab[((in[i] & 3) << 4) | (in[i + 1] >> 4)],
                     tab[((in[i + 1] & 15) << 2) | (in[i + 2] >> 6)], tab[in[i + 2] & 63]};
        buf_add(b, o, 4);
    }
    if (n - i == 1) {
        char o[4] = {tab[in[i] >> 2], tab[(in[i] & 3) << 4], '=', '='};
        buf_add(b, o, 4);
    } else if (n - i == 2) {
        char o[4] = {tab[in[i] >> 2], tab[((in[i] & 3) << 4) | (in[i + 1] >> 4)], tab[(in[i + 1] & 15) << 2],
                     '='};
        buf_add(b, o, 4);
    }
}

/* The stats JSON as a malloc'd string (snprintf semantics: grow until it fits). */
static char *stats_text(queen_sweeper *sw) {
    size_t cap = 8192;
    for (;;) {
        char *p = malloc(cap);
        if (!p) return NULL;
        int64_t need = Q->stats(sw, p, cap);
        if (need < 0) {
            free(p);
            return NULL;
        }
        if ((size_t)need < cap) return p;
        free(p);
        cap = (size_t)need + 1024;
    }
}

/* A top-level integer field of the stats JSON. Nested objects are skipped: their keys
 * can repeat a top-level name (failover.in_doubt.fired_total sorts before fired_total). */
static int64_t stat_int(const char *json, const char *key) {
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const size_t n = strlen(pat);
    int depth = 0, in_str = 0;
    for (const char *p = json; p && *p; ++p) {
        if (in_str) {
            if (*p == '\\' && p[1]) ++p;
            else if (*p == '"') in_str = 0;
            continue;
        }
        if (*p == '{' || *p == '[') ++depth;
        else if (*p == '}' || *p == ']') --depth;
        else if (*p == '"') {
            if (depth == 1 && strncmp(p, pat, n) == 0) return strtoll(p + n, NULL, 10);
            in_str = 1;
        }
    }
    return -1;
}

static int64_t stat_now(queen_sweeper *sw, const char *key) {
    char *t = stats_text(sw);
    int64_t v = stat_int(t, key);
    free(t);
    return v;
}

static PGresult *exec_ok(PGconn *db, const char *sql, int n, const char *const *params, ExecStatusType want) {
    PGresult *r = PQexecParams(db, sql, n, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(r) != want) {
        fprintf(stderr, "SQL failed: %s\n  in: %s\n", PQerrorMessage(db), sql);
        PQclear(r);
        return NULL;
    }
    return r;
}

static int exec_cmd(PGconn *db, const char *sql) {
    PGresult *r = exec_ok(db, sql, 0, NULL, PGRES_COMMAND_OK);
    if (!r) return -1;
    PQclear(r);
    return 0;
}

/* ------------------------------------------------------------ callbacks */

typedef struct {
    char tenant[40];
    char partition[64];
    uint32_t count;
    int64_t base_offset;
    int64_t seen_ms; /* host clock when the callback ran */
} fired_rec;

static pthread_mutex_t fired_mu = PTHREAD_MUTEX_INITIALIZER;
static fired_rec fired[MAX_FIRED];
static int nfired;
static int64_t fired_msgs; /* messages fired into our queue */

/* Runs on the sweeper's thread after each fire commit: print, note, return. */
static void on_fired(void *user, const char *tenant, const char *queue, const char *partition, uint32_t count,
                     int64_t base_offset) {
    (void)user;
    int64_t t = now_ms();
    printf("on_fired: tenant=%s queue=%s partition=%s count=%" PRIu32 " base_offset=%" PRId64 "\n", tenant, queue,
           partition, count, base_offset);
    fflush(stdout);
    if (strcmp(queue, QUEUE) != 0) return; /* another host's timers; the sweeper serves the whole table */
    pthread_mutex_lock(&fired_mu);
    if (nfired < MAX_FIRED) {
        fired_rec *f = &fired[nfired++];
        snprintf(f->tenant, sizeof f->tenant, "%s", tenant);
        snprintf(f->partition, sizeof f->partition, "%s", partition);
        f->count = count;
        f->base_offset = base_offset;
        f->seen_ms = t;
    }
    fired_msgs += count;
    pthread_mutex_unlock(&fired_mu);
}

static void on_log(void *user, int level, const char *message) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    (void)user;
    fprintf(stderr, "[sweeper %s] %s\n", (level >= 0 && level <= 3) ? names[level] : "?", message);
}

/* --------------------------------------------------------------- timers */

/* Schedules count timers (keys/txns "<tag>-<i>") in the open transaction. Fills
 * deliver_ms[i]; returns the earliest deliverAt, or -1 on failure. */
static int64_t schedule(PGconn *db, const char *tag, int count, int base_delay_ms, int spread_ms,
                        int64_t *deliver_ms) {
    int64_t earliest = INT64_MAX;
    for (int start = 0; start < count; start += 256) {
        int end = start + 256 < count ? start + 256 : count;
        buf_t ops = {0};
        buf_puts(&ops, "[");
        for (int i = start; i < end; ++i) {
            char key[96], part[16], num[48], payload[64];
            snprintf(key, sizeof key, "%s-%d", tag, i);
            snprintf(part, sizeof part, "p%d", i % PARTITIONS);
            snprintf(num, sizeof num, "%d", base_delay_ms + (count > 1 ? (int)((int64_t)spread_ms * i / (count - 1)) : 0));
            snprintf(payload, sizeof payload, "{\"n\":%d}", i);
            if (i > start) buf_puts(&ops, ",");
            buf_puts(&ops, "{\"op\":\"schedule\",\"queue\":\"" QUEUE "\",\"timerKey\":");
            buf_json_str(&ops, key);
            buf_puts(&ops, ",\"partition\":\"");
            buf_puts(&ops, part);
            buf_puts(&ops, "\",\"delayMs\":");
            buf_puts(&ops, num);
            buf_puts(&ops, ",\"txn\":");
            buf_json_str(&ops, key);
            buf_puts(&ops, ",\"payload\":\"");
            buf_base64(&ops, (const unsigned char *)payload, strlen(payload));
            buf_puts(&ops, "\"}");
        }
        buf_puts(&ops, "]");
        /* SQL unpacks the index-aligned JSON answer, so this host needs no JSON parser. */
        const char *params[1] = {ops.p};
        PGresult *r = exec_ok(db,
                              "SELECT r->>'status', (r->>'deliverAtMs')::bigint"
                              "  FROM jsonb_array_elements(queen.log_timers_apply_v1($1::jsonb, '" TENANT
                              "', NULL, now())) WITH ORDINALITY AS a(r, i) ORDER BY i",
                              1, params, PGRES_TUPLES_OK);
        free(ops.p);
        if (!r) return -1;
        for (int row = 0; row < PQntuples(r); ++row) {
            if (strcmp(PQgetvalue(r, row, 0), "scheduled") != 0) {
                fprintf(stderr, "timer %s-%d: status %s\n", tag, start + row, PQgetvalue(r, row, 0));
                PQclear(r);
                return -1;
            }
            int64_t at = strtoll(PQgetvalue(r, row, 1), NULL, 10);
            deliver_ms[start + row] = at;
            if (at < earliest) earliest = at;
        }
        PQclear(r);
    }
    return earliest;
}

/* The index i of a txn "<tag>-<i>", or -1 when it is not one of ours. */
static int txn_index(const char *txn, size_t len, const char *tag) {
    size_t tl = strlen(tag);
    if (len <= tl + 1 || memcmp(txn, tag, tl) != 0 || txn[tl] != '-') return -1;
    int v = 0;
    for (size_t k = tl + 1; k < len; ++k) {
        if (txn[k] < '0' || txn[k] > '9' || v > 100000) return -1;
        v = v * 10 + (txn[k] - '0');
    }
    return v;
}

/* ----------------------------------------------------------------- main */

int main(int argc, char **argv) {
    const char *lib = argc > 1 ? argv[1] : getenv("QUEEN_SWEEPER_LIBRARY");
    const char *conninfo = argc > 2 ? argv[2] : getenv("QUEEN_TEST_CONNINFO");
    int n = getenv("EXAMPLE_TIMERS") ? atoi(getenv("EXAMPLE_TIMERS")) : 20;
    if (!conninfo) conninfo = "";
    if (!lib || !*lib) {
        fprintf(stderr, "usage: %s LIBRARY [CONNINFO]   (or set QUEEN_SWEEPER_LIBRARY)\n", argv[0]);
        return 2;
    }
    if (n < 1 || n > MAX_TIMERS) n = 20;

    /* 1. Load the plugin and resolve the whole ABI through one symbol. */
    void *so = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
        return 2;
    }
    queen_sweeper_get_api_fn get_api;
    *(void **)(&get_api) = dlsym(so, "queen_sweeper_get_api"); /* POSIX-sanctioned cast */
    if (!get_api) {
        fprintf(stderr, "dlsym queen_sweeper_get_api: %s\n", dlerror());
        return 2;
    }
    Q = get_api(QUEEN_SWEEPER_ABI_MAJOR);
    if (!Q || Q->struct_size < sizeof(queen_sweeper_api) || Q->abi_major != QUEEN_SWEEPER_ABI_MAJOR ||
        (Q->abi_version() >> 16) != QUEEN_SWEEPER_ABI_MAJOR) {
        fprintf(stderr, "%s does not implement ABI major %d\n", lib, QUEEN_SWEEPER_ABI_MAJOR);
        return 2;
    }
    printf("loaded %s: version %s, ABI %u.%u\n", lib, Q->version(), Q->abi_major, Q->abi_minor);

    /* The host's own connection. */
    const char *keys[] = {"dbname", "application_name", NULL};
    const char *vals[] = {conninfo, "example-c-host", NULL};
    PGconn *db = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(db) != CONNECTION_OK) {
        fprintf(stderr, "connect: %s", PQerrorMessage(db));
        return 2;
    }

    /* 2. Create, configure, start. */
    buf_t cfg = {0};
    /*
     * The sweeper may connect as a role of its own holding only the queen_sweeper group
     * role (sql/007_roles.sql): QUEEN_EXAMPLE_SWEEPER_CONNINFO, else the host's conninfo.
     */
    const char *sweeper_ci = getenv("QUEEN_EXAMPLE_SWEEPER_CONNINFO");
    buf_puts(&cfg, "{\"conninfo\":");
    buf_json_str(&cfg, sweeper_ci && *sweeper_ci ? sweeper_ci : conninfo);
    buf_puts(&cfg, ",\"broker_id\":\"example-c-host\",\"apply_schema\":true,\"log_level\":\"warn\"}");
    queen_sweeper *sw = NULL;
    if (Q->create(cfg.p, &sw) != QUEEN_SWEEPER_OK) {
        fprintf(stderr, "create: %s\n", Q->last_error());
        return 2;
    }
    free(cfg.p);
    if (Q->set_fired_callback(sw, on_fired, NULL) != QUEEN_SWEEPER_OK ||
        Q->set_log_callback(sw, on_log, NULL) != QUEEN_SWEEPER_OK || Q->start(sw) != QUEEN_SWEEPER_OK) {
        fprintf(stderr, "setup: %s\n", Q->last_error());
        return 2;
    }
    /* Ready: the schema is in place (applied, or already at this version) and a first
     * probe completed. The table's wait_ready exists from ABI 1.1 on: check the size. */
    if (Q->struct_size < offsetof(queen_sweeper_api, wait_ready) + sizeof Q->wait_ready) {
        fprintf(stderr, "this libqueen_sweeper predates ABI 1.1 (no wait_ready)\n");
        return 2;
    }
    int ready_rc = Q->wait_ready(sw, 30000);
    if (ready_rc != QUEEN_SWEEPER_OK) {
        fprintf(stderr, "the sweeper is not ready (%s): %s\n", Q->status_name(ready_rc), Q->last_error());
        return 1;
    }
    printf("sweeper running, schema applied\n");

    char run[48];
    snprintf(run, sizeof run, "c-%" PRId64, now_ms());
    char rb_tag[64], tag[64];
    snprintf(rb_tag, sizeof rb_tag, "%s-rolledback", run);
    snprintf(tag, sizeof tag, "%s-t", run);

    /* 3. A transaction that rolls back rings nothing. */
    int64_t w0 = stat_now(sw, "wakes_total"), s0 = stat_now(sw, "wake_signals_total");
    int64_t rb_deliver[ROLLED_BACK];
    if (exec_cmd(db, "BEGIN") || schedule(db, rb_tag, ROLLED_BACK, 100, 100, rb_deliver) < 0 ||
        exec_cmd(db, "ROLLBACK"))
        return 1;
    /* No wake() here: the transaction did not commit, so no timer exists. */
    int64_t w1 = stat_now(sw, "wakes_total"), s1 = stat_now(sw, "wake_signals_total");
    printf("rolled back %d timers and did NOT call wake: wakes_total %" PRId64 " -> %" PRId64
           ", wake_signals_total %" PRId64 " -> %" PRId64 "\n",
           ROLLED_BACK, w0, w1, s0, s1);
    int ok = (w0 == w1 && s0 == s1);

    /* 4. Schedule N timers in one transaction, commit, then wake. */
    static int64_t deliver[MAX_TIMERS];
    if (exec_cmd(db, "BEGIN")) return 1;
    int64_t earliest = schedule(db, tag, n, 300, 2000, deliver);
    if (earliest < 0 || exec_cmd(db, "COMMIT")) return 1;
    /*
     * The wake comes only now, after COMMIT: a wake for a transaction that then
     * rolls back teaches the loop that work exists which does not. One wake with
     * the earliest instant is enough; a later one would not ring the loop anyway.
     */
    Q->wake(sw, earliest);
    int64_t w2 = stat_now(sw, "wakes_total"), s2 = stat_now(sw, "wake_signals_total");
    printf("committed %d timers, then wake(earliest deliverAt %+" PRId64 " ms): wakes_total %" PRId64
           " -> %" PRId64 ", wake_signals_total %" PRId64 " -> %" PRId64 "\n",
           n, earliest - now_ms(), w1, w2, s1, s2);

    /* 5. Wait for them. */
    int64_t deadline = now_ms() + 30000;
    for (;;) {
        pthread_mutex_lock(&fired_mu);
        int64_t got = fired_msgs;
        pthread_mutex_unlock(&fired_mu);
        if (got >= n) break;
        if (now_ms() > deadline) {
            fprintf(stderr, "only %" PRId64 " of %d timers fired within 30 s\n", got, n);
            ok = 0;
            break;
        }
        sleep_ms(20);
    }
    sleep_ms(300); /* room for anything that should not be there (a duplicate) to show up */

    /* 6. Read each fired segment back and decode it. */
    static int seen[MAX_TIMERS];
    int64_t worst = 0;
    pthread_mutex_lock(&fired_mu);
    int nrec = nfired;
    pthread_mutex_unlock(&fired_mu);
    for (int k = 0; k < nrec; ++k) {
        fired_rec *f = &fired[k];
        char base[32];
        snprintf(base, sizeof base, "%" PRId64, f->base_offset);
        const char *params[4] = {f->tenant, QUEUE, f->partition, base};
        PGresult *r = exec_ok(db,
                              "SELECT base_offset, blob, queen.epoch_ms_v1(created_at)"
                              "  FROM queen.log_read_v1($1::uuid, $2, $3, $4::bigint, 1)",
                              4, params, PGRES_TUPLES_OK);
        if (!r || PQntuples(r) != 1 || strtoll(PQgetvalue(r, 0, 0), NULL, 10) != f->base_offset) {
            fprintf(stderr, "segment %s/%s@%s not found\n", QUEUE, f->partition, base);
            ok = 0;
            PQclear(r);
            continue;
        }
        size_t blen = 0;
        unsigned char *blob = PQunescapeBytea((const unsigned char *)PQgetvalue(r, 0, 1), &blen);
        int64_t created = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
        PQclear(r);
        queen_sweeper_segment *seg = NULL;
        if (!blob || Q->segment_decode(blob, blen, &seg) != QUEEN_SWEEPER_OK) {
            fprintf(stderr, "decode: %s\n", Q->last_error());
            ok = 0;
            PQfreemem(blob);
            continue;
        }
        PQfreemem(blob);
        printf("segment %s/%s offsets %" PRId64 "..%" PRId64 ":\n", QUEUE, f->partition, f->base_offset,
               f->base_offset + (int64_t)Q->segment_count(seg) - 1);
        for (size_t i = 0; i < Q->segment_count(seg); ++i) {
            queen_sweeper_frame fr;
            memset(&fr, 0, sizeof fr);
            fr.struct_size = sizeof fr;
            if (Q->segment_frame(seg, i, &fr) != QUEEN_SWEEPER_OK) {
                ok = 0;
                continue;
            }
            int idx = txn_index(fr.txn, fr.txn_len, tag);
            if (idx < 0 || idx >= n) {
                printf("  txn %.*s (not scheduled by this run)\n", (int)fr.txn_len, fr.txn);
                continue;
            }
            int64_t late = f->seen_ms - deliver[idx];
            if (late > worst) worst = late;
            printf("  txn %.*s  late %" PRId64 " ms (on_fired - deliverAt; segment stamped %+" PRId64
                   " ms)  payload %.*s\n",
                   (int)fr.txn_len, fr.txn, late, created - deliver[idx], (int)fr.payload_len,
                   (const char *)fr.payload);
        }
        Q->segment_free(&seg);
    }

    /* 7. Verify from the whole log of the queue: exactly once, none rolled back. */
    int rb_in_log = 0;
    for (int p = 0; p < PARTITIONS; ++p) {
        char part[16];
        snprintf(part, sizeof part, "p%d", p);
        const char *params[2] = {QUEUE, part};
        PGresult *r = exec_ok(db, "SELECT blob FROM queen.log_read_v1('" TENANT "', $1, $2, 0, NULL)", 2, params,
                              PGRES_TUPLES_OK);
        if (!r) return 1;
        for (int row = 0; row < PQntuples(r); ++row) {
            size_t blen = 0;
            unsigned char *blob = PQunescapeBytea((const unsigned char *)PQgetvalue(r, row, 0), &blen);
            queen_sweeper_segment *seg = NULL;
            if (blob && Q->segment_decode(blob, blen, &seg) == QUEEN_SWEEPER_OK) {
                for (size_t i = 0; i < Q->segment_count(seg); ++i) {
                    queen_sweeper_frame fr;
                    memset(&fr, 0, sizeof fr);
                    fr.struct_size = sizeof fr;
                    if (Q->segment_frame(seg, i, &fr) != QUEEN_SWEEPER_OK) continue;
                    int idx = txn_index(fr.txn, fr.txn_len, tag);
                    if (idx >= 0 && idx < n) seen[idx]++;
                    if (txn_index(fr.txn, fr.txn_len, rb_tag) >= 0) rb_in_log++;
                }
            } else {
                ok = 0;
            }
            Q->segment_free(&seg);
            PQfreemem(blob);
        }
        PQclear(r);
    }
    int once = 0, missing = 0, dup = 0;
    for (int i = 0; i < n; ++i) {
        if (seen[i] == 1) once++;
        else if (seen[i] == 0) missing++;
        else dup++;
    }
    char like[80];
    snprintf(like, sizeof like, "%s-%%", run);
    const char *lp[1] = {like};
    PGresult *r = exec_ok(db, "SELECT count(*) FROM queen.log_timers WHERE queue = '" QUEUE "' AND timer_key LIKE $1",
                          1, lp, PGRES_TUPLES_OK);
    long left = r ? atol(PQgetvalue(r, 0, 0)) : -1;
    PQclear(r);

    /* 8. Stop cleanly. */
    int rc = Q->stop(sw, 5000);
    char *st = stats_text(sw);
    printf("stop: %s; state %s; fired_total %" PRId64 ", stale_total %" PRId64 ", duplicate_total %" PRId64 "\n",
           rc == QUEEN_SWEEPER_OK ? "ok" : Q->last_error(), st && strstr(st, "\"state\":\"stopped\"") ? "stopped" : "?",
           stat_int(st, "fired_total"), stat_int(st, "stale_total"), stat_int(st, "duplicate_total"));
    free(st);
    Q->destroy(&sw);
    PQfinish(db);
    dlclose(so);

    ok = ok && rc == QUEEN_SWEEPER_OK && once == n && rb_in_log == 0 && left == 0;
    printf("summary: scheduled %d, fired exactly once %d, missing %d, duplicated %d, rolled-back in log %d, "
           "left in log_timers %ld, worst lateness %" PRId64 " ms -> %s\n",
           n, once, missing, dup, rb_in_log, left, worst, ok ? "OK" : "FAILED");
    return ok ? 0 : 1;
}
