"""Undeliverable values and SQL edges refused at the door (issue 8, items 1, 8 and 12).

Every refusal here is SQLSTATE 22023 with a message naming the field and the limit, and
writes nothing: a refused op in a batch takes the valid ops before it down with it. Each
case is a value that was accepted before (and reached the DLQ attempts later, or blew up
the sweeper's memory at fire time) or that failed with another SQLSTATE (54000 for an
index row, 0A000 for an infinite now, 22003 / 22008 for overflows)."""
import base64
import json
import os
import time

import psycopg2
import pytest

from queenkit import stand_in_hash
from sqlkit import NOW, T1, ZSTD_REAL, ZSTD_REAL_PLAIN, ms, zstd_frame

MIB = 1048576


def b64(data):
    return base64.b64encode(data).decode()


def sched(key="k", payload=b"{}", **kw):
    op = {"op": "schedule", "queue": "q", "timerKey": key, "delayMs": 0, "txn": "t-" + key,
          "payload": b64(payload)}
    op.update(kw)
    return op


def written(q):
    return q.one("SELECT (SELECT count(*) FROM queen.log_timers) + (SELECT count(*) FROM queen.kv)"
                 " + (SELECT count(*) FROM queen.log_segments) + (SELECT count(*) FROM queen.queues)")


def refused(q, sql, args, *fragments):
    """Runs sql, expects 22023 with every fragment in the primary message and nothing
    written; returns the message."""
    before = written(q)
    with pytest.raises(psycopg2.Error) as e:
        q.exec(sql, args)
    assert e.value.pgcode == "22023", (e.value.pgcode, e.value.pgerror)
    msg = e.value.diag.message_primary
    for frag in fragments:
        assert frag in msg, (frag, msg)
    assert written(q) == before, "a refused call wrote something"
    return msg


APPLY = "SELECT queen.log_timers_apply_v1(%s::jsonb, %s, %s, %s)"


def refused_apply(q, ops, *fragments, producer_sub="p", now=NOW):
    # A valid op first: the whole batch is refused, it included.
    return refused(q, APPLY, (json.dumps([sched("valid-first")] + ops), T1, producer_sub, now),
                   *fragments)


# ---------------------------------------------------------------------------------------
# Lengths the segment frame carries as u16, and names that are index keys
# ---------------------------------------------------------------------------------------

def test_txn_over_the_u16_frame_limit(q):
    refused_apply(q, [sched("a", txn="t" * 65536)], "ops[1].txn", "65536 bytes", "65535-byte limit")
    # The limit itself is accepted (and so deliverable).
    assert q.apply([sched("a", txn="t" * 65535)])[0]["status"] == "scheduled"


def test_txn_limit_counts_bytes_not_characters(q):
    refused_apply(q, [sched("a", txn="é" * 32768)], "ops[1].txn", "65536 bytes", "65535")


def test_producer_sub_over_the_u16_frame_limit(q):
    refused_apply(q, [sched("a")], "producer_sub", "70000 bytes", "65535-byte limit",
                  producer_sub="s" * 70000)
    assert q.apply([sched("a")], producer_sub="s" * 65535)[0]["status"] == "scheduled"


@pytest.mark.parametrize("field,limit", [("queue", 512), ("partition", 512), ("timerKey", 1024)])
def test_names_over_their_index_key_limit(q, field, limit):
    # Incompressible text: before, this failed with 54000 (index row size) at the insert.
    value = os.urandom(1500).hex()
    refused_apply(q, [sched("a", **{field: value})], "ops[1].%s" % field, "3000 bytes",
                  "%d-byte limit" % limit)
    ok = sched("a", **{field: "n" * limit})
    assert q.apply([ok])[0]["status"] == "scheduled"


def test_name_limits_hold_on_cancel_and_reschedule_too(q):
    key = "k" * 1025
    refused_apply(q, [{"op": "cancel", "queue": "q", "timerKey": key}], "ops[1].timerKey", "1024")
    refused_apply(q, [{"op": "reschedule", "queue": "q", "timerKey": key, "delayMs": 1}],
                  "ops[1].timerKey", "1024")


# ---------------------------------------------------------------------------------------
# payloadZstd: one zstd frame that declares a content size within the payload limit
# ---------------------------------------------------------------------------------------

def rle_frame(size, **kw):
    """A frame that inflates to `size` zero bytes from a few dozen stored bytes."""
    blocks = []
    left = size
    while left > 0:
        n = min(left, 131072)
        blocks.append(("rle", 0, n))
        left -= n
    return zstd_frame(blocks, size, **kw)


ZSTD_REFUSALS = [
    ("not zstd at all", b"zz", "not a zstd frame"),
    ("empty", b"", "not a zstd frame"),
    ("skippable frame", bytes.fromhex("502a4d18") + b"\x00\x00\x00\x00", "not a zstd frame"),
    ("content size absent", zstd_frame([("raw", b"abc")], None), "does not declare its content size"),
    ("bomb: 1 GiB declared", zstd_frame([("rle", 0, 131072)], 1 << 30), "declares 1073741824 bytes"),
    ("one byte over the limit", rle_frame(MIB + 1), "declares 1048577 bytes"),
    ("bomb behind a small first frame",
     zstd_frame([("raw", b"ok")], 2, trailing=rle_frame(MIB)), "follow the end of the zstd frame"),
    ("dictionary", zstd_frame([("raw", b"abc")], 3, dict_id=7), "dictionary"),
    ("reserved bit", zstd_frame([("raw", b"abc")], 3, reserved=True), "reserved bit"),
    ("reserved block type", zstd_frame([("type", 3, 3, b"abc")], 3), "reserved block type"),
    ("block over 128 KiB", zstd_frame([("rle", 0, 131073)], 131073), "block maximum"),
    ("blocks regenerate more than declared", zstd_frame([("raw", b"abcdef")], 3), "regenerate more"),
    ("truncated header", ZSTD_REAL[:6], "truncated"),
    ("truncated block", ZSTD_REAL[:20], "truncated"),
    ("truncated checksum", ZSTD_REAL[:-2], "checksum"),
    ("no last block", zstd_frame([("raw", b"ab")], 2)[:-2] + b"", "truncated"),
    ("too many blocks", zstd_frame([("raw", b"")] * 4097, 0), "more than 4096 blocks"),
]


@pytest.mark.parametrize("name,payload,why", ZSTD_REFUSALS, ids=[c[0] for c in ZSTD_REFUSALS])
def test_payload_zstd_that_the_sweeper_could_not_inflate_within_the_limit(q, name, payload, why):
    msg = refused_apply(q, [sched("a", payload=payload, payloadZstd=True)], "ops[1].payload",
                        why, "1048576")
    assert "payloadZstd" in msg


def test_payload_zstd_refused_on_reschedule_as_well(q):
    q.apply([sched("a")])
    before = q.timer("a")
    refused_apply(q, [{"op": "reschedule", "queue": "q", "timerKey": "a", "delayMs": 5,
                       "payload": b64(zstd_frame([("raw", b"x")], None)), "payloadZstd": True}],
                  "ops[1].payload", "content size", "1048576")
    assert q.timer("a") == before


@pytest.mark.parametrize("payload", [
    ZSTD_REAL,                                                   # the zstd command line's own
    rle_frame(MIB),                                              # exactly at the limit
    zstd_frame([("raw", b"hello"), ("rle", 33, 10)], 15),         # raw and RLE blocks
    zstd_frame([("raw", b"abc")], 3, single=False),              # with a window descriptor
    zstd_frame([("raw", b"a" * 300)], 300, fcs_len=2),           # 2-byte size (+256)
    zstd_frame([("raw", b"abc")], 3, fcs_len=8),
    zstd_frame([("raw", b"")], 0),                               # an empty content
], ids=["zstd-cli", "rle-1MiB", "raw-and-rle", "window", "fcs2", "fcs8", "empty-content"])
def test_valid_zstd_frames_are_accepted(q, payload):
    r = q.apply([sched("a", payload=payload, payloadZstd=True)])[0]
    assert r["status"] == "scheduled"
    assert bytes(q.timer("a")["payload"]) == payload


def test_zstd_check_is_cheap_on_a_hostile_megabyte(connections):
    """Not a timing assertion: the worst walk (4096 empty blocks) is printed for the record."""
    # Measured through the function on its own so the figure is the check, not the apply.
    conn = connections()
    try:
        worst = zstd_frame([("raw", b"")] * 4096, 0)
        with conn.cursor() as cur:
            t0 = time.perf_counter()
            cur.execute("SELECT queen.zstd_frame_problem_v1(%s, 1048576)", (psycopg2.Binary(worst),))
            assert cur.fetchone()[0] is None
            t1 = time.perf_counter()
            cur.execute("SELECT queen.zstd_frame_problem_v1(%s, 1048576)",
                        (psycopg2.Binary(ZSTD_REAL),))
            assert cur.fetchone()[0] is None
            t2 = time.perf_counter()
        print("\nzstd_frame_problem_v1: 4096 blocks %.1f ms, one real block %.2f ms"
              % ((t1 - t0) * 1000, (t2 - t1) * 1000))
    finally:
        conn.close()


def test_zstd_real_fixture_is_what_it_claims():
    # The hard-coded frame declares the size of its plain text (bytes 5-6, + 256).
    assert ZSTD_REAL[:4] == b"\x28\xb5\x2f\xfd"
    assert int.from_bytes(ZSTD_REAL[5:7], "little") + 256 == len(ZSTD_REAL_PLAIN)


def test_encrypted_with_an_empty_payload(q):
    refused_apply(q, [sched("a", payload=b"", encrypted=True)], "ops[1].encrypted", "empty payload",
                  "at least 1 byte")
    assert q.apply([sched("a", payload=b"c", encrypted=True)])[0]["status"] == "scheduled"


# ---------------------------------------------------------------------------------------
# Payload size: refused fast, before any scan of the text
# ---------------------------------------------------------------------------------------

def test_64_mib_payload_is_refused_without_scanning_it(q):
    text = "A" * (64 * MIB)
    ops = json.dumps([sched("valid-first"), {"op": "schedule", "queue": "q", "timerKey": "big",
                                             "delayMs": 0, "txn": "t", "payload": text}])
    t0 = time.perf_counter()
    msg = refused(q, APPLY, (ops, T1, "p", NOW), "ops[1].payload", "67108864 characters",
                  "1048576", "2097152")
    took = time.perf_counter() - t0
    assert "base64" in msg
    # The same argument sent and parsed as jsonb, nothing else: what any call costs.
    t0 = time.perf_counter()
    assert q.one("SELECT pg_column_size(%s::jsonb) > 0", (ops,))
    floor = time.perf_counter() - t0
    print("\n64 MiB payload: refused in %.3f s; sending and parsing the argument alone %.3f s"
          " (ratio %.2f)" % (took, floor, took / floor))


def test_payload_just_over_the_limit_after_decoding(q):
    refused_apply(q, [sched("a", payload=b"x" * (MIB + 1))], "ops[1].payload", "1048576")
    assert q.apply([sched("a", payload=b"x" * MIB)])[0]["status"] == "scheduled"


# ---------------------------------------------------------------------------------------
# now and delays
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("now", ["infinity", "-infinity", "10000-01-01 00:00:00+00",
                                 "1969-12-31 23:59:59+00", "294276-12-01 00:00:00+00"])
def test_apply_now_outside_the_accepted_range(q, now):
    for op in (sched("a"), {"op": "cancel", "queue": "q", "timerKey": "a"},
               {"op": "reschedule", "queue": "q", "timerKey": "a", "delayMs": 1}):
        refused(q, "SELECT queen.log_timers_apply_v1(%s::jsonb, %s, 'p', %s::timestamptz)",
                (json.dumps([op]), T1, now), "now", "[1970-01-01, 10000-01-01)")


def test_huge_delays(q):
    msg = refused_apply(q, [sched("a", delayMs=10 ** 300)], "ops[1].delayMs", "7776000000")
    assert len(msg) < 300, msg                      # the number is quoted, not spelled out
    r = q.apply([sched("a", delayMs=-10 ** 300)])[0]     # a negative delay counts as 0
    assert r["status"] == "scheduled" and q.timer("a")["deliver_at"] == NOW


# ---------------------------------------------------------------------------------------
# The other functions a host calls
# ---------------------------------------------------------------------------------------

KV_PUT = "SELECT queen.kv_put_v1(%s, 'ns', 'k', %s::jsonb, %s, %s, %s::timestamptz)"


def test_kv_put_ttl_that_would_overflow(q):
    # Before: 22008 interval out of range.
    refused(q, KV_PUT, (T1, "1", 2 ** 63 - 1, None, NOW), "ttl_ms", "3153600000000")
    assert q.put("k", 1, ttl_ms=3153600000000)["expiresAt"] is not None


@pytest.mark.parametrize("now", ["infinity", "-infinity", "12000-01-01 00:00:00+00"])
def test_kv_now_outside_the_accepted_range(q, now):
    refused(q, KV_PUT, (T1, "1", None, True, now), "kv_put_v1", "now", "[1970-01-01, 10000-01-01)")
    refused(q, "SELECT queen.kv_get_v1(%s, 'ns', 'k', %s::timestamptz)", (T1, now),
            "kv_get_v1", "now", "10000-01-01")
    refused(q, "SELECT queen.kv_delete_v1(%s, 'ns', 'k', %s::timestamptz)", (T1, now),
            "kv_delete_v1", "now", "10000-01-01")


def test_kv_value_far_over_the_limit_is_refused_at_once(q):
    value = json.dumps({"v": "x" * (20 * MIB)})
    t0 = time.perf_counter()
    refused(q, KV_PUT, (T1, value, None, True, NOW), "value", "1 MiB")
    took = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert q.one("SELECT pg_column_size(%s::jsonb) > 0", (value,))
    floor = time.perf_counter() - t0
    print("\n20 MiB kv value: refused in %.3f s; sending and parsing it alone %.3f s (ratio %.2f)"
          % (took, floor, took / floor))


def test_kv_maintenance_now_outside_the_accepted_range(q):
    refused(q, "SELECT queen.kv_expire_step_v1(NULL, 'infinity', 10)", (), "kv_expire_step_v1", "now")
    refused(q, "SELECT queen.kv_usage_step_v2(NULL, '-infinity', 10, NULL)", (), "kv_usage_step_v2", "now")


PUSH = "SELECT queen.log_push_v1(%s, %s, %s, %s, %s, %s, %s::timestamptz)"


def test_log_push_count_that_overflowed_int(q):
    # Before: 22003 integer out of range (16 * count in int).
    refused(q, PUSH, (T1, "q", "p", 2000000000, psycopg2.Binary(b"\0" * 16), psycopg2.Binary(b"b"), NOW),
            "hashes", "32000000000")


@pytest.mark.parametrize("field", ["queue", "partition"])
def test_log_push_names_over_their_index_key_limit(q, field):
    names = {"queue": "q", "partition": "p"}
    names[field] = os.urandom(300).hex()
    refused(q, PUSH, (T1, names["queue"], names["partition"], 1, psycopg2.Binary(stand_in_hash("t")),
                      psycopg2.Binary(b"b"), NOW), "log_push_v1: %s" % field, "600 bytes", "512-byte limit")


def test_log_push_now_outside_the_accepted_range(q):
    refused(q, PUSH, (T1, "q", "p", 1, psycopg2.Binary(stand_in_hash("t")), psycopg2.Binary(b"b"), "infinity"),
            "log_push_v1", "now", "10000-01-01")


def test_reads_of_names_that_cannot_exist_answer_absent(q):
    """peek and list never write and a name over the limit can never have been stored:
    they answer absent / empty, not an error."""
    q.apply([sched("a")])
    huge = os.urandom(4000).hex()
    assert q.peek(huge) is None
    assert q.peek("a", queue=huge) is None
    page = q.one("SELECT queen.log_timers_list_v1(%s, %s, %s, %s)", (T1, huge, huge, 2 ** 31 - 1))
    assert page == {"items": [], "nextKey": None}
    page = q.one("SELECT queen.log_timers_list_v1(%s, 'q', NULL, -5)", (T1,))
    assert [i["timerKey"] for i in page["items"]] == ["a"]
