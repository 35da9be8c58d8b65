// Hostile configuration input: nesting, sizes, bytes and numbers that used to crash create,
// fail start, or pass silently; passwords in every conninfo form libpq accepts, checked
// against libpq's own parser. Whatever runs on the ABI path runs here on a 256 KiB stack.
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdlib.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/last_error.hpp"
#include "config/config.hpp"
#include "queen_sweeper.h"

using namespace qsw;

namespace {

constexpr size_t kSmallStack = 256 * 1024;

// Runs `f` on a thread whose stack is `stack` bytes: recursion over input overflows it.
void on_small_stack(const std::function<void()> &f, size_t stack = kSmallStack) {
    pthread_attr_t attr;
    ASSERT_EQ(pthread_attr_init(&attr), 0);
    ASSERT_EQ(pthread_attr_setstacksize(&attr, stack), 0);
    pthread_t t;
    auto body = [](void *p) -> void * {
        (*static_cast<const std::function<void()> *>(p))();
        return nullptr;
    };
    ASSERT_EQ(pthread_create(&t, &attr, body, const_cast<std::function<void()> *>(&f)), 0);
    pthread_join(t, nullptr);
    pthread_attr_destroy(&attr);
}

struct EnvGuard {
    std::string name;
    EnvGuard(const char *n, const std::string &v) : name(n) { setenv(n, v.c_str(), 1); }
    ~EnvGuard() { unsetenv(name.c_str()); }
};

// create() through the C ABI, as a host calls it; returns the status and the last error.
int create(const std::string &json, std::string &message) {
    queen_sweeper *sw = nullptr;
    const int rc = queen_sweeper_create(json.c_str(), &sw);
    message = queen_sweeper_last_error();
    queen_sweeper_destroy(&sw);
    return rc;
}

std::string refused(const std::string &json) {
    std::string message;
    EXPECT_EQ(create(json, message), QUEEN_SWEEPER_EINVAL) << json.substr(0, 200);
    EXPECT_EQ(utf8_invalid_at(message), std::string::npos) << message;
    EXPECT_LT(message.size(), 1024u) << "a message is never a copy of unbounded input";
    return message;
}

bool has(const std::string &hay, const std::string &needle) { return hay.find(needle) != std::string::npos; }

std::string nested(const char *open, const char *close, size_t depth) {
    std::string s;
    s.reserve(depth * 2);
    for (size_t i = 0; i < depth; ++i) s += open;
    for (size_t i = 0; i < depth; ++i) s += close;
    return s;
}

// libpq's own reading of a conninfo: the value of `keyword`, or nullopt-like "" + false.
struct Libpq {
    bool ok = false;
    std::string error;
    std::vector<std::pair<std::string, std::string>> options;  // keyword, value (set ones)
    const std::string *get(const std::string &k) const {
        for (const auto &o : options)
            if (o.first == k) return &o.second;
        return nullptr;
    }
};

Libpq libpq_parse(const std::string &ci) {
    Libpq r;
    char *err = nullptr;
    PQconninfoOption *opts = PQconninfoParse(ci.c_str(), &err);
    if (!opts) {
        r.error = err ? err : "";
        PQfreemem(err);
        return r;
    }
    r.ok = true;
    for (PQconninfoOption *o = opts; o->keyword; ++o)
        if (o->val) r.options.emplace_back(o->keyword, o->val);
    PQconninfoFree(opts);
    return r;
}

// The last value my scanner found for `keyword` (libpq keeps the last one).
const std::string *mine(const std::vector<ConninfoSecret> &s, const std::string &keyword) {
    const std::string *r = nullptr;
    for (const auto &x : s)
        if (x.keyword == keyword) r = &x.value;
    return r;
}

// What the plugin does with a conninfo: libpq parses it at connect time (the plugin passes it
// as dbname with expand_dbname), and its error message goes through redact_secrets.
std::string libpq_connect_error(const std::string &ci) {
    const char *keys[] = {"dbname", "connect_timeout", nullptr};
    const char *vals[] = {ci.c_str(), "1", nullptr};
    PGconn *c = PQconnectStartParams(keys, vals, 1);
    std::string msg;
    if (c && PQstatus(c) == CONNECTION_BAD) msg = PQerrorMessage(c);
    PQfinish(c);
    return msg;
}

}  // namespace

// ---- Item 3: no recursion over input ------------------------------------------------------

TEST(ConfigHostile, DeepJsonIsRefusedOnASmallStack) {
    std::vector<std::string> texts = {
        "{\"conninfo\": " + nested("[", "]", 100000) + "}",
        "",  // {"pool_size": {"a":{"a":...1}}}, built below
        "{\"unknown_key\": " + nested("[", "]", 100000) + "}",
        nested("[", "]", 100000),
        "{\"broker_id\": " + nested("[", "]", 100000),  // unterminated as well
    };
    std::string objs;
    for (int i = 0; i < 100000; ++i) objs += "{\"a\":";
    objs += "1";
    for (int i = 0; i < 100000; ++i) objs += "}";
    texts[1] = "{\"pool_size\": " + objs + "}";
    std::vector<std::string> messages(texts.size());
    std::vector<int> codes(texts.size());
    on_small_stack([&] {
        for (size_t i = 0; i < texts.size(); ++i) codes[i] = create(texts[i], messages[i]);
    });
    for (size_t i = 0; i < texts.size(); ++i) {
        EXPECT_EQ(codes[i], QUEEN_SWEEPER_EINVAL) << i;
        EXPECT_LT(messages[i].size(), 512u) << messages[i];
    }
    EXPECT_TRUE(has(messages[0], "config key 'conninfo': JSON nested deeper than 64 levels")) << messages[0];
    EXPECT_TRUE(has(messages[1], "config key 'pool_size': JSON nested deeper than 64 levels")) << messages[1];
    EXPECT_TRUE(has(messages[2], "'unknown_key'")) << messages[2];
    EXPECT_TRUE(has(messages[3], "expected a JSON object, got an array")) << messages[3];
    EXPECT_TRUE(has(messages[4], "config key 'broker_id'")) << messages[4];
}

TEST(ConfigHostile, NestingUpToTheLimitIsAWrongTypeNotACrash) {
    // 63 levels inside the value (64 with the object itself) are read and refused by type.
    auto e = refused("{\"conninfo\": " + nested("[", "]", 63) + "}");
    EXPECT_TRUE(has(e, "config key 'conninfo': expected a string, got an array")) << e;
    e = refused("{\"conninfo\": " + nested("[", "]", 64) + "}");
    EXPECT_TRUE(has(e, "nested deeper than 64 levels")) << e;
    e = refused("{\"sweeper\": {\"password\": \"hunter2\"}}");
    EXPECT_TRUE(has(e, "config key 'sweeper': expected a boolean (true/false, 1/0, yes/no, on/off), got an object"))
        << e;
}

TEST(ConfigHostile, LongPasswordsAreMaskedOnASmallStack) {
    const std::string big(1 << 20, 'S');
    const std::vector<std::string> conninfos = {
        "host=h password=" + big + " user=u",
        "host=h password='" + big + " with spaces' user=u",
        "host=h password=" + big + "\\ escaped",
        "postgresql://u:" + big + "@h/db",
        "postgresql://h/db?password=" + big + "&sslmode=disable",
        "host=h password='" + big,  // unterminated
        "postgresql://u:" + big + "@[::1/db",  // malformed
        std::string(1 << 20, '\\'),
        std::string(1 << 20, '\''),
        "password=" + std::string(1 << 20, '='),
    };
    std::vector<std::string> masked(conninfos.size()), redacted(conninfos.size());
    on_small_stack([&] {
        for (size_t i = 0; i < conninfos.size(); ++i) {
            masked[i] = mask_conninfo(conninfos[i]);
            redacted[i] = redact_secrets("could not connect: \"" + conninfos[i] + "\" " + conninfos[i], conninfos[i]);
        }
    });
    for (size_t i = 0; i < 7; ++i) {
        EXPECT_FALSE(has(masked[i], "SSSS")) << i << ": " << masked[i].substr(0, 200);
        EXPECT_FALSE(has(redacted[i], "SSSS")) << i << ": " << redacted[i].substr(0, 200);
        EXPECT_TRUE(has(masked[i], "*****")) << i;
    }
}

TEST(ConfigHostile, LastErrorIsBoundedValidUtf8WithoutNul) {
    std::string raw = "bad \xff\xfe bytes";
    raw += '\0';
    raw += "after nul";
    set_last_error(raw);
    const std::string got = last_error_cstr();
    EXPECT_EQ(got, "bad \\xFF\\xFE bytes\\u0000after nul");
    set_last_error(std::string(1 << 20, 'x'));
    EXPECT_LT(std::string(last_error_cstr()).size(), 20000u);
    set_last_error("line one\nline two\ttab \xC3\xA9");
    EXPECT_EQ(std::string(last_error_cstr()), "line one\nline two\ttab \xC3\xA9");
    clear_last_error();
}

TEST(ConfigHostile, Utf8ValidationFollowsTheStandard) {
    EXPECT_EQ(utf8_invalid_at("plain"), std::string::npos);
    EXPECT_EQ(utf8_invalid_at("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"), std::string::npos);  // é € 😀
    EXPECT_EQ(utf8_invalid_at("ab\xC0\x80"), 2u);          // overlong NUL
    EXPECT_EQ(utf8_invalid_at("\xE0\x80\x80"), 0u);        // overlong 3-byte
    EXPECT_EQ(utf8_invalid_at("\xED\xA0\x80"), 0u);        // surrogate U+D800
    EXPECT_EQ(utf8_invalid_at("\xF4\x90\x80\x80"), 0u);    // past U+10FFFF
    EXPECT_EQ(utf8_invalid_at("x\xE2\x82"), 1u);           // cut short
    EXPECT_EQ(utf8_invalid_at("\x80"), 0u);                // lone continuation
    EXPECT_EQ(utf8_invalid_at("\xF5\x80\x80\x80"), 0u);
    // printable never splits a sequence at its bound and says how long the whole was.
    EXPECT_EQ(printable("\xC3\xA9\xC3\xA9", 3), "\xC3\xA9... (4 bytes)");
    EXPECT_EQ(printable("a'b\"c\\d\n\x01", 64), "a\\'b\\\"c\\\\d\\n\\u0001");
}

// ---- Item 11: configuration edges ---------------------------------------------------------

TEST(ConfigHostile, InvalidUtf8IsRefusedAtCreateNamingTheSource) {
    {
        EnvGuard g("QUEEN_BROKER_ID", "node\xff\xfe");
        auto e = refused("{}");
        EXPECT_TRUE(has(e, "environment QUEEN_BROKER_ID: invalid UTF-8 at byte 4 of 'node\\xFF\\xFE'")) << e;
    }
    {
        EnvGuard g("QUEEN_LOG_LEVEL", "\xed\xa0\x80");
        auto e = refused("{}");
        EXPECT_TRUE(has(e, "environment QUEEN_LOG_LEVEL: invalid UTF-8 at byte 0")) << e;
    }
    {
        EnvGuard g("QUEEN_SWEEPER", "\xff");
        auto e = refused("{}");
        EXPECT_TRUE(has(e, "environment QUEEN_SWEEPER: expected a boolean")) << e;
        EXPECT_TRUE(has(e, "\\xFF")) << e;
    }
    {
        EnvGuard g("QUEEN_CONNINFO", "host=h password=Hunter2Pw\xff");
        auto e = refused("{}");
        EXPECT_TRUE(has(e, "environment QUEEN_CONNINFO: invalid UTF-8 at byte 25 of a string of 26 bytes")) << e;
        EXPECT_FALSE(has(e, "Hunter2Pw")) << e;
    }
    // In JSON text, the parser refuses it; the message names the key and never quotes the bytes.
    auto e = refused("{\"broker_id\": \"a\xff\"}");
    EXPECT_TRUE(has(e, "config key 'broker_id': invalid JSON at byte")) << e;
    e = refused("{\"conninfo\": \"password=Hunter2Pw\xc0\x80\"}");
    EXPECT_TRUE(has(e, "config key 'conninfo': invalid JSON")) << e;
    EXPECT_FALSE(has(e, "Hunter2Pw")) << e;
    // A lone surrogate escape cannot become UTF-8 either.
    e = refused("{\"broker_id\": \"\\udc00\"}");
    EXPECT_TRUE(has(e, "config key 'broker_id'")) << e;
}

TEST(ConfigHostile, NumbersOutOfRangeAreNamedAsWritten) {
    auto e = refused("{\"pool_size\": 1e400}");
    EXPECT_TRUE(has(e, "config key 'pool_size': 1e400 is out of range [1, 64]")) << e;
    e = refused("{\"pool_size\": -1e400}");
    EXPECT_TRUE(has(e, "config key 'pool_size': -1e400 is out of range [1, 64]")) << e;
    e = refused("{\"pool_size\": 18446744073709551615}");
    EXPECT_TRUE(has(e, "config key 'pool_size': 18446744073709551615 is out of range [1, 64]")) << e;
    e = refused("{\"pool_size\": 9223372036854775808}");
    EXPECT_TRUE(has(e, "9223372036854775808 is out of range")) << e;
    e = refused("{\"pool_size\": 99999999999999999999999}");
    EXPECT_TRUE(has(e, "99999999999999999999999 is out of range")) << e;
    e = refused("{\"pool_size\": -9223372036854775809}");
    EXPECT_TRUE(has(e, "-9223372036854775809 is out of range")) << e;
    // Doubles outside int64 are refused before any conversion (undefined behaviour under UBSan).
    for (const char *v : {"1e19", "-1e19", "9.3e18", "1e300", "-1.7976931348623157e308", "9223372036854775807.0"}) {
        e = refused(std::string("{\"sweeper_lease_ms\": ") + v + "}");
        EXPECT_TRUE(has(e, std::string("config key 'sweeper_lease_ms': ") + v + " is out of range")) << e;
    }
    e = refused("{\"sweeper_claim_batch\": 1.5}");
    EXPECT_TRUE(has(e, "config key 'sweeper_claim_batch': expected an integer, got 1.5")) << e;
    e = refused("{\"pool_size\": 1e-400}");  // underflows to 0, written as is
    EXPECT_TRUE(has(e, "1e-400 is out of range [1, 64]")) << e;
    // A big number for a key that takes no number, and one the library cannot hold, for an
    // unknown key: each named.
    e = refused("{\"sweeper\": 1e400}");
    EXPECT_TRUE(has(e, "config key 'sweeper': expected a boolean (true/false, 1/0, yes/no, on/off), got 1e400")) << e;
    e = refused("{\"nope\": 1e400}");
    EXPECT_TRUE(has(e, "config key 'nope': unknown key")) << e;
    // A thousand digits are shown as a bounded prefix.
    e = refused("{\"pool_size\": 1" + std::string(1000, '0') + "}");
    EXPECT_TRUE(has(e, "config key 'pool_size': 1000000")) << e;
    EXPECT_TRUE(has(e, "(1001 bytes) is out of range")) << e;
    // From the environment too.
    EnvGuard g("QUEEN_POOL_SIZE", "99999999999999999999");
    e = refused("{}");
    EXPECT_TRUE(has(e, "environment QUEEN_POOL_SIZE: '99999999999999999999' is out of range [1, 64]")) << e;
}

TEST(ConfigHostile, IntegralDoublesAndNegativeZeroAreTheirIntegers) {
    Config c;
    std::string err;
    ASSERT_TRUE(parse_config("{\"read_env\": false, \"pool_size\": 8.0, \"sweeper_empty_claim_min_ms\": -0,"
                             " \"sweeper_idle_after_cycles\": -0.0, \"sweeper_claim_batch\": 1e3}",
                             c, err))
        << err;
    EXPECT_EQ(c.pool_size, 8);
    EXPECT_EQ(c.sweeper_empty_claim_min_ms, 0);
    EXPECT_EQ(c.sweeper_idle_after_cycles, 0);
    EXPECT_EQ(c.sweeper_claim_batch, 1000);
    auto e = refused("{\"pool_size\": -0.0}");
    EXPECT_TRUE(has(e, "config key 'pool_size': -0.0 is out of range [1, 64]")) << e;
}

// The design document: a zero floor would be a busy wait holding a maintenance slot and a
// pooled connection. Refused, naming the key, from JSON and from the environment alike.
TEST(ConfigHostile, AZeroSleepFloorIsRefused) {
    auto e = refused("{\"sweeper_min_sleep_ms\": 0}");
    EXPECT_TRUE(has(e, "config key 'sweeper_min_sleep_ms': 0 is out of range [1, 3600000]")) << e;
    EnvGuard g("QUEEN_SWEEPER_MIN_SLEEP_MS", "0");
    e = refused("{}");
    EXPECT_TRUE(has(e, "environment QUEEN_SWEEPER_MIN_SLEEP_MS: '0' is out of range [1, 3600000]")) << e;
    Config c;
    std::string err;
    ASSERT_TRUE(parse_config("{\"read_env\": false, \"sweeper_min_sleep_ms\": 1}", c, err)) << err;
    EXPECT_EQ(c.sweeper_min_sleep_ms, 1);
}

TEST(ConfigHostile, BooleansTakeTheNumbersTheMessageLists) {
    Config c;
    std::string err;
    ASSERT_TRUE(parse_config("{\"read_env\": false, \"sweeper\": 0, \"apply_schema\": 1}", c, err)) << err;
    EXPECT_FALSE(c.sweeper);
    EXPECT_TRUE(c.apply_schema);
    for (const char *v : {"2", "-1", "1.0", "0.5", "null", "[true]", "\"\""}) {
        auto e = refused(std::string("{\"apply_schema\": ") + v + "}");
        EXPECT_TRUE(has(e, "config key 'apply_schema': expected a boolean (true/false, 1/0, yes/no, on/off), got"))
            << e;
    }
}

TEST(ConfigHostile, KeysAreNamedWhateverTheyHold) {
    auto e = refused(std::string("{\"pool\\u0000size\": 4}"));
    EXPECT_TRUE(has(e, "config key 'pool\\u0000size': unknown key")) << e;
    e = refused("{\"pool_size\\n\": 4}");
    EXPECT_TRUE(has(e, "config key 'pool_size\\n': unknown key")) << e;
    e = refused("{\"" + std::string(100000, 'k') + "\": 4}");
    EXPECT_TRUE(has(e, "(100000 bytes)': unknown key")) << e;
    e = refused("{\"it's\": 4}");
    EXPECT_TRUE(has(e, "config key 'it\\'s': unknown key")) << e;
}

TEST(ConfigHostile, DuplicateKeysAreRefused) {
    auto e = refused("{\"pool_size\": 4, \"pool_size\": 8}");
    EXPECT_TRUE(has(e, "config key 'pool_size': given more than once")) << e;
    e = refused("{\"read_env\": false, \"sweeper\": true, \"read_env\": true}");
    EXPECT_TRUE(has(e, "config key 'read_env': given more than once")) << e;
    // Keys repeated inside a nested value are the value's business: it is refused by type.
    e = refused("{\"broker_id\": {\"a\": 1, \"a\": 2}}");
    EXPECT_TRUE(has(e, "config key 'broker_id': expected a string, got an object")) << e;
}

TEST(ConfigHostile, StringsAreBoundedAndFreeOfControlCharacters) {
    auto e = refused("{\"broker_id\": \"node\\n1\"}");
    EXPECT_TRUE(has(e, "config key 'broker_id': control character \\u000A at byte 4 of 'node\\n1'")) << e;
    e = refused("{\"broker_id\": \"a\\u0000b\"}");
    EXPECT_TRUE(has(e, "config key 'broker_id': control character \\u0000 at byte 1")) << e;
    e = refused("{\"broker_id\": \"a\\u007fb\"}");
    EXPECT_TRUE(has(e, "control character \\u007F")) << e;
    e = refused("{\"broker_id\": \"" + std::string(1025, 'b') + "\"}");
    EXPECT_TRUE(has(e, "config key 'broker_id': 1025 bytes is longer than the limit of 1024 bytes")) << e;
    e = refused("{\"conninfo\": \"" + std::string(64 * 1024 + 1, 'c') + "\"}");
    EXPECT_TRUE(has(e, "config key 'conninfo': 65537 bytes is longer than the limit of 65536 bytes")) << e;
    e = refused("{\"conninfo\": \"host=h password=Hunter2Pw\\u0000\"}");
    EXPECT_TRUE(has(e, "config key 'conninfo': control character \\u0000 at byte 25 of a string of 26 bytes")) << e;
    EXPECT_FALSE(has(e, "Hunter2Pw")) << e;
    e = refused("{\"log_level\": \"" + std::string(100000, 'v') + "\"}");
    EXPECT_TRUE(has(e, "config key 'log_level'")) << e;
    e = refused("{\"log_level\": \"loud\\u0001\"}");
    EXPECT_TRUE(has(e, "config key 'log_level'")) << e;
    // A conninfo keeps its white space: newlines and tabs separate libpq keywords.
    Config c;
    std::string err;
    ASSERT_TRUE(parse_config("{\"read_env\": false, \"conninfo\": \"host=h\\n\\tdbname=d\"}", c, err)) << err;
    EXPECT_EQ(c.conninfo, "host=h\n\tdbname=d");
}

TEST(ConfigHostile, SyntaxErrorsNeverQuoteTheInput) {
    auto e = refused("{\"conninfo\": \"password=Hunter2Pw\" \"x\"}");
    EXPECT_TRUE(has(e, "invalid JSON at byte")) << e;
    EXPECT_FALSE(has(e, "Hunter2Pw")) << e;
    e = refused("{\"conninfo\": \"password=Hunter2Pw");
    EXPECT_TRUE(has(e, "config key 'conninfo': invalid JSON")) << e;
    EXPECT_FALSE(has(e, "Hunter2Pw")) << e;
    e = refused("{\"pool_size\": 4} trailing");
    EXPECT_TRUE(has(e, "config: invalid JSON at byte")) << e;
    e = refused("{\"pool_size\": 4,}");
    EXPECT_TRUE(has(e, "invalid JSON")) << e;
    e = refused("7");
    EXPECT_TRUE(has(e, "config: expected a JSON object, got a number")) << e;
}

// ---- Item 10: secrets ---------------------------------------------------------------------

TEST(ConfigSecrets, WrongJsonTypeForConninfoNeverEchoesIt) {
    for (const char *v : {"[\"host=h password=Hunter2Pw\"]", "{\"password\": \"Hunter2Pw\"}", "12345678",
                          "[\"Hunter2Pw\", {\"x\": \"Hunter2Pw\"}]", "true"}) {
        auto e = refused(std::string("{\"conninfo\": ") + v + "}");
        EXPECT_TRUE(has(e, "config key 'conninfo': expected a string, got")) << e;
        EXPECT_FALSE(has(e, "Hunter2Pw")) << e;
        EXPECT_FALSE(has(e, "12345678")) << e;
    }
    EnvGuard g("QUEEN_CONNINFO", std::string("password=Hunter2Pw") + std::string(70000, ' '));
    auto e = refused("{}");
    EXPECT_TRUE(has(e, "environment QUEEN_CONNINFO: 70018 bytes is longer")) << e;
    EXPECT_FALSE(has(e, "Hunter2Pw")) << e;
}

// Every form libpq accepts, checked against PQconninfoParse: the scanner finds the value libpq
// uses, and the masked string, parsed again by libpq, has ***** for it and everything else
// unchanged.
TEST(ConfigSecrets, ScannerAgreesWithLibpqOnEveryForm) {
    const std::vector<std::string> forms = {
        "host=h password=secret user=u",
        "password=secret",
        "host=h password = 'se cret' user=u",
        "host=h password='it\\'s' user=u",
        "host=h password=se\\ cret user=u",
        "host=h password=a\\\\b user=u",
        "host=h password='' user=u",
        "host=h password= user=u",
        "host=h\tpassword\t=\tsecret\nuser=u",
        "password='x'host=h",
        "password=first password=second",
        "host=h sslpassword=keypass password=pw",
        "dbname='host=x password=inner' password=outer",
        "host=h user=u dbname=d",
        "postgresql://u:secret@h/db",
        "postgres://u:secret@h:5432/db",
        "postgresql://u:se%20cr%40et@h/db",
        "postgresql://u:secret@h1:5432,h2:5433,[::1]:5434/db?sslmode=disable",
        "postgresql://u:secret@[::1]/db",
        "postgresql://u@h/db?password=secret",
        "postgresql://h/db?password=se%26cret&user=u",
        "postgresql://h/db?pass%77ord=secret",
        "postgresql://h/db?password=first&password=second",
        "postgresql://u:pw1@h/db?password=pw2",
        "postgresql://h/db?sslpassword=keypass&application_name=a",
        "postgresql://u:@h/db",
        "postgresql://:secret@h/db",
        "postgresql://u:pa:ss@h/db",
        "postgresql://u:p?w@h/db",
        "postgresql://u:se/cret@h/db",
        "postgresql://",
        "postgresql://h",
        "postgresql:///db?host=/tmp&password=sock",
        "postgresql://u:secret@/db",
        "postgresql://h/db?ssl=true&password=x%2By",
        "just_a_dbname",
    };
    for (const auto &ci : forms) {
        SCOPED_TRACE(ci);
        const Libpq lib = libpq_parse(ci);
        std::vector<ConninfoSecret> found;
        const bool ok = conninfo_secrets(ci, found);
        if (ci == "just_a_dbname") {
            EXPECT_TRUE(ok);
            EXPECT_TRUE(found.empty());
            continue;  // libpq reads it only as a dbname when expanding
        }
        ASSERT_TRUE(lib.ok) << lib.error;
        EXPECT_TRUE(ok);
        for (const char *kw : {"password", "sslpassword"}) {
            const std::string *theirs = lib.get(kw);
            const std::string *ours = mine(found, kw);
            if (!theirs) {
                EXPECT_TRUE(!ours || ours->empty()) << kw;
                continue;
            }
            ASSERT_TRUE(ours) << kw << " libpq: " << *theirs;
            EXPECT_EQ(*ours, *theirs) << kw;
        }
        const std::string masked = mask_conninfo(ci);
        const Libpq again = libpq_parse(masked);
        ASSERT_TRUE(again.ok) << masked << ": " << again.error;
        if (ci.find("se/cret") != std::string::npos) continue;  // masked generously, see below
        for (const auto &[k, v] : lib.options) {
            const std::string *w = again.get(k);
            ASSERT_TRUE(w) << masked << " lost " << k;
            if (k == "password" || k == "sslpassword") {
                EXPECT_TRUE(*w == "*****" || (v.empty() && w->empty())) << masked;
            } else {
                EXPECT_EQ(*w, v) << masked << " changed " << k;
            }
        }
    }
}

// A password holding '/' is not one to libpq (it reads a port); the mask hides it all the same.
TEST(ConfigSecrets, UserinfoIsMaskedGenerously) {
    EXPECT_EQ(mask_conninfo("postgresql://u:se/cret@h/db"), "postgresql://u:*****@h/db");
    EXPECT_EQ(mask_conninfo("postgresql://u:p@ss@h/db"), "postgresql://u:*****@h/db");
    EXPECT_EQ(mask_conninfo("postgresql://h:5432/db?user=a@b"), "postgresql://h:5432/db?user=a@b");
}

TEST(ConfigSecrets, MalformedConninfoIsMaskedConservatively) {
    const std::vector<std::string> bad = {
        "postgresql://u:Hunter2Pw@[::1/db",
        "postgresql://u:Hunter2Pw@[]/db",
        "postgresql://u:Hunter2Pw@[::1]x/db",
        "postgresql://u:Hunter%2Pw@h/db",
        "postgresql://u:Hunter2Pw%00@h/db",
        "postgresql://h/db?password=Hunter2Pw=more",
        "postgresql://h/db?password=Hunter%zz2Pw",
        "postgresql://h/db?password",
        "postgresql://h/db?sslmode=disable&password=Hunter2Pw&junk",
        "host=h password=Hunter2 Pw user=u",
        "host=h password=Hunter2Pw junk",
        "host=h password='Hunter2Pw",
        "host=h password='Hunter2Pw\\'",
        "password",
        "host=h PASSWORD=Hunter2Pw",
    };
    for (const auto &ci : bad) {
        SCOPED_TRACE(ci);
        const std::string masked = mask_conninfo(ci);
        EXPECT_FALSE(has(masked, "Hunter")) << masked;
        EXPECT_FALSE(has(masked, "2Pw")) << masked;
        // libpq's own message, through the plugin's redaction.
        const std::string msg = libpq_connect_error(ci);
        const std::string clean = redact_secrets(msg, ci);
        EXPECT_FALSE(has(clean, "Hunter")) << msg << " -> " << clean;
        EXPECT_FALSE(has(clean, "2Pw")) << msg << " -> " << clean;
        EXPECT_FALSE(libpq_parse(ci).ok);
        std::vector<ConninfoSecret> found;
        if (ci != "password") EXPECT_FALSE(conninfo_secrets(ci, found));  // else a plain dbname
    }
    // The split-password case: libpq names the second word alone.
    const std::string ci = "host=h password=first secondhalf";
    const std::string msg = libpq_connect_error(ci);
    ASSERT_TRUE(has(msg, "secondhalf")) << "libpq quotes the word it could not read: " << msg;
    EXPECT_FALSE(has(redact_secrets(msg, ci), "secondhalf")) << redact_secrets(msg, ci);
}

TEST(ConfigSecrets, RedactionRemovesDecodedAndEscapedForms) {
    const std::string ci = "postgresql://u:Hunter%32Pw@h/db";
    EXPECT_EQ(redact_secrets("auth failed for Hunter2Pw and Hunter%32Pw", ci), "auth failed for ***** and *****");
    const std::string kw = "host=h password=Hunter\\ 2Pw";
    EXPECT_FALSE(has(redact_secrets("value 'Hunter 2Pw' / Hunter\\ 2Pw", kw), "Hunter")) ;
    // Patterns are masked whatever conninfo says.
    EXPECT_EQ(redact_secrets("retry with password=abc user=x", ""), "retry with password=***** user=x");
    EXPECT_EQ(redact_secrets("URI \"postgresql://me:abc@host/db\" bad", ""), "URI \"postgresql://me:*****@host/db\" bad");
    EXPECT_EQ(redact_secrets("sslpassword : 'a b c' rest", ""), "sslpassword : ***** rest");
    // Nothing to hide, nothing changed; a short password is hidden where a pattern shows it.
    EXPECT_EQ(redact_secrets("connection refused", "host=h password=ab"), "connection refused");
    EXPECT_EQ(redact_secrets("", "host=h password=abcdef"), "");
    // The stats/JSON view never has it.
    Config c;
    std::string err;
    ASSERT_TRUE(parse_config("{\"read_env\": false, \"conninfo\": \"host=x password=hunter\\\\ 22\"}", c, err)) << err;
    EXPECT_FALSE(has(c.to_json().dump(), "hunter")) << c.to_json().dump();
    EXPECT_FALSE(has(c.to_json().dump(), " 22")) << c.to_json().dump();
}

// Random strings built from the characters that matter to both grammars, each with a marker
// in its password: wherever libpq parses it, the scanner agrees on the value; whatever libpq
// says about it, neither the mask nor the redacted message shows the marker.
TEST(ConfigSecrets, RandomConninfosAgreeWithLibpqAndNeverLeak) {
    std::mt19937 rng(20261130);
    const std::vector<std::string> pieces = {" ", "'", "\\", "=", "@", ":", "/", "?", "&", "%", "%41", "%2", ",",
                                             "[", "]", "a", "b", "Zq", "\t", "\\ ", "\\'"};
    auto noise = [&](int max) {
        std::string s;
        const int n = static_cast<int>(rng() % (max + 1));
        for (int i = 0; i < n; ++i) s += pieces[rng() % pieces.size()];
        return s;
    };
    const std::string marker = "Mk7Mk";
    int libpq_ok = 0, libpq_failed = 0;
    for (int i = 0; i < 20000; ++i) {
        std::string ci;
        const std::string pw = noise(3) + marker + noise(3);
        switch (rng() % 6) {
        case 0: ci = "host=h" + noise(2) + " password=" + pw + " user=u"; break;
        case 1: ci = "password='" + pw + "'" + noise(2); break;
        case 2: ci = "postgresql://u:" + pw + "@h" + noise(2) + "/db"; break;
        case 3: ci = "postgres://" + noise(2) + "h/db?password=" + pw + "&user=u"; break;
        case 4: ci = "postgresql://u" + noise(2) + ":" + pw + "@[::1]:5432/db?sslmode=disable"; break;
        default: ci = "host=h sslpassword = " + pw + noise(2); break;
        }
        SCOPED_TRACE(ci);
        const Libpq lib = libpq_parse(ci);
        std::vector<ConninfoSecret> found;
        const bool ok = conninfo_secrets(ci, found);
        if (lib.ok) {
            ++libpq_ok;
            ASSERT_TRUE(ok);
            for (const char *kw : {"password", "sslpassword"}) {
                const std::string *theirs = lib.get(kw);
                const std::string *ours = mine(found, kw);
                if (theirs && !theirs->empty()) {
                    ASSERT_TRUE(ours) << kw;
                    ASSERT_EQ(*ours, *theirs) << kw;
                }
            }
        } else {
            ++libpq_failed;
            // Where libpq refuses the string, so does the scanner: it then masks generously.
            ASSERT_FALSE(ok) << lib.error;
            // libpq refused it before any network: its message is what the plugin would store.
            const std::string msg = libpq_connect_error(ci);
            ASSERT_FALSE(has(redact_secrets(msg, ci), marker)) << msg;
        }
        // Noise can move the marker out of the password (an escaped space makes it part of
        // host=): where libpq reads it as no secret, the mask follows libpq and keeps it.
        bool secret_to_libpq = !lib.ok;
        for (const char *kw : {"password", "sslpassword"})
            if (lib.ok && lib.get(kw) && has(*lib.get(kw), marker)) secret_to_libpq = true;
        if (!secret_to_libpq) continue;
        const std::string masked = mask_conninfo(ci);
        ASSERT_FALSE(has(masked, marker)) << masked;
    }
    // Both sides of the grammar were exercised.
    EXPECT_GT(libpq_ok, 1000);
    EXPECT_GT(libpq_failed, 1000);
}
