"""Timers.Fire*: fired, stale, duplicate and released segments; contiguous offsets;
provisioning; multi-tenant isolation; array validation; never waiting on timer rows."""
import base64
import time
import uuid

import psycopg2
import pytest

from queenkit import stand_in_hash, wait_for
from sqlkit import NOW, T1, T2, ms


@pytest.fixture(autouse=True, params=["full", "compact"])
def answer_form(request, monkeypatch):
    """Every test of this module twice: the fire's full answer, and its compact one (what the
    sweeper asks for) expanded by sqlkit into the full form, so both say the same."""
    from sqlkit import Queen
    monkeypatch.setattr(Queen, "compact_answers", request.param == "compact")
    return request.param


def sched(q, keys, tenant=T1, queue="q", partition=None, txns=None, now=NOW, delay_ms=0):
    ops = []
    for i, k in enumerate(keys):
        op = {"op": "schedule", "queue": queue, "timerKey": k, "delayMs": delay_ms,
              "txn": (txns[i] if txns else "txn-" + k),
              "payload": base64.b64encode(b"{}").decode()}
        if partition:
            op["partition"] = partition
        ops.append(op)
    return q.apply(ops, tenant=tenant, now=now)


def by_key(rows):
    return {r["timer_key"]: r for r in rows}


def fire_behind(q, first, second, segments):
    """Fire `segments` through `second` from a thread until that fire waits on a lock (the
    uncommitted fire of `first` holds it), then commit `first`: the second fire's answer."""
    import threading
    from sqlkit import Queen
    pid = second.get_backend_pid()
    out = {}

    def run():
        try:
            out["res"] = Queen(second).fire(segments)
        except Exception as e:                  # noqa: BLE001
            out["err"] = e

    t = threading.Thread(target=run)
    t.start()
    wait_for(lambda: q.one("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)) == "Lock",
             5, 0.02, "the second fire to wait on the first one's lock")
    first.commit()
    t.join(10)
    assert "err" not in out, out.get("err")
    return out["res"]


def hold_partitions(q, connections, provision, held):
    """Provisions the partitions named in provision (tenant T1, queue q), then holds those in
    held FOR UPDATE the way another broker's fire would; returns the holder (roll it back)."""
    for name in provision:
        q.all("SELECT * FROM queen.log_provision_v1(%s, 'q', %s)", (T1, name))
    locker = connections()
    locker.autocommit = False
    with locker.cursor() as cur:
        cur.execute("SELECT 1 FROM queen.log_partitions WHERE name = ANY (%s) FOR UPDATE", (list(held),))
    return locker


def test_fire_appends_a_segment_and_deletes_its_timers(q):
    sched(q, ["a", "b", "c"])
    rows = q.claim()
    res = q.fire([(T1, "q", "Default", rows)])
    seg = res["segments"][0]
    assert seg["status"] == "fired" and seg["baseOffset"] == 0 and seg["endOffset"] == 2
    assert seg["count"] == 3 and res["fired"] == 3
    assert res["stale"] == 0 and res["duplicate"] == 0 and res["released"] == 0
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0
    log = q.read()
    assert len(log) == 1 and log[0]["base_offset"] == 0 and log[0]["end_offset"] == 2
    assert bytes(log[0]["hashes"]) == b"".join(stand_in_hash(r["txn"]) for r in rows)
    assert bytes(log[0]["blob"]) == ("blob:" + ",".join(r["timer_key"] for r in rows)).encode()
    assert log[0]["created_at"] == NOW
    idx = q.all("SELECT * FROM queen.log_txn_index ORDER BY log_offset")
    assert [bytes(i["hash"]) for i in idx] == [stand_in_hash(r["txn"]) for r in rows]
    assert [i["log_offset"] for i in idx] == [0, 1, 2]
    assert seg["partitionId"] == q.one("SELECT id FROM queen.log_partitions")


def test_offsets_are_contiguous_across_segments_calls_and_pushes(q):
    sched(q, ["k%02d" % i for i in range(10)])
    rows = q.claim()
    res = q.fire([(T1, "q", "Default", rows[:3]), (T1, "q", "Default", rows[3:5])])
    assert [(s["baseOffset"], s["endOffset"]) for s in res["segments"]] == [(0, 2), (3, 4)]
    assert q.push(["p1", "p2"])["baseOffset"] == 5
    res = q.fire([(T1, "q", "Default", rows[5:])])
    assert (res["segments"][0]["baseOffset"], res["segments"][0]["endOffset"]) == (7, 11)
    log = q.read()
    offsets = [(s["base_offset"], s["end_offset"]) for s in log]
    assert offsets == [(0, 2), (3, 4), (5, 6), (7, 11)]
    assert q.one("SELECT last_offset FROM queen.log_partitions") == 11
    assert [s["base_offset"] for s in q.read(from_offset=4)] == [3, 5, 7]
    assert [s["base_offset"] for s in q.read(from_offset=5, max_segments=1)] == [5]


def test_fire_provisions_queue_and_partition(q):
    sched(q, ["a"], queue="fresh", partition="P7")
    rows = q.claim()
    assert rows[0]["partition"] == "P7"
    res = q.fire([(T1, "fresh", "P7", rows)])
    assert res["fired"] == 1
    assert q.one("SELECT name FROM queen.queues WHERE tenant_id = %s", (T1,)) == "fresh"
    assert q.one("SELECT name FROM queen.log_partitions") == "P7"
    assert len(q.read(queue="fresh", partition="P7")) == 1


def test_stale_wrong_token(q):
    sched(q, ["a", "b"])
    rows = q.claim()
    rows[1] = dict(rows[1], claim_token=uuid.uuid4())
    res = q.fire([(T1, "q", "Default", rows)])
    assert res["segments"] == [{"status": "stale", "held": 1}]
    assert res["stale"] == 1 and res["released"] == 1 and res["fired"] == 0
    # the held row was let go at once; the other keeps its (real) claim
    a = q.timer(rows[0]["timer_key"])
    assert a["claim_token"] is None and a["claimed_until"] is None and a["attempts"] == 0
    b = q.timer(rows[1]["timer_key"])
    assert b["claim_token"] is not None
    assert q.read() == []


def test_stale_expired_claim(q):
    sched(q, ["a"])
    rows = q.claim(lease_ms=1000)
    res = q.fire([(T1, "q", "Default", rows)], now=NOW + ms(1000))
    assert res["segments"] == [{"status": "stale", "held": 0}]
    assert q.timer("a") is not None and q.read() == []


def test_stale_when_reclaimed_by_another_broker(q):
    sched(q, ["a", "b"])
    old = q.claim(lease_ms=1000)
    new = q.claim(now=NOW + ms(1500), lease_ms=30000)          # someone else re-claimed
    res = q.fire([(T1, "q", "Default", old)], now=NOW + ms(1600))
    assert res["segments"][0]["status"] == "stale"
    res = q.fire([(T1, "q", "Default", new)], now=NOW + ms(1700))
    assert res["fired"] == 2


def test_stale_when_the_partition_does_not_match(q):
    sched(q, ["a"])
    rows = q.claim()
    res = q.fire([(T1, "q", "Other", rows)])
    assert res["segments"] == [{"status": "stale", "held": 0}]


def test_duplicate_against_a_pushed_transaction(q):
    q.push(["dup"])
    sched(q, ["x", "y"], txns=["fresh", "dup"])
    rows = q.claim()
    assert len(rows) == 2
    res = q.fire([(T1, "q", "Default", rows)])
    assert res["segments"] == [{"status": "duplicate", "duplicates": 1, "released": 1}]
    assert res["duplicate"] == 1 and res["released"] == 1 and res["fired"] == 0
    assert q.timer("y") is None                                 # delivered already
    x = q.timer("x")
    assert x["claim_token"] is None and x["claimed_until"] is None    # re-packed next cycle
    assert len(q.read()) == 1
    # next cycle fires the rest
    res = q.fire([(T1, "q", "Default", q.claim())])
    assert res["fired"] == 1 and res["segments"][0]["baseOffset"] == 1


def test_same_txn_twice_in_one_call(q):
    sched(q, ["a", "b"], txns=["same", "same"])
    rows = by_key(q.claim())
    res = q.fire([(T1, "q", "Default", [rows["a"]]), (T1, "q", "Default", [rows["b"]])])
    assert res["segments"][0]["status"] == "fired"
    assert res["segments"][1] == {"status": "duplicate", "duplicates": 1, "released": 0}
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0
    assert len(q.read()) == 1


def test_same_txn_in_one_segment_is_refused(q):
    sched(q, ["a", "b"], txns=["same", "same"])
    rows = q.claim()
    with pytest.raises(psycopg2.Error) as e:
        q.fire([(T1, "q", "Default", rows)])
    assert e.value.pgcode == "22023" and "seg_hashes[1]" in e.value.diag.message_primary


def test_dedup_window_is_per_queue_and_bounded(q):
    q.push(["old"], now=NOW - ms(3600000))          # exactly one window ago: outside
    q.push(["recent"], queue="elsewhere")
    sched(q, ["a", "b"], txns=["old", "recent"])
    res = q.fire([(T1, "q", "Default", q.claim())])
    assert res["fired"] == 2
    # the index row for "old" now points at the new landing
    row = q.all("SELECT i.created_at, i.log_offset FROM queen.log_txn_index i JOIN queen.queues qu ON qu.id = i.queue_id"
                " WHERE qu.name = 'q' AND i.hash = %s", (stand_in_hash("old"),))[0]
    assert row["created_at"] == NOW and row["log_offset"] >= 1


def test_dedup_window_zero_disables_dedup(q):
    q.push(["t"])
    q.exec("UPDATE queen.queues SET dedup_window_ms = 0")
    sched(q, ["a"], txns=["t"])
    assert q.fire([(T1, "q", "Default", q.claim())])["fired"] == 1


def test_multi_tenant_isolation(q):
    sched(q, ["a", "b"], tenant=T1)
    sched(q, ["a", "b"], tenant=T2)
    rows = q.claim()
    t1 = [r for r in rows if r["tenant_id"] == T1]
    t2 = [r for r in rows if r["tenant_id"] == T2]
    # T2 naming T1's keys with T1's tokens holds nothing
    res = q.fire([(T2, "q", "Default", t1)])
    assert res["segments"][0]["status"] == "stale"
    res = q.fire([(T1, "q", "Default", t1), (T2, "q", "Default", t2)])
    assert [s["status"] for s in res["segments"]] == ["fired", "fired"]
    assert res["segments"][0]["baseOffset"] == 0 and res["segments"][1]["baseOffset"] == 0
    assert res["segments"][0]["partitionId"] != res["segments"][1]["partitionId"]
    assert len(q.read(tenant=T1)) == 1 and len(q.read(tenant=T2)) == 1
    # same txn ids in another tenant's queue are not duplicates
    assert q.one("SELECT count(DISTINCT queue_id) FROM queen.log_txn_index") == 2


def test_mixed_call_fired_stale_duplicate(q):
    q.push(["d"])
    sched(q, ["f1", "f2", "s1", "d1"], txns=["f1", "f2", "s1", "d"])
    rows = by_key(q.claim())
    bad = dict(rows["s1"], claim_token=uuid.uuid4())
    res = q.fire([(T1, "q", "Default", [rows["f1"], rows["f2"]]),
                  (T1, "q", "Default", [bad]),
                  (T1, "q", "Default", [rows["d1"]])])
    assert [s["status"] for s in res["segments"]] == ["fired", "stale", "duplicate"]
    assert res["fired"] == 2 and res["stale"] == 1 and res["duplicate"] == 1 and res["released"] == 0


def test_fire_never_waits_on_timer_rows(q, connections):
    sched(q, ["a", "b", "c"])
    rows = by_key(q.claim())
    locker = connections()
    locker.autocommit = False
    with locker.cursor() as cur:
        cur.execute("SELECT 1 FROM queen.log_timers WHERE timer_key = 'b' FOR UPDATE")
    firer = connections(options="-c statement_timeout=10000 -c lock_timeout=500")
    from sqlkit import Queen
    res = Queen(firer).fire([(T1, "q", "Default", [rows["a"], rows["b"]]),
                             (T1, "q", "Default", [rows["c"]])])
    # Not waiting is proven by the lock still held: a wait would end in the lock or
    # statement timeout (an error), not in a result. No wall-clock bound.
    # b is still ours (only locked): its segment is busy, kept claimed for a later call
    # (schema version 10; it was stale, a released and b handed back).
    assert [s["status"] for s in res["segments"]] == ["busy", "fired"]
    assert res["segments"][0] == {"status": "busy", "count": 2} and res["released"] == 0
    locker.rollback()


def test_fire_without_wait_skips_held_partitions_and_keeps_their_claims(q, connections):
    sched(q, ["a"], partition="p1")
    sched(q, ["b"], partition="p2")
    rows = by_key(q.claim())
    locker = hold_partitions(q, connections, ["p1", "p2"], ["p1"])
    from sqlkit import Queen
    firer = Queen(connections(options="-c statement_timeout=10000"))
    res = firer.fire([(T1, "q", "p1", [rows["a"]]), (T1, "q", "p2", [rows["b"]])], wait=False)
    # Not waiting is proven by the lock still held: a wait would end in the lock or
    # statement timeout (an error), not in a result. No wall-clock bound.
    assert [s["status"] for s in res["segments"]] == ["busy", "fired"]
    assert res["busy"] == 1 and res["fired"] == 1 and res["released"] == 0
    # The busy timer is still claimed by the same token, so the caller can fire it again.
    left = q.all("SELECT timer_key, claim_token FROM queen.log_timers")
    assert [(r["timer_key"], str(r["claim_token"])) for r in left] == [("a", str(rows["a"]["claim_token"]))]
    locker.rollback()
    res = firer.fire([(T1, "q", "p1", [rows["a"]])], wait=True)
    assert [s["status"] for s in res["segments"]] == ["fired"]
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0


def test_empty_fire(q):
    res = q.fire([])
    assert res == {"segments": [], "fired": 0, "stale": 0, "duplicate": 0, "released": 0, "provisionBusy": 0}


# ---------------------------------------------------------------------------------------
# array validation
# ---------------------------------------------------------------------------------------

H = stand_in_hash("x")
TOK = uuid.uuid4()


@pytest.mark.parametrize("args,fragment", [
    (([T1], ["q", "r"], ["p"], [1], [H], [b"b"], ["k"], [1], [TOK]), "seg_queues 2"),
    (([T1], ["q"], ["p"], [1], [H, H], [b"b"], ["k"], [1], [TOK]), "seg_hashes 2"),
    (([T1], ["q"], ["p"], [1], [H], [b"b"], ["k", "j"], [1], [TOK]), "timer_seg 1"),
    (([T1], ["q"], ["p"], [1], [H], [b"b"], ["k"], [1], []), "timer_tokens 0"),
    (([T1], ["q"], ["p"], [2], [H], [b"b"], ["k", "j"], [1, 1], [TOK, TOK]), "seg_hashes[1] is 16 bytes"),
    (([T1], ["q"], ["p"], [0], [b""], [b"b"], [], [], []), "seg_counts[1]"),
    (([T1], ["q"], ["p"], [1], [H], [b"b"], ["k"], [2], [TOK]), "timer_seg[1] = 2"),
    (([T1, T1], ["q", "q"], ["p", "p"], [1, 1], [H, stand_in_hash("y")], [b"b", b"c"], ["k", "j"], [1, 1], [TOK, TOK]),
     "timer_seg gives segment 1 2 timers but seg_counts[1] = 1"),
    (([T1, T1], ["q", "q"], ["p", "p"], [1, 1], [H, stand_in_hash("y")], [b"b", b"c"], ["k", "k"], [1, 2], [TOK, TOK]),
     "timer_keys[2] names the same timer as timer_keys[1]"),
    (([T1], ["q"], [""], [1], [H], [b"b"], ["k"], [1], [TOK]), "seg_partitions[1]"),
])
def test_fire_refuses_arrays_that_do_not_line_up(q, args, fragment):
    with pytest.raises(psycopg2.Error) as e:
        q.fire_raw(*args)
    assert e.value.pgcode == "22023", e.value.pgerror
    assert fragment in e.value.diag.message_primary, e.value.diag.message_primary


def test_concurrent_fire_of_the_same_txn_on_two_partitions(q, connections):
    """The dedup index upsert is the serialisation point: the second writer waits for the
    first, finds the transaction inside the window, undoes its allocation, and answers
    duplicate."""
    from sqlkit import Queen
    q.push(["seed"], partition="P1")
    q.push(["seed2"], partition="P2")
    sched(q, ["a"], txns=["X"], partition="P1")
    sched(q, ["b"], txns=["X"], partition="P2")
    rows = by_key(q.claim())
    first = connections()
    first.autocommit = False
    res_a = Queen(first).fire([(T1, "q", "P1", [rows["a"]])])
    assert res_a["fired"] == 1                     # not committed yet
    second = connections(options="-c statement_timeout=10000")
    res = fire_behind(q, first, second, [(T1, "q", "P2", [rows["b"]])])
    assert res["segments"] == [{"status": "duplicate", "duplicates": 1, "released": 0}]
    assert q.one("SELECT last_offset FROM queen.log_partitions WHERE name = 'P2'") == 0
    assert [s["base_offset"] for s in q.read(partition="P2")] == [0]
    assert [s["base_offset"] for s in q.read(partition="P1")] == [0, 1]
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0
    idx = q.all("SELECT partition_id, log_offset FROM queen.log_txn_index WHERE hash = %s",
                (stand_in_hash("X"),))
    assert len(idx) == 1 and idx[0]["log_offset"] == 1


def test_repeated_txn_chain_in_one_call(q):
    """A later segment is a duplicate only through an earlier segment that was appended:
    an earlier duplicate segment writes no index rows."""
    q.push(["old"])
    sched(q, ["a1", "a2", "b", "c"], txns=["old", "H", "H", "H"])
    rows = by_key(q.claim())
    res = q.fire([(T1, "q", "Default", [rows["a1"], rows["a2"]]),   # duplicate through "old"
                  (T1, "q", "Default", [rows["b"]]),                # H not in the log: fired
                  (T1, "q", "Default", [rows["c"]])])               # H written by b
    assert res["segments"][0] == {"status": "duplicate", "duplicates": 1, "released": 1}
    assert res["segments"][1]["status"] == "fired" and res["segments"][1]["baseOffset"] == 1
    assert res["segments"][2] == {"status": "duplicate", "duplicates": 1, "released": 0}
    assert (res["fired"], res["duplicate"], res["released"]) == (1, 2, 1)
    left = q.all("SELECT timer_key, claim_token FROM queen.log_timers")
    assert [(r["timer_key"], r["claim_token"]) for r in left] == [("a2", None)]
    assert q.one("SELECT last_offset FROM queen.log_partitions") == 1


def test_repeated_txn_in_one_call_with_window_zero(q):
    q.push(["seed"])
    q.exec("UPDATE queen.queues SET dedup_window_ms = 0")
    sched(q, ["a", "b", "c"], txns=["X", "X", "Y"])
    rows = by_key(q.claim())
    res = q.fire([(T1, "q", "Default", [rows["a"], rows["c"]]), (T1, "q", "Default", [rows["b"]])])
    assert [(s["status"], s["baseOffset"], s["endOffset"]) for s in res["segments"]] == \
        [("fired", 1, 2), ("fired", 3, 3)]
    idx = q.all("SELECT log_offset FROM queen.log_txn_index WHERE hash = %s", (stand_in_hash("X"),))
    assert [i["log_offset"] for i in idx] == [3]
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0


def test_segments_across_partitions_and_queues_in_one_call(q):
    sched(q, ["a", "b"], partition="P1")
    sched(q, ["c"], partition="P2")
    sched(q, ["d"], queue="other", partition="P1")
    sched(q, ["e"], partition="P1")
    rows = by_key(q.claim())
    res = q.fire([(T1, "q", "P1", [rows["a"]]), (T1, "q", "P2", [rows["c"]]),
                  (T1, "other", "P1", [rows["d"]]), (T1, "q", "P1", [rows["b"], rows["e"]])])
    assert [(s["status"], s["baseOffset"], s["endOffset"]) for s in res["segments"]] == \
        [("fired", 0, 0), ("fired", 0, 0), ("fired", 0, 0), ("fired", 1, 2)]
    assert res["segments"][0]["partitionId"] == res["segments"][3]["partitionId"]
    assert len({s["partitionId"] for s in res["segments"]}) == 3
    assert [s["base_offset"] for s in q.read(partition="P1")] == [0, 1]
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0
    assert q.one("SELECT count(*) FROM queen.log_txn_index") == 5


def test_lost_race_undoes_only_the_losing_segment(q, connections):
    """A call whose set-based append loses one hash to a concurrent writer answers that
    segment duplicate and still appends the others, with contiguous offsets."""
    from sqlkit import Queen
    q.push(["seed"], partition="P1")
    q.push(["seed2"], partition="P2")
    sched(q, ["a"], txns=["X"], partition="P1")
    sched(q, ["b", "c", "d"], txns=["X", "Y", "Z"], partition="P2")
    rows = by_key(q.claim())
    first = connections()
    first.autocommit = False
    assert Queen(first).fire([(T1, "q", "P1", [rows["a"]])])["fired"] == 1
    second = connections(options="-c statement_timeout=10000")
    segs = fire_behind(q, first, second, [(T1, "q", "P2", [rows["c"]]),
                                          (T1, "q", "P2", [rows["b"], rows["d"]])])["segments"]
    assert (segs[0]["status"], segs[0]["baseOffset"], segs[0]["endOffset"]) == ("fired", 1, 1)
    assert segs[1] == {"status": "duplicate", "duplicates": 1, "released": 1}
    assert q.one("SELECT last_offset FROM queen.log_partitions WHERE name = 'P2'") == 1
    assert [s["base_offset"] for s in q.read(partition="P2")] == [0, 1]
    left = q.all("SELECT timer_key, claim_token FROM queen.log_timers")
    assert [(r["timer_key"], r["claim_token"]) for r in left] == [("d", None)]
    assert q.one("SELECT count(*) FROM queen.log_txn_index WHERE hash = %s", (stand_in_hash("Z"),)) == 0
    idx = q.all("SELECT log_offset FROM queen.log_txn_index WHERE hash = %s", (stand_in_hash("X"),))
    assert [i["log_offset"] for i in idx] == [1]


def test_lost_race_of_a_first_segment_leaves_no_gap_in_its_partition(q, connections):
    """The losing segment comes first: nothing was allocated for it, so the next segment of
    the same partition, done one by one after the undo, starts right after the old end."""
    from sqlkit import Queen
    q.push(["seed"], partition="P2")
    sched(q, ["a"], txns=["X"], partition="P1")
    sched(q, ["b", "c"], txns=["X", "Y"], partition="P2")
    rows = by_key(q.claim())
    first = connections()
    first.autocommit = False
    assert Queen(first).fire([(T1, "q", "P1", [rows["a"]])])["fired"] == 1
    second = connections(options="-c statement_timeout=10000")
    res = fire_behind(q, first, second, [(T1, "q", "P2", [rows["b"]]), (T1, "q", "P2", [rows["c"]])])
    segs = res["segments"]
    assert segs[0] == {"status": "duplicate", "duplicates": 1, "released": 0}
    assert (segs[1]["status"], segs[1]["baseOffset"], segs[1]["endOffset"]) == ("fired", 1, 1)
    assert (res["fired"], res["duplicate"], res["released"]) == (1, 1, 0)
    assert q.one("SELECT last_offset FROM queen.log_partitions WHERE name = 'P2'") == 1
    assert [s["base_offset"] for s in q.read(partition="P2")] == [0, 1]
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0
    idx = q.all("SELECT p.name, x.log_offset FROM queen.log_txn_index x"
                " JOIN queen.log_partitions p ON p.id = x.partition_id WHERE x.hash = %s",
                (stand_in_hash("X"),))
    assert [(i["name"], i["log_offset"]) for i in idx] == [("P1", 0)]


def test_push_appends_inside_the_window_and_indexes_a_repeated_hash_at_its_last_frame(q):
    """The push shares the fire's append without the window: always appended, a hash
    repeated in its segment indexed once (last frame), an index row inside the window
    replaced; a fire of that transaction afterwards is a duplicate."""
    first = q.push(["a", "b", "a"])
    assert (first["baseOffset"], first["endOffset"]) == (0, 2)
    idx = {bytes(r["hash"]): r["log_offset"] for r in q.all("SELECT hash, log_offset FROM queen.log_txn_index")}
    assert idx == {stand_in_hash("a"): 2, stand_in_hash("b"): 1}
    again = q.push(["a"])
    assert (again["baseOffset"], again["endOffset"]) == (3, 3)
    assert q.one("SELECT log_offset FROM queen.log_txn_index WHERE hash = %s", (stand_in_hash("a"),)) == 3
    assert [s["base_offset"] for s in q.read()] == [0, 3]
    sched(q, ["t"], txns=["a"])
    res = q.fire([(T1, "q", "Default", q.claim())])
    assert res["segments"] == [{"status": "duplicate", "duplicates": 1, "released": 0}]
    assert q.one("SELECT last_offset FROM queen.log_partitions") == 3


def test_stale_and_busy_and_fired_in_one_call(q, connections):
    sched(q, ["a"], partition="P1")
    sched(q, ["b", "c"], partition="P2")
    sched(q, ["d"], partition="P3")
    rows = by_key(q.claim())
    q.push(["x"], partition="P3")
    holder = connections()
    holder.autocommit = False
    holder.cursor().execute("SELECT 1 FROM queen.log_partitions WHERE name = 'P3' FOR UPDATE")
    bad = dict(rows["c"], claim_token=str(uuid.uuid4()))
    res = q.fire([(T1, "q", "P1", [rows["a"]]), (T1, "q", "P2", [rows["b"], bad]),
                  (T1, "q", "P3", [rows["d"]])], wait=False)
    holder.rollback()
    assert res["segments"][0]["status"] == "fired"
    assert res["segments"][1] == {"status": "stale", "held": 1}
    assert res["segments"][2] == {"status": "busy", "count": 1}
    assert (res["fired"], res["stale"], res["released"], res["busy"]) == (1, 1, 1, 1)
    left = {r["timer_key"]: r for r in q.all("SELECT timer_key, claim_token FROM queen.log_timers")}
    assert set(left) == {"b", "c", "d"}
    assert left["b"]["claim_token"] is None
    assert str(left["c"]["claim_token"]) == str(rows["c"]["claim_token"])
    assert str(left["d"]["claim_token"]) == str(rows["d"]["claim_token"])


def _fire_counting_helpers(conn, segments, wait=None):
    """Fires in one transaction with track_functions = pl and returns (answer, calls), calls
    being {helper: calls} of the fast and the general way in that transaction."""
    from sqlkit import Queen
    conn.autocommit = False
    with conn.cursor() as cur:
        cur.execute("SET LOCAL track_functions = 'pl'")
    res = Queen(conn).fire(segments, wait=wait)
    with conn.cursor() as cur:
        cur.execute("SELECT funcname, calls FROM pg_stat_xact_user_functions"
                    " WHERE schemaname = 'queen' AND funcname IN"
                    " ('log_timers_fire_fast_v2', 'log_timers_fire_hold_v1', 'log_timers_fire_settle_v1',"
                    "  'log_dedup_check_v1', 'log_timers_fire_check_v1')")
        calls = dict(cur.fetchall())
    conn.commit()
    conn.autocommit = True
    return res, calls


def test_fire_takes_the_fast_way_when_nothing_is_in_the_way(q, connections):
    sched(q, ["a", "b"], partition="p1")
    sched(q, ["c"], partition="p2")
    rows = by_key(q.claim())
    res, calls = _fire_counting_helpers(
        connections(), [(T1, "q", "p1", [rows["a"], rows["b"]]), (T1, "q", "p2", [rows["c"]])])
    # The general way (hold, settle) never ran: the answer is the fast way's. Nor did the
    # dedup check: the fast way's append finds a duplicate by itself (optimistic).
    assert calls.get("log_timers_fire_fast_v2") == 1
    assert "log_timers_fire_hold_v1" not in calls and "log_timers_fire_settle_v1" not in calls
    assert "log_dedup_check_v1" not in calls
    assert [s["status"] for s in res["segments"]] == ["fired", "fired"]
    assert [(s["baseOffset"], s["endOffset"], s["count"]) for s in res["segments"]] == [(0, 1, 2), (0, 0, 1)]
    assert res["fired"] == 3 and res["stale"] == 0 and res["duplicate"] == 0
    assert res["released"] == 0 and res["busy"] == 0
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0
    assert q.one("SELECT count(*) FROM queen.log_txn_index") == 3
    assert sorted(q.one("SELECT array_agg(last_offset) FROM queen.log_partitions")) == [0, 1]


@pytest.mark.parametrize("case", ["held_row", "stale_token", "duplicate"])
def test_fire_fast_way_stands_aside_and_leaves_nothing_behind(q, connections, case):
    """Whatever stops the fast way midway (a row someone holds, a row not ours, a duplicate
    found by its append) is undone with it: the general way then answers exactly as it
    always did, and no offset, segment or index row of the undone attempt survives. (A
    busy partition no longer stops it: test_fire_fast_way_fires_the_partitions_it_took.)"""
    sched(q, ["a", "b"], partition="p1")
    sched(q, ["c"], partition="p2")
    rows = by_key(q.claim())
    q.all("SELECT * FROM queen.log_provision_v1(%s, 'q', 'p1')", (T1,))
    q.all("SELECT * FROM queen.log_provision_v1(%s, 'q', 'p2')", (T1,))
    locker = connections()
    locker.autocommit = False
    wait = None
    if case == "held_row":
        # b is still ours, someone else holds a lock on it: p1's segment is busy (schema
        # version 10; it was stale), untouched and still claimed.
        with locker.cursor() as cur:
            cur.execute("SELECT 1 FROM queen.log_timers WHERE timer_key = 'b' FOR UPDATE")
        expect = ["busy", "fired"]
    elif case == "stale_token":
        rows["b"] = dict(rows["b"], claim_token=str(uuid.uuid4()))
        expect = ["stale", "fired"]
    elif case == "duplicate":
        # c's transaction is already in the log: the fast way's append finds it only after
        # it deleted every row and appended p1's segment.
        q.one("SELECT queen.log_push_v1(%s, 'q', 'p2', 1, %s, %s, %s)",
              (T1, psycopg2.Binary(stand_in_hash("txn-c")), psycopg2.Binary(b"pushed"), NOW))
        expect = ["fired", "duplicate"]
    firer = connections(options="-c statement_timeout=10000")
    res, calls = _fire_counting_helpers(
        firer, [(T1, "q", "p1", [rows["a"], rows["b"]]), (T1, "q", "p2", [rows["c"]])], wait=wait)
    locker.rollback()
    assert calls.get("log_timers_fire_fast_v2") == 1 and calls.get("log_timers_fire_hold_v1") == 1
    # The checked append runs once, in the general way.
    assert calls.get("log_dedup_check_v1") == 1
    assert [s["status"] for s in res["segments"]] == expect
    lasts = {r["name"]: r["last_offset"] for r in q.all("SELECT name, last_offset FROM queen.log_partitions")}
    segs = [(r["name"], r["base_offset"], r["end_offset"]) for r in q.all(
        "SELECT p.name, s.base_offset, s.end_offset FROM queen.log_segments s"
        " JOIN queen.log_partitions p ON p.id = s.partition_id ORDER BY p.name, s.base_offset")]
    left = sorted(r["timer_key"] for r in q.all("SELECT timer_key FROM queen.log_timers"))
    if case in ("held_row", "stale_token"):
        # p1's segment is busy or stale (nothing appended for it), p2's fired at offset 0.
        assert lasts == {"p1": -1, "p2": 0} and segs == [("p2", 0, 0)]
        assert left == ["a", "b"]
        tokens = {r["timer_key"]: r["claim_token"] for r in q.all(
            "SELECT timer_key, claim_token::text FROM queen.log_timers")}
        if case == "held_row":  # busy: both rows still claimed by their claim
            assert tokens == {"a": str(rows["a"]["claim_token"]), "b": str(rows["b"]["claim_token"])}
            assert res["released"] == 0 and res["busy"] == 2
        else:  # stale: the row held (a) released
            assert tokens["a"] is None and res["released"] == 1
    elif case == "duplicate":
        # p1 fired once at 0 (not twice: the undone attempt left no offset behind); p2
        # holds only the push.
        assert lasts == {"p1": 1, "p2": 0} and segs == [("p1", 0, 1), ("p2", 0, 0)]
        assert left == []
    indexed = {"held_row": 1, "stale_token": 1, "duplicate": 3}[case]
    assert q.one("SELECT count(*) FROM queen.log_txn_index") == indexed


@pytest.mark.parametrize("by_tid", [False, True])
def test_fire_fast_way_fires_the_partitions_it_took(q, connections, by_tid):
    """Schema version 10. Some partitions of the call held by someone else (wait false): the
    fast way fires the segments of the partitions it took and answers the others busy, their
    rows untouched (not locked, still claimed by the same tokens). The general way (a lock
    and a WAL record on every row) does not run. Before, any held partition sent the whole
    call the general way, which with several brokers on the same partitions was most fires."""
    sched(q, ["a", "b"], partition="p1")
    sched(q, ["c"], partition="p2")
    sched(q, ["d"], partition="p3")
    rows = by_key(q.claim4() if by_tid else q.claim())
    locker = hold_partitions(q, connections, ["p1", "p2", "p3"], ["p2"])
    firer = connections(options="-c statement_timeout=10000")
    segments = [(T1, "q", "p1", [rows["a"], rows["b"]]), (T1, "q", "p2", [rows["c"]]),
                (T1, "q", "p3", [rows["d"]])]
    from sqlkit import Queen
    firer.autocommit = False
    with firer.cursor() as cur:
        cur.execute("SET LOCAL track_functions = 'pl'")
    res = Queen(firer).fire(segments, wait=False, by_tid=by_tid)
    with firer.cursor() as cur:
        cur.execute("SELECT funcname, calls FROM pg_stat_xact_user_functions WHERE schemaname = 'queen'"
                    " AND funcname IN ('log_timers_fire_fast_v2', 'log_timers_fire_hold_v1')")
        calls = dict(cur.fetchall())
    firer.commit()
    firer.autocommit = True
    assert calls == {"log_timers_fire_fast_v2": 1}
    assert [s["status"] for s in res["segments"]] == ["fired", "busy", "fired"]
    assert res["segments"][1] == {"status": "busy", "count": 1}
    assert (res["fired"], res["stale"], res["released"], res["busy"]) == (3, 0, 0, 1)
    # c untouched: lockable by anybody (never locked by the fire), still claimed by its token.
    left = q.all("SELECT timer_key, claim_token::text FROM queen.log_timers FOR UPDATE NOWAIT")
    assert [(r["timer_key"], r["claim_token"]) for r in left] == [("c", str(rows["c"]["claim_token"]))]
    lasts = {r["name"]: r["last_offset"] for r in q.all("SELECT name, last_offset FROM queen.log_partitions")}
    assert lasts == {"p1": 1, "p2": -1, "p3": 0}
    locker.rollback()
    res = Queen(firer).fire([(T1, "q", "p2", [rows["c"]])], wait=True, by_tid=by_tid)
    assert [s["status"] for s in res["segments"]] == ["fired"]
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0
    assert q.one("SELECT count(*) FROM queen.log_txn_index") == 4


def test_a_claim_passing_over_rows_claimed_since_its_snapshot_leaves_them_busy_not_stale(q, connections):
    """Schema version 10. How another broker's claim gets in the way of our fire: its walk
    reads the rows as they were at its snapshot, and a row we claimed (and committed) after
    that is locked by its FOR UPDATE SKIP LOCKED before the recheck of the newest version
    finds the row in flight and passes it. The lock stays until that claim commits. Our fire
    meets it: the segment is answered busy, its rows still claimed by us, and fired by the
    next call once the passer is gone. Before, it was stale: the rows the fire held were
    released, the others handed back, and all of them claimed and fired again."""
    import threading
    sched(q, ["a", "b", "c"], partition="p1")
    passer = connections()
    passer.autocommit = False
    started = threading.Event()
    seen = {}

    def pass_over():
        with passer.cursor() as cur:
            started.set()
            # The claim's walk, paused after its snapshot (the sleep is an InitPlan, run at
            # the first row, after the statement's snapshot was taken).
            cur.execute("SELECT t.timer_key FROM queen.log_timers t"
                        " WHERE (SELECT pg_sleep(1.0)) IS NOT NULL"
                        "   AND t.due_at <= %s AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > %s)"
                        " ORDER BY t.due_at FOR UPDATE SKIP LOCKED", (NOW, NOW))
            seen["rows"] = cur.fetchall()

    th = threading.Thread(target=pass_over)
    th.start()
    started.wait()
    time.sleep(0.3)
    rows = by_key(q.claim())            # committed while the passer sleeps
    th.join()
    assert seen["rows"] == []           # it passed every row (each in flight by now) ...
    probe = connections()
    with pytest.raises(psycopg2.errors.LockNotAvailable):  # ... and still holds them locked
        probe.cursor().execute("SELECT 1 FROM queen.log_timers WHERE timer_key = 'b' FOR UPDATE NOWAIT")
    firer = connections(options="-c statement_timeout=10000")
    from sqlkit import Queen
    seg = [(T1, "q", "p1", [rows["a"], rows["b"], rows["c"]])]
    res = Queen(firer).fire(seg, wait=True)
    assert res["segments"] == [{"status": "busy", "count": 3}]
    assert (res["fired"], res["stale"], res["released"]) == (0, 0, 0)
    tokens = {r["timer_key"]: r["claim_token"] for r in q.all(
        "SELECT timer_key, claim_token::text FROM queen.log_timers")}
    assert tokens == {k: str(rows[k]["claim_token"]) for k in "abc"}
    passer.commit()
    res = Queen(firer).fire(seg, wait=True)
    assert res["segments"][0]["status"] == "fired" and res["fired"] == 3
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0


def test_a_segment_with_a_row_not_ours_is_stale_even_when_another_row_is_locked(q, connections):
    """The busy answer needs every row the hold missed to be ours still: one row whose
    token is not ours makes the segment stale as before, whatever else is locked. The row
    held is released, the locked one (still ours) is left for the caller to hand back."""
    sched(q, ["a", "b", "c"], partition="p1")
    rows = by_key(q.claim())
    locker = connections()
    locker.autocommit = False
    locker.cursor().execute("SELECT 1 FROM queen.log_timers WHERE timer_key = 'b' FOR UPDATE")
    bad = dict(rows["c"], claim_token=str(uuid.uuid4()))
    firer = connections(options="-c statement_timeout=10000")
    from sqlkit import Queen
    res = Queen(firer).fire([(T1, "q", "p1", [rows["a"], rows["b"], bad])], wait=True)
    locker.rollback()
    assert res["segments"] == [{"status": "stale", "held": 1}]
    assert res["released"] == 1
    tokens = {r["timer_key"]: r["claim_token"] for r in q.all(
        "SELECT timer_key, claim_token::text FROM queen.log_timers")}
    assert tokens == {"a": None, "b": str(rows["b"]["claim_token"]), "c": str(rows["c"]["claim_token"])}


def test_fire_without_wait_answers_every_segment_busy_when_every_partition_is_held(q, connections):
    """Every partition of the call held by someone else (wait false): the fast way answers
    every segment busy itself, with nothing taken: no row locked (the general way would have
    locked, and written a WAL record for, every row only to answer the same), rows still
    claimed by the same tokens, no offset moved. A stale row among them is answered busy
    too, and found stale by the next call, which waits for the partition."""
    sched(q, ["a", "b"], partition="p1")
    sched(q, ["c"], partition="p2")
    rows = by_key(q.claim())
    locker = hold_partitions(q, connections, ["p1", "p2"], ["p1", "p2"])
    bad = dict(rows["b"], claim_token=str(uuid.uuid4()))
    firer = connections(options="-c statement_timeout=10000")
    res, calls = _fire_counting_helpers(
        firer, [(T1, "q", "p1", [rows["a"], bad]), (T1, "q", "p2", [rows["c"]])], wait=False)
    assert calls.get("log_timers_fire_fast_v2") == 1
    assert "log_timers_fire_hold_v1" not in calls and "log_timers_fire_settle_v1" not in calls
    assert res["segments"] == [{"status": "busy", "count": 2}, {"status": "busy", "count": 1}]
    assert (res["fired"], res["stale"], res["released"], res["busy"]) == (0, 0, 0, 3)
    # Nothing taken: every row still claimed by its own token and lockable by anybody.
    left = {r["timer_key"]: str(r["claim_token"]) for r in q.all(
        "SELECT timer_key, claim_token FROM queen.log_timers FOR UPDATE NOWAIT")}
    assert left == {k: str(rows[k]["claim_token"]) for k in ("a", "b", "c")}
    assert sorted(q.one("SELECT array_agg(last_offset) FROM queen.log_partitions")) == [-1, -1]
    locker.rollback()
    # The next call (waiting) finds the stale row and fires the rest.
    from sqlkit import Queen
    res = Queen(firer).fire([(T1, "q", "p1", [rows["a"], bad]), (T1, "q", "p2", [rows["c"]])], wait=True)
    assert [s["status"] for s in res["segments"]] == ["stale", "fired"]
    assert res["released"] == 1
    assert sorted(r["timer_key"] for r in q.all("SELECT timer_key FROM queen.log_timers")) == ["a", "b"]


def test_an_all_busy_answer_checks_no_timer_and_the_call_that_can_fire_refuses(q, connections):
    """Every partition held and no wait: the answer is all busy before the timers are
    checked (schema version 12; the check of every timer was most of such a call), so a
    call whose timers are malformed is answered busy too, nothing taken or written; the
    call that can fire (its partition free) checks them and refuses. One whose segment
    names or counts are malformed is refused at once, held partitions or not."""
    sched(q, ["a", "b"], partition="p1")
    rows = by_key(q.claim())
    locker = hold_partitions(q, connections, ["p1"], ["p1"])
    firer = connections(options="-c statement_timeout=10000")
    res, calls = _fire_counting_helpers(firer, [(T1, "q", "p1", [rows["a"], rows["b"]])], wait=False)
    assert res["segments"] == [{"status": "busy", "count": 2}]
    assert calls.get("log_timers_fire_fast_v2") == 1 and "log_timers_fire_check_v1" not in calls
    # Timers that do not match the segment's count: busy while held, nothing taken.
    from sqlkit import Queen
    fq = Queen(firer)
    seg = ([T1], ["q"], ["p1"], [2], [stand_in_hash("txn-a") + stand_in_hash("txn-b")], [b"blob"])
    bad_timers = (["a"], [1], [rows["a"]["claim_token"]])
    res = fq.fire_raw(*seg, *bad_timers, wait=False)
    assert res["segments"] == [{"status": "busy", "count": 2}] and res["busy"] == 2
    left = {r["timer_key"]: str(r["claim_token"]) for r in q.all(
        "SELECT timer_key, claim_token FROM queen.log_timers FOR UPDATE NOWAIT")}
    assert left == {k: str(rows[k]["claim_token"]) for k in ("a", "b")}
    # Malformed segment names or counts: refused at once, though the partition is held.
    for seg_p, seg_c, fragment in ((["p1", "p2"], [2], "seg_partitions 2"), ([""], [2], "seg_partitions[1]"),
                                   (["p1"], [0], "seg_counts[1]")):
        with pytest.raises(psycopg2.Error) as e:
            fq.fire_raw(seg[0], seg[1], seg_p, seg_c, seg[4], seg[5], *bad_timers, wait=False)
        assert e.value.pgcode == "22023" and fragment in e.value.diag.message_primary, e.value.pgerror
    locker.rollback()
    # The partition free: the same malformed timers are checked and refused, nothing fired.
    with pytest.raises(psycopg2.Error) as e:
        fq.fire_raw(*seg, *bad_timers, wait=False)
    assert e.value.pgcode == "22023" and "seg_counts[1] = 2" in e.value.diag.message_primary
    assert q.one("SELECT last_offset FROM queen.log_partitions WHERE name = 'p1'") == -1
    # And the well-formed call fires, with its timers checked once.
    res, calls = _fire_counting_helpers(firer, [(T1, "q", "p1", [rows["a"], rows["b"]])], wait=False)
    assert [s["status"] for s in res["segments"]] == ["fired"]
    assert calls.get("log_timers_fire_check_v1") == 1


def test_segment_blobs_and_hashes_are_never_compressed_by_the_server(q):
    """log_segments.blob (zstd already) and log_txns.hashes (xxh3) are stored EXTERNAL: the
    server never tries pglz on them (4.4% of the machine's CPU while one sweeper drained,
    tests/bench/README.md). A blob pglz would shrink (zeros) is stored as given, out of line."""
    storage = {r["attname"]: r["attstorage"] for r in q.all(
        "SELECT attname, attstorage FROM pg_attribute"
        " WHERE (attrelid, attname) IN (('queen.log_segments'::regclass, 'blob'),"
        "                               ('queen.log_txns'::regclass, 'hashes'))")}
    assert storage == {"blob": "e", "hashes": "e"}
    hashes = b"".join(stand_in_hash("txn-%d" % i) for i in range(400))
    q.one("SELECT queen.log_push_v1(%s, 'q', 'p1', 400, %s, %s, %s)",
          (T1, psycopg2.Binary(hashes), psycopg2.Binary(bytes(100_000)), NOW))
    row = q.all("SELECT pg_column_compression(s.blob) AS bc, octet_length(s.blob) AS bn,"
                "       pg_column_compression(t.hashes) AS hc"
                "  FROM queen.log_segments s JOIN queen.log_txns t USING (partition_id, base_offset)")
    assert row == [{"bc": None, "bn": 100_000, "hc": None}]
    toasted = q.one("SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = 'queen.log_segments'::regclass")
    assert toasted >= 100_000


def _append(q, segs, optimistic):
    """log_append_dedup_v1 with dedup on, inside a subtransaction the test undoes on QSF01,
    as the fire's fast way does. segs: [(partition, [txn, ...])] of queue q, tenant T1."""
    ids = [q.all("SELECT * FROM queen.log_provision_v1(%s, 'q', %s)", (T1, p))[0] for p, _ in segs]
    lasts = [q.one("SELECT last_offset FROM queen.log_partitions WHERE id = %s", (i["partition_id"],)) for i in ids]
    return q.all("SELECT * FROM queen.log_append_dedup_v1(%s, %s, %s, %s, %s, %s, %s, true, %s, %s)",
                 ([i["queue_id"] for i in ids], [i["partition_id"] for i in ids], lasts,
                  [len(t) for _, t in segs],
                  [psycopg2.Binary(b"".join(stand_in_hash(x) for x in t)) for _, t in segs],
                  [psycopg2.Binary(b"blob") for _ in segs], [i["dedup_window_ms"] for i in ids], NOW,
                  optimistic))[0]


def test_optimistic_append_appends_what_is_new_and_raises_on_any_duplicate(q):
    """The fast way's append without its check first: it appends when nothing is a duplicate
    (the same offsets, segments and index rows as the checked append), and raises QSF01 when
    a hash is in the window or repeats across the call's segments of one queue, a window of
    0 included; the checked append answers those cases itself."""
    res = _append(q, [("p1", ["a", "b"]), ("p2", ["c"])], optimistic=True)
    assert res["base_offsets"] == [0, 0] and res["dup_seg"] == [] and res["dup_frame"] == []
    assert q.one("SELECT count(*) FROM queen.log_txn_index") == 3
    assert q.one("SELECT count(*) FROM queen.log_segments") == 2
    for segs in ([("p1", ["a"])],                      # in the window
                 [("p1", ["x"]), ("p2", ["x"])]):      # repeated across segments
        for window in (3600000, 0):
            q.exec("UPDATE queen.queues SET dedup_window_ms = %s", (window,))
            if window == 0 and len(segs) == 1:
                continue                               # outside a window of 0: not a duplicate
            with pytest.raises(psycopg2.Error) as e:
                q.exec("BEGIN")
                try:
                    _append(q, segs, optimistic=True)
                finally:
                    q.exec("ROLLBACK")
            assert e.value.pgcode == "QSF01"
    q.exec("UPDATE queen.queues SET dedup_window_ms = 3600000")
    checked = _append(q, [("p1", ["x"]), ("p2", ["x"])], optimistic=False)
    assert checked["base_offsets"] == [2, None] and checked["dup_seg"] == [2] and checked["dup_frame"] == [0]
    assert q.one("SELECT count(*) FROM queen.log_segments") == 3


@pytest.mark.parametrize("case", ["timer_named_twice", "hash_repeated_in_a_segment"])
def test_refusals_the_fast_way_skips_are_still_raised_and_leave_nothing(q, case):
    """The fast way does not look for a timer named twice or a hash repeated in a segment
    (the check's costly two): on claimed rows it gets as far as deleting them, comes up
    short, is undone, and the general way raises the refusal full gives. Nothing stays
    written: rows, their claims, offsets, segments, index rows, provisioned queues."""
    sched(q, ["a", "b"], txns=["ta", "tb"])
    rows = by_key(q.claim())
    tok_a, tok_b = str(rows["a"]["claim_token"]), str(rows["b"]["claim_token"])
    if case == "timer_named_twice":
        args = ([T1], ["q"], ["Default"], [2], [stand_in_hash("ta") + stand_in_hash("tb")], [b"blob"],
                ["a", "a"], [1, 1], [tok_a, tok_a])
        fragment = "timer_keys[2] names the same timer as timer_keys[1]"
    else:
        args = ([T1], ["q"], ["Default"], [2], [stand_in_hash("ta") * 2], [b"blob"],
                ["a", "b"], [1, 1], [tok_a, tok_b])
        fragment = "seg_hashes[1] repeats one transaction hash at frames 0 and 1"
    with pytest.raises(psycopg2.Error) as e:
        q.fire_raw(*args)
    assert e.value.pgcode == "22023" and fragment in e.value.diag.message_primary
    left = {r["timer_key"]: str(r["claim_token"]) for r in q.all("SELECT timer_key, claim_token FROM queen.log_timers")}
    assert left == {"a": tok_a, "b": tok_b}
    for table in ("queues", "log_partitions", "log_segments", "log_txns", "log_txn_index"):
        assert q.one("SELECT count(*) FROM queen.%s" % table) == 0, table


# ---- The fire by address (schema version 8: log_timers_claim_v4's row_tid, log_timers_fire_v2)


def test_claim_v4_gives_each_row_its_address_and_the_1_0_0_claim_the_same_rows_without(q):
    sched(q, ["a", "b", "c"])
    cid = uuid.uuid4()
    rows = q.claim4(claim_id=cid)
    assert [r["timer_key"] for r in rows] == ["a", "b", "c"]
    at = {r["timer_key"]: r["ctid"] for r in q.all("SELECT timer_key, ctid::text FROM queen.log_timers")}
    # The address of the version the claim wrote (not the one it replaced).
    assert {r["timer_key"]: r["row_tid"] for r in rows} == at
    assert all(str(r["claim_token"]) == str(cid) for r in rows)
    q.exec("UPDATE queen.log_timers SET claim_token = NULL, claimed_until = NULL")
    # log_timers_claim_v1 (the 1.0.0 wrapper): the same rows, 1.0.0's columns only.
    v1 = q.claim1()
    assert [r["timer_key"] for r in v1] == ["a", "b", "c"]
    assert set(rows[0]) - set(v1[0]) == {"row_tid", "floor_ms"}


@pytest.mark.parametrize("statistics", ["as they are", "a large heap over small indexes"])
def test_fire_by_address_fires_through_the_fast_way_with_one_tid_scan(q, connections, statistics):
    """Every timer with its address: the fast way deletes the rows found by one TID scan of
    all the addresses, hash-joined to what the caller names (no descent of the primary key
    per timer, no nested loop, no index read whole), and fires as by key. Whatever the
    statistics say: with the heap's counted as a held snapshot leaves them (millions of rows
    no vacuum may remove) and the indexes' as small, a generic plan read the whole primary
    key and filtered it by address (a fire of a 30-minute held-row run took 1.2 s each, the
    stream stalled for 45 s; schema 31 leaves it no other way in than the addresses)."""
    from sqlkit import Queen, nested_plans
    sched(q, ["a", "b"], partition="p1")
    sched(q, ["c"], partition="p2")
    rows = by_key(q.claim4())
    segs = [(T1, "q", "p1", [rows["a"], rows["b"]]), (T1, "q", "p2", [rows["c"]])]
    skewed = statistics != "as they are"
    conn = connections(autocommit=not skewed)
    if skewed:
        # In the fire's own transaction (rolled back below): what a vacuum under a held
        # snapshot records for the heap, the indexes left as they are.
        with conn.cursor() as cur:
            cur.execute("UPDATE pg_class SET reltuples = 7000000, relpages = 900000"
                        " WHERE oid = 'queen.log_timers'::regclass")
    tids = [r["row_tid"] for _, _, _, rs in segs for r in rs]
    args = ([T1, T1], ["q", "q"], ["p1", "p2"], [2, 1],
            [psycopg2.Binary(b"".join(stand_in_hash(r["txn"]) for r in rs)) for _, _, _, rs in segs],
            [psycopg2.Binary(b"blob") for _ in segs], ["a", "b", "c"], [1, 1, 2],
            [str(rows[k]["claim_token"]) for k in ("a", "b", "c")], NOW, True, tids)
    out, plans = nested_plans(
        conn, "SELECT queen.log_timers_fire_v2(%s::uuid[], %s::text[], %s::text[], %s::int[], %s::bytea[],"
              " %s::bytea[], %s::text[], %s::int[], %s::uuid[], %s, %s, %s::tid[])", args,
        like="DELETE FROM queen.log_timers")
    res = out[0][0]
    assert [s["status"] for s in res["segments"]] == ["fired", "fired"] and res["fired"] == 3
    assert len(plans) == 1, plans
    plan = plans[0]
    assert "Tid Scan on log_timers" in plan and "ctid = ANY" in plan, plan
    assert "Nested Loop" not in plan and "Index Scan" not in plan and "Bitmap" not in plan, plan
    assert "Hash Join" in plan or "Merge Join" in plan, plan
    if skewed:
        conn.rollback()
        return
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0
    # And the answer is the same through Queen.fire (the helper the other tests use).
    sched(q, ["d"], partition="p1")
    d = by_key(q.claim4())["d"]
    assert Queen(conn).fire([(T1, "q", "p1", [d])], by_tid=True)["fired"] == 1


@pytest.mark.parametrize("case", ["swapped", "moved", "null", "short"])
def test_fire_by_address_never_trusts_an_address(q, connections, case):
    """An address is only a hint. Two addresses swapped (each finds the other timer), a row
    moved since its claim (a write by hand: a new version at a new address, still claimed),
    a null address or an array of the wrong length: the fast way by address comes up short
    or is not tried, and the timers fire by key exactly once, each in its own frame."""
    sched(q, ["a", "b"], partition="p1")
    sched(q, ["c"], partition="p2")
    rows = by_key(q.claim4())
    if case == "swapped":
        rows["a"], rows["b"] = dict(rows["a"], row_tid=rows["b"]["row_tid"]), dict(rows["b"], row_tid=rows["a"]["row_tid"])
    elif case == "moved":
        q.exec("UPDATE queen.log_timers SET updated_at = updated_at + interval '1 ms' WHERE timer_key = 'b'")
        assert q.one("SELECT ctid::text FROM queen.log_timers WHERE timer_key = 'b'") != rows["b"]["row_tid"]
    elif case == "null":
        rows["c"] = dict(rows["c"], row_tid=None)
    segs = [(T1, "q", "p1", [rows["a"], rows["b"]]), (T1, "q", "p2", [rows["c"]])]
    if case == "short":
        res = q.fire_raw([T1, T1], ["q", "q"], ["p1", "p2"], [2, 1],
                         [b"".join(stand_in_hash(r["txn"]) for r in rs) for _, _, _, rs in segs],
                         [b"blob-1", b"blob-2"], ["a", "b", "c"], [1, 1, 2],
                         [str(rows[k]["claim_token"]) for k in ("a", "b", "c")],
                         tids=[rows["a"]["row_tid"], rows["b"]["row_tid"]])
    else:
        res = q.fire(segs, by_tid=True)
    assert [s["status"] for s in res["segments"]] == ["fired", "fired"] and res["fired"] == 3
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0
    # Each timer once in the log: three index rows, the frames in the caller's order.
    assert q.one("SELECT count(*) FROM queen.log_txn_index") == 3
    assert sorted(q.one("SELECT array_agg(last_offset) FROM queen.log_partitions")) == [0, 1]


def test_fire_by_address_does_not_fire_a_row_that_is_no_longer_ours(q):
    """The address still holds the row, but it is not ours any more (its lease lapsed and
    another claim took it): stale, as by key; the other claim fires it."""
    sched(q, ["a"])
    mine = by_key(q.claim4(lease_ms=1000))["a"]
    theirs = by_key(q.claim4(now=NOW + ms(1001)))["a"]
    res = q.fire([(T1, "q", "Default", [mine])], now=NOW + ms(1002), by_tid=True)
    assert res["segments"] == [{"status": "stale", "held": 0}]
    res = q.fire([(T1, "q", "Default", [theirs])], now=NOW + ms(1003), by_tid=True)
    assert res["fired"] == 1 and q.one("SELECT count(*) FROM queen.log_timers") == 0


@pytest.mark.parametrize("wait", [False, True])
def test_the_fire_looks_its_partitions_up_by_key_once_then_goes_by_address(q, connections, wait):
    """Every fire rewrites its partitions' rows, and under a snapshot held elsewhere each
    lookup of one by key walks every version written since (1.1 ms after 100,000 rewrites,
    0.004 ms at its address: tests/bench/versions). The fire finds its partitions by name once, with their addresses;
    the sweeper's first call (wait false) locks them at those addresses, and the append
    writes each new last_offset at the address it was locked at: one statement of the fire
    reads log_partitions by an index. A call that waits locks by id in one ordered
    statement (two). Before schema 36: three (ids, lock, the append's update by id)."""
    from sqlkit import nested_plans
    sched(q, ["a", "b"], partition="p1")
    sched(q, ["c"], partition="p2")
    # The partitions exist before the fire (the common case): provisioned by a push.
    for p in ("p1", "p2"):
        q.all("SELECT queen.log_push_v1(%s, 'q', %s, 1, %s, %s, %s)",
              (T1, p, psycopg2.Binary(stand_in_hash("push-" + p)), psycopg2.Binary(b"x"), NOW))
    rows = by_key(q.claim4())
    segs = [(T1, "q", "p1", [rows["a"], rows["b"]]), (T1, "q", "p2", [rows["c"]])]
    args = ([T1, T1], ["q", "q"], ["p1", "p2"], [2, 1],
            [psycopg2.Binary(b"".join(stand_in_hash(r["txn"]) for r in rs)) for _, _, _, rs in segs],
            [psycopg2.Binary(b"blob") for _ in segs], ["a", "b", "c"], [1, 1, 2],
            [str(rows[k]["claim_token"]) for k in ("a", "b", "c")], NOW, wait,
            [r["row_tid"] for _, _, _, rs in segs for r in rs])
    conn = connections()
    out, plans = nested_plans(
        conn, "SELECT queen.log_timers_fire_v2(%s::uuid[], %s::text[], %s::text[], %s::int[], %s::bytea[],"
              " %s::bytea[], %s::text[], %s::int[], %s::uuid[], %s, %s, %s::tid[])", args)
    res = out[0][0]
    assert [s["status"] for s in res["segments"]] == ["fired", "fired"] and res["fired"] == 3
    # The statements with a plan node that read log_partitions (not "never executed"): by
    # index (a walk of the versions) or at addresses.

    def reading(plan, *nodes):
        return any(n in line and "never executed" not in line for line in plan.splitlines() for n in nodes)
    by_index = [p for p in plans if reading(p, "Index Scan using log_partitions", "Index Only Scan using log_partitions",
                                            "Bitmap Index Scan on log_partitions")]
    by_address = [p for p in plans if reading(p, "Tid Scan on log_partitions")]
    assert len(by_index) == (1 if not wait else 2), [p[:300] for p in by_index]
    # The lock at the addresses (wait false) and the append's update, each a TID scan.
    assert len(by_address) == (2 if not wait else 1), by_address
    assert any("Update on log_partitions" in p for p in by_address), by_address
    assert sorted(q.one("SELECT array_agg(last_offset) FROM queen.log_partitions")) == [1, 2]
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0


@pytest.mark.parametrize("hint", ["kept", "rewritten", "another_partition", "unknown"])
def test_a_fire_given_where_its_partitions_rows_were_after_its_last_fire_takes_them_there(q, connections, hint):
    """Schema 37: the fire answers, per segment, the address its partition's row has after
    the fire's write (partitionTids); handed back on the next fire of those partitions
    (seg_partition_tids), a row still there is taken at it with no lookup by key (the one
    walk of the row's versions a fire still made under a held snapshot). A hint that no
    longer holds the row (a push wrote it since), that holds another partition's row, or
    that is unknown (null) is looked up by key, as without hints; every case fires."""
    from sqlkit import nested_plans
    for p in ("p1", "p2"):
        q.all("SELECT * FROM queen.log_provision_v1(%s, 'q', %s)", (T1, p))

    def fire(keys, partitions, hints):
        rows = by_key(q.claim4())
        args = ([T1] * len(keys), ["q"] * len(keys), partitions, [1] * len(keys),
                [psycopg2.Binary(stand_in_hash(rows[k]["txn"])) for k in keys],
                [psycopg2.Binary(b"blob") for _ in keys], keys, list(range(1, len(keys) + 1)),
                [str(rows[k]["claim_token"]) for k in keys], NOW, False,
                [rows[k]["row_tid"] for k in keys], True, hints)
        out, plans = nested_plans(
            connections(), "SELECT queen.log_timers_fire_v2(%s::uuid[], %s::text[], %s::text[], %s::int[],"
            " %s::bytea[], %s::bytea[], %s::text[], %s::int[], %s::uuid[], %s, %s, %s::tid[], %s, %s::tid[])", args)
        return out[0][0], plans

    sched(q, ["a"], partition="p1")
    sched(q, ["b"], partition="p2")
    first, _ = fire(["a", "b"], ["p1", "p2"], [None, None])
    assert first["statuses"] == "ff", first
    now_at = {r["name"]: r["tid"] for r in q.all("SELECT name, ctid::text AS tid FROM queen.log_partitions")}
    assert first["partitionTids"] == [now_at["p1"], now_at["p2"]], (first, now_at)

    hints = list(first["partitionTids"])
    if hint == "rewritten":
        q.all("SELECT queen.log_push_v1(%s, 'q', 'p1', 1, %s, %s, %s)",
              (T1, psycopg2.Binary(stand_in_hash("push-p1")), psycopg2.Binary(b"x"), NOW))
    elif hint == "another_partition":
        hints = [hints[1], hints[0]]
    elif hint == "unknown":
        hints = [None, hints[1]]
    sched(q, ["c"], partition="p1")
    sched(q, ["d"], partition="p2")
    second, plans = fire(["c", "d"], ["p1", "p2"], hints)
    assert second["statuses"] == "ff" and second["fired"] == 2, second

    def reading(plan, *nodes):
        return any(n in line and "never executed" not in line for line in plan.splitlines() for n in nodes)
    by_index = [p for p in plans if reading(p, "Index Scan using log_partitions", "Index Only Scan using log_partitions",
                                            "Bitmap Index Scan on log_partitions")]
    assert len(by_index) == (0 if hint == "kept" else 1), [p[:400] for p in by_index]
    now_at = {r["name"]: r["tid"] for r in q.all("SELECT name, ctid::text AS tid FROM queen.log_partitions")}
    assert second["partitionTids"] == [now_at["p1"], now_at["p2"]], (second, now_at)
    last = {r["name"]: r["last_offset"] for r in q.all("SELECT name, last_offset FROM queen.log_partitions")}
    assert last == {"p1": 1 if hint != "rewritten" else 2, "p2": 1}, last
    assert q.one("SELECT count(*) FROM queen.log_timers") == 0


def test_an_append_given_an_address_that_does_not_hold_the_partition_row_keeps_nothing(q):
    """The append writes each offset at the address its caller locked the row at; an
    address that does not hold the row (a caller's mistake) raises XX000 and nothing of the
    call is kept: no segment, no offset, no dedup index row."""
    for p in ("p1", "p2"):
        q.all("SELECT * FROM queen.log_provision_v1(%s, 'q', %s)", (T1, p))
    rows = q.all("SELECT id, queue_id, ctid::text AS tid FROM queen.log_partitions ORDER BY name")
    ids, qids = [r["id"] for r in rows], [r["queue_id"] for r in rows]
    swapped = [rows[1]["tid"], rows[0]["tid"]]  # each partition given the other's address
    with pytest.raises(psycopg2.Error) as e:
        q.all("SELECT * FROM queen.log_append_dedup_v1(%s, %s, %s, %s, %s, %s, NULL, false, %s, false, %s::tid[])",
              (qids, ids, [-1, -1], [1, 1],
               [psycopg2.Binary(stand_in_hash("a-1")), psycopg2.Binary(stand_in_hash("a-2"))],
               [psycopg2.Binary(b"x"), psycopg2.Binary(b"y")], NOW, swapped))
    assert e.value.pgcode == "XX000" and "not at the address" in str(e.value)
    assert q.one("SELECT count(*) FROM queen.log_segments") == 0
    assert q.one("SELECT count(*) FROM queen.log_txn_index") == 0
    assert q.one("SELECT array_agg(last_offset) FROM queen.log_partitions") == [-1, -1]
    # The right addresses append both.
    right = [r["tid"] for r in rows]
    out = q.all("SELECT * FROM queen.log_append_dedup_v1(%s, %s, %s, %s, %s, %s, NULL, false, %s, false, %s::tid[])",
                (qids, ids, [-1, -1], [1, 1],
                 [psycopg2.Binary(stand_in_hash("a-1")), psycopg2.Binary(stand_in_hash("a-2"))],
                 [psycopg2.Binary(b"x"), psycopg2.Binary(b"y")], NOW, right))
    assert out[0]["base_offsets"] == [0, 0]
    assert q.one("SELECT count(*) FROM queen.log_segments") == 2
