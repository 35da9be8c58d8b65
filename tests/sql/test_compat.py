"""The 1.0.0 contracts kept by sql/006_compat.sql: each wrapper answers 1.0.0's shape over
the current body, and the fire's wrapper never answers busy to a call that waits (a 1.0.0
broker answers busy by firing again at once with wait true: it would loop until the lease
ends)."""

import psycopg2

from queenkit import stand_in_hash
from sqlkit import NOW, T1, ms

DUE_KEYS_1_0_0 = {"now", "nowMs", "nextInMs", "due", "dueCapped", "lateMs", "fireEnabled",
                  "maintenance", "scheduleEnabled"}
CLAIM_COLUMNS_1_0_0 = ["tenant_id", "queue", "timer_key", "partition", "txn", "message_id", "payload",
                       "payload_zstd", "encrypted", "producer_sub", "claim_token", "deliver_at_ms",
                       "late_ms", "attempts"]


def sched(q, keys, partition="p1", now=NOW):
    ops = [{"op": "schedule", "queue": "q", "timerKey": k, "delayMs": 0, "txn": "txn-" + k,
            "payload": "", "partition": partition} for k in keys]
    assert all(r["ok"] for r in q.apply(ops, now=now))


def fire1_args(rows):
    return ([T1], ["q"], ["p1"], [len(rows)], [b"".join(stand_in_hash(r["txn"]) for r in rows)],
            [b"blob"], [r["timer_key"] for r in rows], [1] * len(rows), [r["claim_token"] for r in rows])


def test_due_v1_answers_the_1_0_0_keys_of_due_v2(q):
    sched(q, ["a", "b"], now=NOW - ms(100))
    v1 = q.due1()
    assert set(v1) == DUE_KEYS_1_0_0
    v2 = q.due()
    assert {k: v2[k] for k in DUE_KEYS_1_0_0} == v1 and v1["due"] == 2 and v1["lateMs"] == 100


def test_claim_v1_answers_the_1_0_0_columns_with_a_fresh_token_per_row(q):
    sched(q, ["a", "b", "c"])
    rows = q.all("SELECT * FROM queen.log_timers_claim_v1(NULL, %s, 30000, 2, 50)", (NOW,))
    assert [r["timer_key"] for r in rows] == ["a", "b"]
    assert list(rows[0]) == CLAIM_COLUMNS_1_0_0
    assert len({r["claim_token"] for r in rows}) == 2
    assert q.timer("a")["claimed_until"] == NOW + ms(30000)


def test_fire_v1_with_wait_never_answers_busy_and_leaves_the_rows_claimed(q, connections):
    """A row of the segment locked by another transaction (another broker's claim passing
    over it): log_timers_fire_v2 answers busy even with wait true; the 1.0.0 wrapper answers
    what 1.0.0 did there, stale with nothing held, and with wait false still busy."""
    sched(q, ["a", "b", "c"])
    rows = q.claim1()
    locker = connections()
    locker.autocommit = False
    locker.cursor().execute("SELECT 1 FROM queen.log_timers WHERE timer_key = 'b' FOR UPDATE")
    try:
        assert q.fire(([T1, "q", "p1", rows],), wait=True)["segments"] == [{"status": "busy", "count": 3}]
        res = q.fire1_raw(*fire1_args(rows))                # the ten-argument call waits
        assert res["segments"] == [{"status": "stale", "held": 0}]
        assert (res["stale"], res["busy"], res["fired"]) == (1, 0, 0)
        assert q.fire1_raw(*fire1_args(rows), wait=True)["segments"] == [{"status": "stale", "held": 0}]
        assert q.fire1_raw(*fire1_args(rows), wait=False)["segments"] == [{"status": "busy", "count": 3}]
        # Untouched: every row still the caller's, to hand back or fire.
        assert {str(r["claim_token"]) for r in q.all("SELECT claim_token FROM queen.log_timers")} == \
            {str(r["claim_token"]) for r in rows}
    finally:
        locker.rollback()
    res = q.fire1_raw(*fire1_args(rows))
    assert res["segments"][0]["status"] == "fired" and res["fired"] == 3
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0


def test_fail_v1_answers_without_moved_and_its_exhausted_rows_are_dead_lettered_once(q):
    sched(q, ["a"])
    rows = q.claim1()
    res = q.fail1(rows, max_attempts=1)
    assert set(res) == {"released", "exhausted"} and [e["key"] for e in res["exhausted"]] == ["a"]
    # 1.0.0's next call, the move: already done by the failure, nothing moved twice.
    assert q.dlq(res["exhausted"]) == {"moved": 0}
    assert q.one("SELECT count(*) FROM queen.log_dlq") == 1 and q.timer("a") is None


def test_release_v1_hands_back_in_front_of_every_floor(q):
    sched(q, ["a"], now=NOW - ms(5000))
    rows = q.claim1()
    assert q.release(rows) == 1
    t = q.timer("a")
    # Without a now, the trigger puts the row at the transaction's now(): never behind a floor.
    assert t["claim_token"] is None and t["due_at"] >= q.one("SELECT now()")


def test_kv_usage_step_v1_runs_a_pass_on_every_call_without_the_gate(q):
    q.put("k", {"v": 1}, forever=True)
    first = q.one("SELECT queen.kv_usage_step_v1(NULL, %s, 10)", (NOW,))
    again = q.one("SELECT queen.kv_usage_step_v1(NULL, %s, 10)", (NOW + ms(1),))
    assert "skipped" not in first and first["tenants"] and again["tenants"]
    # The gated step right after sees no pass of the fleet gate: the wrapper never took it.
    assert q.usage_step2(now=NOW + ms(2), every_ms=300000)["skipped"] is None


def test_never_shipped_functions_are_gone(q):
    for sig in ("queen.log_timers_claim_v2(int2[], timestamptz, int, int, int, bigint, uuid, uuid[], text[], text[])",
                "queen.log_timers_claim_v3(int2[], timestamptz, int, int, int, bigint, uuid, uuid[], text[], text[],"
                " timestamptz, uuid[])",
                "queen.log_timers_release_claims_v1(uuid[], timestamptz, timestamptz)"):
        assert q.one("SELECT to_regprocedure(%s)", (sig,)) is None, sig
    try:
        q.all("SELECT * FROM queen.log_timers_claim_v3(NULL, now(), 1, 1, 1, NULL, NULL, NULL, NULL, NULL,"
              " NULL, NULL)")
        raise AssertionError("claim_v3 still answers")
    except psycopg2.Error as e:
        assert e.pgcode == "42883"
