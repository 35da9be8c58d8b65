"""Timers.Apply*: queen.log_timers_apply_v1 validation (22023 naming op index and field),
statuses, index alignment, the schedule switch."""
import base64
import json
import uuid

import psycopg2
import pytest

from sqlkit import NOW, T1, T2, ZSTD_REAL, epoch_ms, ms

B64 = base64.b64encode(b'{"hello":"world"}').decode()
OK_SCHEDULE = {"op": "schedule", "queue": "q", "timerKey": "ok", "delayMs": 10, "txn": "t", "payload": B64}
DAY_MS = 24 * 3600 * 1000


def sched(key="k", **kw):
    op = {"op": "schedule", "queue": "q", "timerKey": key, "delayMs": 0, "txn": "t-" + key, "payload": B64}
    op.update(kw)
    return op


def refused(q, ops, *fragments, code="22023"):
    with pytest.raises(psycopg2.Error) as e:
        q.apply(ops)
    assert e.value.pgcode == code, e.value.pgerror
    msg = e.value.diag.message_primary
    for frag in fragments:
        assert frag in msg, (frag, msg)
    return msg


SERVER_OWNED = ["messageId", "deliverAt", "attempts", "claimToken", "claimedUntil", "shard",
                "visibleAt", "createdAt", "updatedAt", "tenantId", "lastError"]


@pytest.mark.parametrize("field", SERVER_OWNED)
def test_server_owned_fields_are_refused(q, field):
    refused(q, [OK_SCHEDULE, sched("b", **{field: 1})], "ops[1].%s" % field, "server-owned")
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0


def test_duplicate_queue_and_key_is_refused(q):
    refused(q, [sched("a"), sched("b"), {"op": "cancel", "queue": "q", "timerKey": "a"}],
            "ops[2].timerKey", "duplicate", "ops[0]")
    # same key on another queue is a different timer
    res = q.apply([sched("a"), sched("a", queue="q2")])
    assert [r["status"] for r in res] == ["scheduled", "scheduled"]


def test_payload_limit_is_one_mebibyte_decoded(q):
    exact = base64.b64encode(b"x" * 1048576).decode()
    over = base64.b64encode(b"x" * 1048577).decode()
    refused(q, [sched("a", payload=over)], "ops[0].payload", "1 MiB")
    assert q.apply([sched("a", payload=exact)])[0]["ok"]
    assert q.one("SELECT octet_length(payload) FROM queen.log_timers") == 1048576


def test_horizon_is_ninety_days(q):
    refused(q, [OK_SCHEDULE, sched("a", delayMs=90 * DAY_MS + 1)], "ops[1].delayMs", "90-day")
    refused(q, [{"op": "reschedule", "queue": "q", "timerKey": "a", "delayMs": 91 * DAY_MS}],
            "ops[0].delayMs")
    r = q.apply([sched("a", delayMs=90 * DAY_MS)])[0]
    assert r["deliverAtMs"] == epoch_ms(NOW) + 90 * DAY_MS


def test_unknown_op_is_refused(q):
    refused(q, [sched("a", op="fire")], "ops[0].op", "unknown op")


@pytest.mark.parametrize("kind,field", [
    ("schedule", "queue"), ("schedule", "timerKey"), ("schedule", "txn"),
    ("schedule", "payload"), ("schedule", "delayMs"),
    ("reschedule", "queue"), ("reschedule", "timerKey"), ("reschedule", "delayMs"),
    ("cancel", "queue"), ("cancel", "timerKey"), ("schedule", "op"),
])
def test_missing_required_field_is_refused(q, kind, field):
    op = {"op": kind, "queue": "q", "timerKey": "k", "delayMs": 5, "txn": "t", "payload": B64}
    if kind == "cancel":
        op = {"op": kind, "queue": "q", "timerKey": "k"}
    del op[field]
    refused(q, [OK_SCHEDULE, op], "ops[1].%s" % field, "missing")


def test_json_null_counts_as_missing(q):
    refused(q, [sched("a", txn=None)], "ops[0].txn", "missing")
    # an optional field set to null takes its default
    r = q.apply([sched("a", partition=None)])[0]
    assert r["ok"] and q.timer("a")["partition"] == "Default"


@pytest.mark.parametrize("payload", ["abc", "a$==", "====", "YWJj=", "YW Jj!", "Zg"])
def test_invalid_base64_is_refused(q, payload):
    refused(q, [sched("a", payload=payload)], "ops[0].payload", "base64")


def test_base64_with_line_breaks_and_empty_payload_are_accepted(q):
    wrapped = base64.encodebytes(b"y" * 200).decode()       # has newlines every 76 chars
    assert "\n" in wrapped
    assert q.apply([sched("a", payload=wrapped), sched("b", payload="")])[0]["ok"]
    assert bytes(q.timer("a")["payload"]) == b"y" * 200
    assert bytes(q.timer("b")["payload"]) == b""


def test_more_than_256_ops_is_refused(q):
    refused(q, [sched("k%d" % i) for i in range(257)], "257", "256")
    res = q.apply([sched("k%d" % i) for i in range(256)])
    assert len(res) == 256 and all(r["ok"] for r in res)


@pytest.mark.parametrize("field,value,expected", [
    ("queue", 5, "ops[0].queue"), ("timerKey", ["a"], "ops[0].timerKey"),
    ("delayMs", "10", "ops[0].delayMs"), ("txn", {"a": 1}, "ops[0].txn"),
    ("payload", 12, "ops[0].payload"), ("payloadZstd", "true", "ops[0].payloadZstd"),
    ("encrypted", 1, "ops[0].encrypted"), ("partition", True, "ops[0].partition"),
    ("op", 3, "ops[0].op"),
])
def test_wrong_json_types_are_refused(q, field, value, expected):
    refused(q, [sched("a", **{field: value})], expected, "must be a JSON")


def test_other_shapes_are_refused(q):
    with pytest.raises(psycopg2.Error) as e:
        q.one("SELECT queen.log_timers_apply_v1('{}'::jsonb, %s, null, %s)", (T1, NOW))
    assert e.value.pgcode == "22023" and "ops must be a JSON array" in e.value.diag.message_primary
    refused(q, [OK_SCHEDULE, "schedule"], "ops[1]", "JSON object")
    refused(q, [sched("a", delayMs=1.5)], "ops[0].delayMs", "integer")
    refused(q, [sched("a", queue="")], "ops[0].queue", "empty")
    refused(q, [sched("a", colour="red")], "ops[0].colour", "unknown field")
    refused(q, [sched("a", producerSub="me")], "ops[0].producerSub", "server-owned")
    refused(q, [{"op": "reschedule", "queue": "q", "timerKey": "a", "delayMs": 1, "payloadZstd": True}],
            "ops[0].payloadZstd", "payload")


def test_refused_batch_writes_nothing(q):
    refused(q, [sched("a"), sched("b"), sched("c", delayMs="x")], "ops[2].delayMs")
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0


def test_empty_batch(q):
    assert q.apply([]) == []


# ---------------------------------------------------------------------------------------
# statuses
# ---------------------------------------------------------------------------------------

def test_schedule_inserts_with_server_owned_fields(q):
    r = q.apply([sched("a", delayMs=1500, partition="P1", payloadZstd=True, encrypted=True,
                       payload=base64.b64encode(ZSTD_REAL).decode())],
                producer_sub="alice")[0]
    assert r["ok"] is True and r["status"] == "scheduled" and r["replaced"] is False
    assert r["deliverAtMs"] == epoch_ms(NOW) + 1500
    uuid.UUID(r["messageId"])
    t = q.timer("a")
    assert t["deliver_at"] == NOW + ms(1500)
    assert str(t["message_id"]) == r["messageId"]
    assert t["partition"] == "P1" and t["payload_zstd"] and t["encrypted"]
    assert t["producer_sub"] == "alice" and t["attempts"] == 0
    assert t["claim_token"] is None and t["claimed_until"] is None
    assert t["created_at"] == NOW and t["updated_at"] == NOW


def test_negative_delay_is_due_on_the_first_cycle(q):
    r = q.apply([sched("a", delayMs=-5000)])[0]
    assert r["deliverAtMs"] == epoch_ms(NOW)
    d = q.due()
    assert d["due"] == 1 and d["nextInMs"] == 0


def test_schedule_replaces_an_unclaimed_timer(q):
    first = q.apply([sched("a", delayMs=100)])[0]
    later = NOW + ms(50)
    second = q.apply([sched("a", delayMs=1000, txn="new", payload=base64.b64encode(b"2").decode())],
                     now=later)[0]
    assert second["status"] == "scheduled" and second["replaced"] is True
    assert second["messageId"] != first["messageId"]
    t = q.timer("a")
    assert t["txn"] == "new" and bytes(t["payload"]) == b"2"
    assert t["deliver_at"] == later + ms(1000)
    assert q.one("SELECT count(*) FROM queen.log_timers") == 1


def test_results_are_index_aligned_whatever_the_order(q):
    q.apply([sched("m")])
    ops = [
        {"op": "cancel", "queue": "z", "timerKey": "zz"},
        sched("x", delayMs=7),
        {"op": "reschedule", "queue": "q", "timerKey": "m", "delayMs": 99},
        {"op": "cancel", "queue": "a", "timerKey": "a"},
        sched("b", queue="a"),
    ]
    res = q.apply(ops)
    assert [r["status"] for r in res] == ["absent", "scheduled", "rescheduled", "absent", "scheduled"]
    assert res[1]["deliverAtMs"] == epoch_ms(NOW) + 7
    assert res[2]["deliverAtMs"] == epoch_ms(NOW) + 99


def test_reschedule_and_cancel_of_missing_rows_are_absent(q):
    res = q.apply([{"op": "reschedule", "queue": "q", "timerKey": "nope", "delayMs": 5},
                   {"op": "cancel", "queue": "q", "timerKey": "nope2"}])
    assert [(r["status"], r["ok"], r["messageId"]) for r in res] == [("absent", False, None), ("absent", False, None)]


def test_reschedule_keeps_identity_and_changes_only_what_is_given(q):
    first = q.apply([sched("a", delayMs=100, partition="P")])[0]
    r = q.apply([{"op": "reschedule", "queue": "q", "timerKey": "a", "delayMs": 5000}],
                now=NOW + ms(10))[0]
    assert r["status"] == "rescheduled" and r["ok"] and r["messageId"] == first["messageId"]
    t = q.timer("a")
    assert t["deliver_at"] == NOW + ms(5010) and t["partition"] == "P"
    assert bytes(t["payload"]) == b'{"hello":"world"}'
    r = q.apply([{"op": "reschedule", "queue": "q", "timerKey": "a", "delayMs": 1,
                  "payload": base64.b64encode(ZSTD_REAL).decode(), "payloadZstd": True}])[0]
    t = q.timer("a")
    assert bytes(t["payload"]) == ZSTD_REAL and t["payload_zstd"] is True and t["encrypted"] is False


def test_cancel_deletes(q):
    first = q.apply([sched("a")])[0]
    r = q.apply([{"op": "cancel", "queue": "q", "timerKey": "a"}])[0]
    assert r == {"ok": True, "status": "cancelled", "messageId": first["messageId"],
                 "deliverAt": r["deliverAt"], "deliverAtMs": first["deliverAtMs"]}
    assert q.timer("a") is None


def test_claimed_rows_are_too_late(q):
    q.apply([sched("a"), sched("b"), sched("c")])
    claimed = q.claim()
    assert len(claimed) == 3
    res = q.apply([sched("a"),
                   {"op": "reschedule", "queue": "q", "timerKey": "b", "delayMs": 10},
                   {"op": "cancel", "queue": "q", "timerKey": "c"}], now=NOW + ms(1))
    assert [(r["status"], r["ok"]) for r in res] == [("too_late", False)] * 3
    assert all(r["messageId"] for r in res)
    # nothing changed
    tokens = {r["timer_key"]: r["claim_token"] for r in claimed}
    for key in "abc":
        assert q.timer(key)["claim_token"] == tokens[key]


def test_an_expired_claim_is_in_nobodys_hands(q):
    q.apply([sched("a")])
    q.claim(lease_ms=1000)
    r = q.apply([{"op": "reschedule", "queue": "q", "timerKey": "a", "delayMs": 0}],
                now=NOW + ms(1000))[0]
    assert r["status"] == "rescheduled"
    t = q.timer("a")
    assert t["claim_token"] is None and t["claimed_until"] is None


def test_a_timer_in_backoff_can_be_cancelled_and_rescheduled(q):
    q.apply([sched("a"), sched("b")])
    rows = q.claim()
    q.fail(rows, klass="permanent", backoff_min_ms=60000)
    t = q.timer("a")
    assert t["claim_token"] is None and t["claimed_until"] == NOW + ms(60000) and t["attempts"] == 1
    res = q.apply([{"op": "cancel", "queue": "q", "timerKey": "a"},
                   {"op": "reschedule", "queue": "q", "timerKey": "b", "delayMs": 0}], now=NOW + ms(5))
    assert [r["status"] for r in res] == ["cancelled", "rescheduled"]
    b = q.timer("b")
    # the reschedule is the user's new instruction: backoff and attempts cleared, due now
    assert b["claimed_until"] is None and b["attempts"] == 0 and b["last_error"] is None
    assert q.due(now=NOW + ms(5))["due"] == 1


def test_tenants_are_isolated(q):
    a = q.apply([sched("k")], tenant=T1)[0]
    b = q.apply([sched("k")], tenant=T2)[0]
    assert a["replaced"] is False and b["replaced"] is False
    assert q.apply([{"op": "cancel", "queue": "q", "timerKey": "k"}], tenant=T2)[0]["status"] == "cancelled"
    assert q.timer("k", tenant=T1) is not None and q.timer("k", tenant=T2) is None


@pytest.mark.parametrize("value", [False, "off", "false", "0", "NO"])
def test_schedule_switch_off_refuses_schedule_and_reschedule_but_not_cancel(q, value):
    q.apply([sched("a")])
    q.switch("timers_schedule_enabled", value)
    msg = refused(q, [sched("b")], code="55000")
    assert msg == "timers_schedule_enabled is off"
    refused(q, [{"op": "reschedule", "queue": "q", "timerKey": "a", "delayMs": 1}], code="55000")
    assert q.apply([{"op": "cancel", "queue": "q", "timerKey": "a"}])[0]["status"] == "cancelled"
    q.switch("timers_schedule_enabled", True)
    assert q.apply([sched("b")])[0]["ok"]


def test_schedule_switch_garbage_value_keeps_the_default(q):
    q.switch("timers_schedule_enabled", {"weird": 1})
    assert q.apply([sched("b")])[0]["ok"]
    q.switch("timers_schedule_enabled", "maybe")
    assert q.apply([sched("c")])[0]["ok"]
