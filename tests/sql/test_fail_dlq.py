"""Timers.Fail*, Timers.Dlq*, Timers.Release*, Timers.Peek/List, Switches."""
import base64
import uuid

import psycopg2
import pytest

from sqlkit import NOW, T1, T2, ZSTD_REAL, Queen, ms


def sched(q, keys, payload=b"{}", tenant=T1, **extra):
    ops = []
    for k in keys:
        op = {"op": "schedule", "queue": "q", "timerKey": k, "delayMs": 0, "txn": "txn-" + k,
              "payload": base64.b64encode(payload).decode()}
        op.update(extra)
        ops.append(op)
    return q.apply(ops, tenant=tenant)


def test_permanent_failure_spends_an_attempt_with_exponential_backoff(q):
    sched(q, ["a"])
    now = NOW
    for attempt, backoff in enumerate([1000, 2000, 4000, 8000, 8000], start=1):
        rows = q.claim(now=now)
        assert len(rows) == 1
        res = q.fail1(rows, error="bad payload", klass="permanent", now=now,
                     backoff_min_ms=1000, backoff_max_ms=8000, max_attempts=99)
        assert res == {"released": 1, "exhausted": []}
        t = q.timer("a")
        assert t["claim_token"] is None and t["attempts"] == attempt
        assert t["claimed_until"] == now + ms(backoff) and t["last_error"] == "bad payload"
        assert q.claim(now=now + ms(backoff - 1)) == []           # in backoff: not due
        now = now + ms(backoff)


def test_config_failure_counts_like_permanent(q):
    sched(q, ["a"])
    q.fail(q.claim(), klass="config", backoff_min_ms=500)
    t = q.timer("a")
    assert t["attempts"] == 1 and t["claimed_until"] == NOW + ms(500)


def test_transient_failure_spends_no_attempt(q):
    sched(q, ["a"])
    res = q.fail(q.claim(), klass="transient", transient_backoff_ms=750, error="conn reset")
    assert res["released"] == 1 and res["exhausted"] == []
    t = q.timer("a")
    assert t["attempts"] == 0 and t["claimed_until"] == NOW + ms(750) and t["claim_token"] is None
    assert t["last_error"] == "conn reset"


def test_failure_with_a_wrong_token_touches_nothing(q):
    sched(q, ["a"])
    rows = q.claim()
    res = q.fail1([dict(rows[0], claim_token=uuid.uuid4())])
    assert res == {"released": 0, "exhausted": []}
    assert q.timer("a")["claim_token"] == rows[0]["claim_token"]


def test_exhausted_rows_are_reported_then_moved_to_the_dlq(q):
    sched(q, ["a", "b"])
    sched(q, ["a"], tenant=T2)
    now = NOW
    for _ in range(2):
        rows = [r for r in q.claim(now=now) if r["timer_key"] == "a"]
        res = q.fail(rows, klass="permanent", now=now, backoff_min_ms=10, max_attempts=2,
                     error="poison")
        now = now + ms(10)
    assert sorted((e["tenant"], e["key"], e["attempts"]) for e in res["exhausted"]) == \
        [(str(T1), "a", 2), (str(T2), "a", 2)]
    assert res["moved"] == 2
    # Moved by the failure: a dlq call after it (the order of 1.0.0's sweeper) finds none.
    assert q.dlq(res["exhausted"], now=now) == {"moved": 0}
    assert q.timer("a") is None and q.timer("a", tenant=T2) is None and q.timer("b") is not None
    dl = q.all("SELECT * FROM queen.log_dlq ORDER BY tenant_id")
    assert [(d["tenant_id"], d["queue"], d["partition"], d["consumer_group"], d["log_offset"])
            for d in dl] == [(T1, "q", "Default", "__timer__", -1), (T2, "q", "Default", "__timer__", -1)]
    assert dl[0]["payload"] == {} and dl[0]["error"] == "poison"
    assert dl[0]["timer_key"] == "a" and dl[0]["txn"] == "txn-a" and dl[0]["attempts"] == 2
    assert dl[0]["message_id"] is not None and dl[0]["created_at"] == now - ms(10)  # the failing call's now


@pytest.mark.parametrize("payload,extra,expected", [
    (b'{"order": 7}', {}, {"order": 7}),
    (b'  [1, 2]', {}, [1, 2]),
    (b'"text"', {}, "text"),
    (b"not json", {}, {"_raw_b64": base64.b64encode(b"not json").decode()}),
    (b"{broken", {}, {"_raw_b64": base64.b64encode(b"{broken").decode()}),
    (b"\xff\xfe{", {}, {"_raw_b64": base64.b64encode(b"\xff\xfe{").decode()}),
    (ZSTD_REAL, {"payloadZstd": True}, {"_raw_b64": base64.b64encode(ZSTD_REAL).decode(), "_zstd": True}),
    (b'{"e": 1}', {"encrypted": True}, {"_raw_b64": base64.b64encode(b'{"e": 1}').decode(), "_encrypted": True}),
    (b"x" * 300, {}, {"_raw_b64": base64.b64encode(b"x" * 300).decode()}),
])
def test_dlq_payload_shapes(q, payload, extra, expected):
    sched(q, ["a"], payload=payload, **extra)
    q.exec("UPDATE queen.log_timers SET attempts = 1")     # only a timer that failed is moved
    assert q.dlq([{"tenant": T1, "queue": "q", "key": "a"}]) == {"moved": 1}
    assert q.one("SELECT payload FROM queen.log_dlq") == expected


def test_dlq_leaves_rows_in_somebodys_hands_and_locked_rows(q, connections):
    sched(q, ["held", "locked", "free"])
    q.exec("UPDATE queen.log_timers SET attempts = 1")     # only a timer that failed is moved
    q.claim(max_rows=1)                                    # one of them is in hands
    held = q.one("SELECT timer_key FROM queen.log_timers WHERE claim_token IS NOT NULL")
    others = [k for k in ("held", "locked", "free") if k != held]
    locker = connections()
    locker.autocommit = False
    with locker.cursor() as cur:
        cur.execute("SELECT 1 FROM queen.log_timers WHERE timer_key = %s FOR UPDATE", (others[0],))
    mover = Queen(connections(options="-c lock_timeout=500"))
    res = mover.dlq([{"tenant": T1, "queue": "q", "key": k} for k in ("held", "locked", "free")])
    assert res == {"moved": 1}
    locker.rollback()
    assert q.timer(held) is not None and q.timer(others[0]) is not None and q.timer(others[1]) is None
    # an expired claim is in nobody's hands
    assert q.dlq([{"tenant": T1, "queue": "q", "key": held}], now=NOW + ms(30000)) == {"moved": 1}


def test_release_lets_another_broker_claim_at_once(q):
    sched(q, ["a", "b", "c"])
    rows = q.claim(lease_ms=30000)
    wrong = dict(rows[2], claim_token=uuid.uuid4())
    assert q.release(rows[:2] + [wrong]) == 2
    for r in rows[:2]:
        t = q.timer(r["timer_key"])
        assert t["claim_token"] is None and t["claimed_until"] is None and t["attempts"] == 0
    again = q.claim(now=NOW + ms(1))
    assert sorted(r["timer_key"] for r in again) == sorted(r["timer_key"] for r in rows[:2])
    assert q.release([]) == 0


def test_release_skips_locked_rows(q, connections):
    sched(q, ["a", "b"])
    rows = q.claim()
    locker = connections()
    locker.autocommit = False
    with locker.cursor() as cur:
        cur.execute("SELECT 1 FROM queen.log_timers WHERE timer_key = 'a' FOR UPDATE")
    other = Queen(connections(options="-c lock_timeout=500"))
    assert other.release(rows) == 1
    locker.rollback()


def test_fail_refusals(q):
    with pytest.raises(psycopg2.Error) as e:
        q.fail([], klass="fatal")
    assert e.value.pgcode == "22023" and "class" in e.value.diag.message_primary
    with pytest.raises(psycopg2.Error) as e:
        q.one("SELECT queen.log_timers_fail_v1(%s::uuid[], %s::text[], %s::text[], %s::uuid[],"
              " 'e', 'transient', %s, 1, 1, 1, 5)", ([T1], ["q"], [], [], NOW))
    assert e.value.pgcode == "22023"
    with pytest.raises(psycopg2.Error) as e:
        q.one("SELECT queen.log_timers_release_v1(%s::uuid[], %s::text[], %s::text[], %s::uuid[])",
              ([T1], ["q"], ["k"], []))
    assert e.value.pgcode == "22023"


def test_peek_and_list(q):
    sched(q, ["k%02d" % i for i in range(5)], payload=b"secret")
    p = q.peek("k01")
    assert p["timerKey"] == "k01" and p["queue"] == "q" and p["partition"] == "Default"
    assert p["payloadBytes"] == 6 and "payload" not in p and p["claimed"] is False
    assert p["txn"] == "txn-k01" and p["attempts"] == 0
    assert q.peek("nope") is None
    page1 = q.one("SELECT queen.log_timers_list_v1(%s, 'q', null, 2)", (T1,))
    assert [i["timerKey"] for i in page1["items"]] == ["k00", "k01"] and page1["nextKey"] == "k01"
    page2 = q.one("SELECT queen.log_timers_list_v1(%s, 'q', %s, 2)", (T1, page1["nextKey"]))
    assert [i["timerKey"] for i in page2["items"]] == ["k02", "k03"] and page2["nextKey"] == "k03"
    page3 = q.one("SELECT queen.log_timers_list_v1(%s, 'q', %s, 2)", (T1, page2["nextKey"]))
    assert [i["timerKey"] for i in page3["items"]] == ["k04"] and page3["nextKey"] is None
    assert all("payload" not in i for i in page1["items"] + page2["items"] + page3["items"])
    empty = q.one("SELECT queen.log_timers_list_v1(%s, 'q', null, 2)", (T2,))
    assert empty == {"items": [], "nextKey": None}


@pytest.mark.parametrize("value,default,expected", [
    (None, True, True), (None, False, False), (True, False, True), (False, True, False),
    ("on", False, True), ("OFF", True, False), ("yes", False, True), ("0", True, False),
    (1, False, False), ({"x": 1}, True, True), ("perhaps", True, True),
])
def test_switch_enabled_values(q, value, default, expected):
    q.switch("some_switch", value)
    assert q.one("SELECT queen.switch_enabled_v1('some_switch', %s)", (default,)) is expected


def test_maintenance_suspends_the_fire_and_loses_nothing(q):
    sched(q, ["a", "b"])
    q.switch("maintenance_mode", True)
    d = q.due(now=NOW + ms(5000))
    assert d["fireEnabled"] is False and d["maintenance"] is True and d["due"] == 2
    assert q.claim(now=NOW + ms(5000)) == []
    q.switch("maintenance_mode", False)
    rows = q.claim(now=NOW + ms(6000))
    assert q.fire([(T1, "q", "Default", rows)], now=NOW + ms(6000))["fired"] == 2
