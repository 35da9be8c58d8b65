"""Schema 18: a queue whose name another transaction holds (created, removed or renamed in a
host transaction still open) costs its own timers only, and what becomes of a removed or
renamed queue's pending timers.

The fire provisions a missing queue or partition under a bounded lock wait
(log_provision_try_v1): a held name answers its segments busy, rows untouched and still
claimed, the other segments fired, "provisionBusy" counting them. Not waiting is proven by
each call's statement_timeout (10 s) against holders that stay open: a wait with no bound
would end in that error, not in an answer.
"""
import time

from queenkit import stand_in_hash
from sqlkit import T1, T2, Queen

from test_fire import by_key, sched


def holder(connections, sql, args):
    """An open transaction on its own connection that ran sql (roll it back or commit)."""
    c = connections()
    c.autocommit = False
    with c.cursor() as cur:
        cur.execute(sql, args)
    return c


def firer(connections):
    return Queen(connections(options="-c statement_timeout=10000"))


def tokens(q):
    return {(r["queue"], r["timer_key"]): str(r["claim_token"])
            for r in q.all("SELECT queue, timer_key, claim_token FROM queen.log_timers")}


def test_a_queue_created_in_an_open_transaction_leaves_its_segment_busy_and_fires_the_others(q, connections):
    sched(q, ["n1", "n2"], queue="newq", partition="p0")
    sched(q, ["o1"], tenant=T2, queue="other", partition="p0")
    rows = by_key(q.claim())
    host = holder(connections, "SELECT * FROM queen.log_provision_v1(%s, 'newq', 'p0')", (T1,))
    f = firer(connections)
    try:
        before = tokens(q)
        for wait in (False, True):
            t0 = time.monotonic()
            res = f.fire([(T1, "newq", "p0", [rows["n1"], rows["n2"]]), (T2, "other", "p0", [rows["o1"]])]
                         if wait is False else [(T1, "newq", "p0", [rows["n1"], rows["n2"]])], wait=wait)
            took = time.monotonic() - t0
            print(f"\n[provision held] wait={wait}: answered in {took * 1000:.0f} ms: {res}")
            assert res["segments"][0] == {"status": "busy", "count": 2}
            assert res["provisionBusy"] == 1 and res["busy"] == 2
            if wait is False:
                assert res["segments"][1]["status"] == "fired" and res["fired"] == 1
            # The held queue's rows untouched: still claimed by the same tokens.
            assert {k: v for k, v in tokens(q).items() if k[0] == "newq"} == \
                {k: v for k, v in before.items() if k[0] == "newq"}
        # The 1.0.0 wrapper with wait true: a bounded wait, then never busy.
        rows1 = [rows["n1"], rows["n2"]]
        args = ([T1], ["newq"], ["p0"], [2], [b"".join(stand_in_hash(r["txn"]) for r in rows1)], [b"blob"],
                [r["timer_key"] for r in rows1], [1, 1], [r["claim_token"] for r in rows1])
        res = f.fire1_raw(*args)
        assert res["segments"] == [{"status": "stale", "held": 0}] and res["busy"] == 0
        assert res["provisionBusy"] == 1
        queue_id = host.cursor()
        queue_id.execute("SELECT id FROM queen.queues WHERE tenant_id = %s AND name = 'newq'", (T1,))
        qid = queue_id.fetchone()[0]
        host.commit()
        res = f.fire([(T1, "newq", "p0", [rows["n1"], rows["n2"]])], wait=False)
        assert res["segments"][0]["status"] == "fired" and res["provisionBusy"] == 0
        # Into the host's queue, the one it created: nothing created twice.
        assert q.one("SELECT count(*) FROM queen.queues WHERE tenant_id = %s AND name = 'newq'", (T1,)) == 1
        assert q.one("SELECT id FROM queen.queues WHERE tenant_id = %s AND name = 'newq'", (T1,)) == qid
    finally:
        host.rollback()


def test_a_queue_removed_in_an_open_transaction_leaves_a_new_partitions_segment_busy(q, connections):
    q.all("SELECT * FROM queen.log_provision_v1(%s, 'gone', 'p0')", (T1,))
    sched(q, ["g1"], queue="gone", partition="p-new")      # its partition does not exist yet
    sched(q, ["o1"], queue="other", partition="p0")
    rows = by_key(q.claim())
    qid = q.one("SELECT id FROM queen.queues WHERE name = 'gone'")
    host = holder(connections, "DELETE FROM queen.log_partitions WHERE queue_id = %s;"
                               " DELETE FROM queen.queues WHERE id = %s", (qid, qid))
    f = firer(connections)
    try:
        res = f.fire([(T1, "gone", "p-new", [rows["g1"]]), (T1, "other", "p0", [rows["o1"]])], wait=False)
        assert [s["status"] for s in res["segments"]] == ["busy", "fired"]
        assert res["provisionBusy"] == 1
    finally:
        host.commit()
    # Removed: its pending timer (claimed, too) left for the DLQ with the removal; the fire of
    # its claim finds it gone, and no queue of that name is created again.
    dlq = q.all("SELECT queue, timer_key, error, consumer_group FROM queen.log_dlq")
    assert [(d["queue"], d["timer_key"], d["error"], d["consumer_group"]) for d in dlq] == \
        [("gone", "g1", "queue removed", "__timer__")]
    res = f.fire([(T1, "gone", "p-new", [rows["g1"]])], wait=False)
    assert res["segments"] == [{"status": "stale", "held": 0}]
    assert q.one("SELECT count(*) FROM queen.queues WHERE name = 'gone'") == 0


def test_a_renamed_queue_takes_its_timers_with_it(q):
    q.all("SELECT * FROM queen.log_provision_v1(%s, 'old', 'p0')", (T1,))
    sched(q, ["a", "b"], queue="old", partition="p0", delay_ms=60000)
    sched(q, ["b"], queue="new", partition="p0", delay_ms=60000)   # b is pending there already
    q.exec("UPDATE queen.queues SET name = 'new' WHERE name = 'old'")
    left = sorted((r["queue"], r["timer_key"]) for r in q.all("SELECT queue, timer_key FROM queen.log_timers"))
    assert left == [("new", "a"), ("new", "b")]
    dlq = q.all("SELECT queue, timer_key, error FROM queen.log_dlq")
    assert [(d["queue"], d["timer_key"]) for d in dlq] == [("old", "b")]
    assert dlq[0]["error"].startswith("queue renamed to new")
    # A change that keeps the name moves nothing.
    q.exec("UPDATE queen.queues SET dedup_window_ms = 0")
    assert q.one("SELECT count(*) FROM queen.log_timers WHERE queue = 'new'") == 2
