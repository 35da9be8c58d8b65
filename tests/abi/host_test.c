/*
 * A C host that loads libqueen_sweeper.so with dlopen, as a broker written in C
 * would: ABI check, every bad configuration refused with a message naming the
 * key, create, start against the test PostgreSQL, a million wakes, stats,
 * metrics, stop within its timeout, destroy. Run under AddressSanitizer and
 * LeakSanitizer by tests/run.
 *
 * usage: abi_host_test /path/to/libqueen_sweeper.so   (QUEEN_TEST_CONNINFO set)
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "queen_sweeper.h"

static int failures = 0;
static int checks = 0;
#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        ++checks;                                                          \
        if (!(cond)) {                                                     \
            ++failures;                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
        }                                                                  \
    } while (0)

static const queen_sweeper_api *api;

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static long long stat_int(queen_sweeper *sw, const char *key) {
    char buf[65536];
    char pat[128];
    const char *p;
    int64_t n = api->stats(sw, buf, sizeof buf);
    if (n < 0 || (size_t)n >= sizeof buf) return -1;
    snprintf(pat, sizeof pat, "\"%s\":", key);
    p = strstr(buf, pat);
    if (!p) return -1;
    return atoll(p + strlen(pat));
}

static int stat_has(queen_sweeper *sw, const char *needle) {
    char buf[65536];
    int64_t n = api->stats(sw, buf, sizeof buf);
    if (n < 0 || (size_t)n >= sizeof buf) return 0;
    return strstr(buf, needle) != NULL;
}

static void expect_refused(const char *json, const char *must_mention) {
    queen_sweeper *sw = (queen_sweeper *)0x1;
    int rc = api->create(json, &sw);
    const char *err = api->last_error();
    CHECK(rc == QUEEN_SWEEPER_EINVAL, "config %s: rc %d", json, rc);
    CHECK(sw == NULL, "config %s: handle not cleared", json);
    CHECK(strstr(err, must_mention) != NULL, "config %s: message '%s' does not name '%s'", json, err,
          must_mention);
}

struct waker_arg {
    queen_sweeper *sw;
    int64_t at;
    int n;
};

static void *waker(void *p) {
    struct waker_arg *a = (struct waker_arg *)p;
    int i;
    for (i = 0; i < a->n; ++i) api->wake(a->sw, a->at + (i % 3));
    return NULL;
}

static int logged = 0;
static void on_log(void *user, int level, const char *message) {
    (void)user;
    (void)level;
    if (message && message[0]) ++logged;
}

int main(int argc, char **argv) {
    void *lib;
    queen_sweeper_get_api_fn get_api;
    const char *conninfo = getenv("QUEEN_TEST_CONNINFO");
    char config[2048];
    queen_sweeper *sw = NULL;
    int i, rc;
    long long t0, signals_before, signals_after, wakes;
    char small[8];
    int64_t need;
    pthread_t th[4];
    struct waker_arg wa[4];

    if (argc < 2) {
        fprintf(stderr, "usage: %s libqueen_sweeper.so\n", argv[0]);
        return 2;
    }
    if (!conninfo) {
        fprintf(stderr, "QUEEN_TEST_CONNINFO is not set: this test needs the test PostgreSQL (tests/run)\n");
        return 1;
    }
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    *(void **)(&get_api) = dlsym(lib, "queen_sweeper_get_api");
    CHECK(get_api != NULL, "no queen_sweeper_get_api");
    if (!get_api) return 1;
    CHECK(get_api(2) == NULL, "major 2 accepted");
    {
        /* The refusal names both versions; read it through the plain export. */
        const char *(*last_error)(void);
        *(void **)(&last_error) = dlsym(lib, "queen_sweeper_last_error");
        CHECK(last_error && strstr(last_error(), "major 2") && strstr(last_error(), "ABI 1."),
              "version refusal: %s", last_error ? last_error() : "(no symbol)");
    }
    api = get_api(QUEEN_SWEEPER_ABI_MAJOR);
    CHECK(api != NULL, "major 1 refused");
    if (!api) return 1;
    CHECK(api->struct_size >= sizeof(queen_sweeper_api), "api table too small: %zu", api->struct_size);
    CHECK((api->abi_version() >> 16) == QUEEN_SWEEPER_ABI_MAJOR, "abi major %u", api->abi_version() >> 16);
    CHECK(api->version() && api->version()[0], "no version string");

    /* Every bad configuration is refused, naming what is wrong. */
    expect_refused("{not json", "invalid JSON");
    expect_refused("[]", "JSON object");
    expect_refused("{\"sweeper_max_sleep\": 1}", "sweeper_max_sleep");
    expect_refused("{\"sweeper_max_sleep_ms\": \"1s\"}", "sweeper_max_sleep_ms");
    expect_refused("{\"sweeper_parallelism\": 9}", "sweeper_parallelism");
    expect_refused("{\"sweeper_lease_ms\": -5}", "sweeper_lease_ms");
    expect_refused("{\"apply_schema\": \"perhaps\"}", "apply_schema");
    expect_refused("{\"conninfo\": 12}", "conninfo");
    CHECK(api->create("{}", NULL) == QUEEN_SWEEPER_EINVAL, "NULL out accepted");
    CHECK(strstr(api->last_error(), "out") != NULL, "NULL out message: %s", api->last_error());

    /* NULL handles are refused or harmless, never a crash. */
    CHECK(api->start(NULL) == QUEEN_SWEEPER_EINVAL, "start(NULL)");
    CHECK(api->stop(NULL, 10) == QUEEN_SWEEPER_EINVAL, "stop(NULL)");
    CHECK(api->stats(NULL, small, sizeof small) == QUEEN_SWEEPER_EINVAL, "stats(NULL)");
    api->wake(NULL, 1);
    api->destroy(NULL);
    api->destroy(&sw);

    /* Stop before start, double stop, destroy without stop. */
    rc = api->create("{\"read_env\": false}", &sw);
    CHECK(rc == 0 && sw, "create: %s", api->last_error());
    api->wake(sw, 1); /* before start: harmless */
    CHECK(api->stop(sw, 100) == 0, "stop before start");
    CHECK(api->stop(sw, 100) == 0, "double stop before start");
    CHECK(api->start(sw) == QUEEN_SWEEPER_ESTATE, "start after stop");
    api->destroy(&sw);
    CHECK(sw == NULL, "destroy did not clear the pointer");

    snprintf(config, sizeof config,
             "{\"conninfo\": \"%s\", \"apply_schema\": true, \"read_env\": false, \"broker_id\": \"c-host\"}",
             conninfo);
    rc = api->create(config, &sw);
    CHECK(rc == 0, "create: %s", api->last_error());
    if (rc != 0) return 1;
    CHECK(api->set_log_callback(sw, on_log, NULL) == 0, "set_log_callback");
    {
        queen_sweeper_backstop bad;
        memset(&bad, 0, sizeof bad);
        bad.struct_size = sizeof bad;
        CHECK(api->set_backstop(sw, &bad) == QUEEN_SWEEPER_EINVAL, "backstop without sweep accepted");
        CHECK(strstr(api->last_error(), "sweep") != NULL, "backstop message: %s", api->last_error());
        bad.struct_size = 4;
        CHECK(api->set_backstop(sw, &bad) == QUEEN_SWEEPER_EINVAL, "tiny struct_size accepted");
    }
    CHECK(api->start(sw) == 0, "start: %s", api->last_error());
    CHECK(api->start(sw) == QUEEN_SWEEPER_ESTATE, "double start");
    CHECK(api->set_log_callback(sw, on_log, NULL) == QUEEN_SWEEPER_ESTATE, "setter after start");

    /* Wait for the schema and the first cycles. */
    t0 = now_ms();
    while (now_ms() - t0 < 30000 && stat_int(sw, "cycles_total") < 2) {
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    CHECK(stat_int(sw, "cycles_total") >= 2, "no cycles ran: db_state %d", stat_has(sw, "\"db_state\":\"up\""));
    CHECK(stat_has(sw, "\"db_state\":\"up\""), "database not up");

    /* A million wakes for one far-future instant ring the loop about once. */
    signals_before = stat_int(sw, "wake_signals_total");
    wakes = stat_int(sw, "wakes_total");
    t0 = now_ms();
    for (i = 0; i < 1000000; ++i) api->wake(sw, (int64_t)4102444800000LL); /* year 2100 */
    signals_after = stat_int(sw, "wake_signals_total");
    CHECK(stat_int(sw, "wakes_total") - wakes == 1000000, "wakes_total did not count every call");
    CHECK(signals_after - signals_before >= 1 && signals_after - signals_before <= 2,
          "a million far-future wakes rang %lld times", signals_after - signals_before);
    printf("1000000 wakes in %lld ms rang the loop %lld time(s)\n", now_ms() - t0, signals_after - signals_before);

    /* Wakes from several threads at once. */
    for (i = 0; i < 4; ++i) {
        wa[i].sw = sw;
        wa[i].at = (int64_t)4102444800000LL - i;
        wa[i].n = 100000;
        pthread_create(&th[i], NULL, waker, &wa[i]);
    }
    for (i = 0; i < 4; ++i) pthread_join(th[i], NULL);

    /* snprintf semantics: a too-small buffer gets a terminated prefix and the needed size. */
    need = api->stats(sw, NULL, 0);
    CHECK(need > 100, "stats size %lld", (long long)need);
    memset(small, 'x', sizeof small);
    CHECK(api->stats(sw, small, sizeof small) >= need - 64, "stats with a small buffer");
    CHECK(small[sizeof small - 1] == '\0', "prefix not terminated");
    CHECK(strncmp(small, "{\"", 2) == 0, "prefix is not the start of the JSON: %.7s", small);
    CHECK(api->stats(sw, NULL, 5) == QUEEN_SWEEPER_EINVAL, "NULL buffer with a capacity accepted");
    {
        char *m = malloc(1 << 20);
        int64_t mn = api->metrics(sw, m, 1 << 20);
        CHECK(mn > 0 && strstr(m, "queen_sweeper_wake_signals_total") != NULL, "metrics text");
        CHECK(strstr(m, "# TYPE queen_sweeper_fired_total counter") != NULL, "metrics TYPE line");
        free(m);
    }
    CHECK(stat_has(sw, "\"state\":\"running\""), "state running");
    CHECK(!stat_has(sw, "password="), "stats show a password");

    t0 = now_ms();
    rc = api->stop(sw, 5000);
    CHECK(rc == 0, "stop: %d %s", rc, api->last_error());
    /* rc 0 already says the stop finished inside its 5 s by the library's own clock; the
       wall time is printed, never asserted (a loaded machine may stretch it). */
    printf("host_test: graceful stop took %lld ms\n", now_ms() - t0);
    CHECK(api->stop(sw, 5000) == 0, "second stop");
    CHECK(stat_has(sw, "\"state\":\"stopped\""), "state after stop");
    CHECK(stat_int(sw, "loop_close_rc") == 0, "uv_loop_close did not return 0");
    CHECK(stat_has(sw, "\"teardown_clean\":true"), "teardown not clean");
    api->wake(sw, 1); /* after stop: harmless */
    CHECK(logged > 0, "the log callback never ran");
    api->destroy(&sw);
    CHECK(sw == NULL, "destroy did not clear the pointer");

    /* Destroy without stop, on a running sweeper. */
    rc = api->create(config, &sw);
    CHECK(rc == 0 && api->start(sw) == 0, "second sweeper: %s", api->last_error());
    api->destroy(&sw);
    CHECK(sw == NULL, "destroy of a running sweeper");

    dlclose(lib);
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
