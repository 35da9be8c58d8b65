"""Timers.Probe* and Timers.Claim*: the read-only probe (values and index use) and the
claim (SKIP LOCKED, never waits, tokens, lease, fairness across tenants, switches)."""

import psycopg2
import pytest

from sqlkit import NOW, T1, T2, epoch_ms, ms, nested_plans


def schedule_many(q, keys, delay_ms=0, tenant=T1, queue="q", now=NOW):
    import base64
    ops = [{"op": "schedule", "queue": queue, "timerKey": k, "delayMs": delay_ms,
            "txn": "txn-" + k, "payload": base64.b64encode(b"{}").decode()} for k in keys]
    for i in range(0, len(ops), 256):
        q.apply(ops[i:i + 256], tenant=tenant, now=now)


# ---------------------------------------------------------------------------------------
# probe
# ---------------------------------------------------------------------------------------

def test_probe_on_an_empty_table(q):
    d = q.due()
    assert d["nextInMs"] is None and d["due"] == 0 and d["dueCapped"] is False
    assert d["lateMs"] == 0 and d["nowMs"] == epoch_ms(NOW)
    assert d["fireEnabled"] is True and d["maintenance"] is False


def test_probe_reports_the_nearest_instant(q):
    schedule_many(q, ["a"], delay_ms=2500)
    schedule_many(q, ["b"], delay_ms=900)
    d = q.due()
    assert d["nextInMs"] == 900 and d["due"] == 0 and d["lateMs"] == 0
    d = q.due(now=NOW + ms(899))
    assert d["nextInMs"] == 1 and d["due"] == 0
    d = q.due(now=NOW + ms(1000))
    assert d["nextInMs"] == 0 and d["due"] == 1 and d["lateMs"] == 100
    d = q.due(now=NOW + ms(3000))
    assert d["due"] == 2 and d["lateMs"] == 2100 and d["dueCapped"] is False


def test_probe_caps_the_due_count(q):
    schedule_many(q, ["k%d" % i for i in range(7)])
    d = q.due(cap=3)
    assert d["due"] == 3 and d["dueCapped"] is True
    d = q.due(cap=7)
    assert d["due"] == 7 and d["dueCapped"] is False


def test_probe_sees_claims_and_backoff_as_not_due(q):
    schedule_many(q, ["a", "b"])
    rows = q.claim(lease_ms=5000, max_rows=1)
    d = q.due()
    assert d["due"] == 1
    q.fail(rows, klass="transient", transient_backoff_ms=2000)
    d = q.due()
    assert d["due"] == 1 and d["nextInMs"] == 0
    q.claim(lease_ms=5000)          # takes b
    d = q.due()
    assert d["due"] == 0 and d["nextInMs"] == 2000    # a's backoff ends first
    d = q.due(now=NOW + ms(5000))
    # b's lease lapsed too; since schema version 9 a lapsed row waits where it was claimed
    # (its due_at), so the lateness is counted from b's own due instant, not its lease's end.
    assert d["due"] == 2 and d["lateMs"] == 5000


def test_probe_switches(q):
    q.switch("timers_fire_enabled", False)
    assert q.due()["fireEnabled"] is False
    q.switch("timers_fire_enabled", True)
    q.switch("maintenance_mode", True)
    d = q.due()
    assert d["fireEnabled"] is False and d["maintenance"] is True
    q.switch("maintenance_mode", None)
    assert q.due()["fireEnabled"] is True


def test_probe_is_one_index_walk_not_a_scan(q, db):
    schedule_many(q, ["k%05d" % i for i in range(6000)], delay_ms=60000)
    schedule_many(q, ["due%03d" % i for i in range(20)], delay_ms=0)
    q.exec("ANALYZE queen.log_timers")
    out, plans = nested_plans(db, "SELECT queen.log_timers_due_v2(%s::int2[], %s, 2000, NULL, NULL)", (None, NOW), like="log_timers")
    d = out[0][0]
    assert d["due"] == 20 and d["nextInMs"] == 0
    walks = [p for p in plans if "FROM queen.log_timers t" in p]
    # Schema version 9: the first live row (the floor's), the first row in nobody's hands,
    # and the count. Nothing is in flight, so no walk for the earliest lease end.
    assert len(walks) == 3, plans
    for plan in walks:
        assert "Seq Scan on log_timers" not in plan, plan
        assert "log_timers_due_idx" in plan, plan
    # Each head is the index's first entry (one row read), the count stops at the due rows:
    # none reads the 6,000 rows due later.
    heads = [p for p in walks if "LIMIT 1" in p]
    assert len(heads) == 2, walks
    for head in heads:
        assert "rows=1 loops=1" in head, head
    count = [p for p in walks if "count(*)" in p][0]
    assert "rows=20 loops=1" in count, count


def test_the_claim_is_heap_only_and_leaves_due_at_where_it_was(q, connections):
    """Schema version 9: the claim changes no indexed column (due_at keeps its value through
    claim_due), so PostgreSQL keeps the new versions on their pages (HOT). Under version 8
    the claim moved visible_at, an indexed column, and no claim was ever heap-only."""
    schedule_many(q, ["k%03d" % i for i in range(200)])
    before = {r["timer_key"]: r["due_at"] for r in q.all("SELECT timer_key, due_at FROM queen.log_timers")}
    c = connections()
    c.autocommit = False
    with c.cursor() as cur:
        cur.execute("SELECT count(*) FROM queen.log_timers_claim_v4(NULL, %s, 30000, 200, NULL, NULL, NULL,"
                    " NULL, NULL, NULL, NULL, NULL)", (NOW,))
        assert cur.fetchone()[0] == 200
        # This transaction's own counts, before they are flushed to the cumulative view.
        cur.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables"
                    " WHERE relid = 'queen.log_timers'::regclass")
        upd, hot = cur.fetchone()
    c.commit()
    # Nearly all: a page whose rows' new versions do not all fit in its free half puts the
    # last ones elsewhere (1,828 of 2,000 heap-only in tests/bench/README.md, "Sixth pass").
    assert upd == 200 and hot >= 150, (upd, hot)
    rows = q.all("SELECT timer_key, due_at, claim_due, visible_at, claim_token FROM queen.log_timers")
    assert {r["timer_key"]: r["due_at"] for r in rows} == before
    assert all(r["claim_token"] is not None and r["claim_due"] == r["due_at"]
               and r["visible_at"] == NOW + ms(30000) for r in rows)


def test_claim_is_one_ordered_index_walk(q, db):
    schedule_many(q, ["k%05d" % i for i in range(3000)], delay_ms=60000)
    schedule_many(q, ["due%03d" % i for i in range(30)], delay_ms=0)
    q.exec("ANALYZE queen.log_timers")
    claim = ("SELECT timer_key FROM queen.log_timers_claim_v4(%s::int2[], %s, 30000, %s, %s,"
             " NULL, NULL, NULL, NULL, NULL, NULL, NULL)")
    out, plans = nested_plans(db, claim, (None, NOW, 10, 50), like="log_timers")
    assert len(out) == 10
    walk = [p for p in plans if "WITH shares" in p]
    assert len(walk) == 1, plans
    plan = walk[0]
    assert "Seq Scan on log_timers" not in plan, plan
    assert "Index Scan using log_timers_due_idx" in plan, plan
    # No sort of candidates ahead of the lock: the index order is the claim order, and the
    # walk stops at the pool instead of reading every due row: max_rows, with the tenants'
    # share on or off (a tenant behind a backlog is reached by its name, not a wider pool).
    lock = plan[plan.index("LockRows", plan.index("CTE oldest")):]
    assert "rows=10 loops=1" in lock.splitlines()[0], plan
    assert "hashed SubPlan" in lock, plan  # the shares' rows passed by one hash, not a loop
    out, plans = nested_plans(db, claim, (None, NOW, 8, 2), like="log_timers")
    assert len(out) == 8
    plan = [p for p in plans if "WITH shares" in p][0]
    lock = plan[plan.index("LockRows", plan.index("CTE oldest")):]
    assert "rows=8 loops=1" in lock.splitlines()[0], plan


def test_the_claim_and_the_probe_are_planned_once_per_session(q, connections):
    """Schema version 11: log_timers_claim_v4 and log_timers_due_v2 run under plan_cache_mode
    = force_generic_plan. Until then plpgsql kept a custom plan for the claim's statement and
    planned it afresh on every call (1.7-2.7 ms a claim, tests/bench/README.md "Ninth pass"),
    reading the due index's live ends for its estimates. Counted by pg_stat_statements
    (tests/pg loads it) in a fresh session: one plan for six calls."""
    assert q.one("SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'") == 1, \
        "pg_stat_statements is missing: tests/pg preloads and creates it"
    schedule_many(q, ["k%03d" % i for i in range(120)])
    q.exec("ANALYZE queen.log_timers")
    c = connections()
    with c.cursor() as cur:
        cur.execute("SET pg_stat_statements.track = 'all'")
        cur.execute("SET pg_stat_statements.track_planning = on")

    def counted(text):
        with c.cursor() as cur:
            cur.execute("SELECT coalesce(sum(plans), 0), coalesce(sum(calls), 0) FROM pg_stat_statements"
                        " WHERE NOT toplevel AND query LIKE %s", (text + "%",))
            return cur.fetchone()

    # The claim's statement, and the probe's walk to the first row in nobody's hands (plpgsql
    # hands the statement on without its INTO).
    claim_text, probe_text = "WITH shares AS MATERIALIZED", "SELECT t.due_at%WHERE t.due_at >= v_first"
    claim0, probe0 = counted(claim_text), counted(probe_text)
    for k in range(6):
        with c.cursor() as cur:
            cur.execute("SELECT count(*) FROM queen.log_timers_claim_v4(NULL, %s, 30000, 10, NULL, NULL,"
                        " NULL, NULL, NULL, NULL, NULL, %s::uuid[])", (NOW + ms(k), [T1]))
            assert cur.fetchone()[0] == 10
            cur.execute("SELECT queen.log_timers_due_v2(NULL, %s, 2000, NULL, NULL)", (NOW + ms(k),))
            assert cur.fetchone()[0]["due"] == 120 - 10 * (k + 1)
    claim1, probe1 = counted(claim_text), counted(probe_text)
    assert claim1[1] - claim0[1] == 6 and claim1[0] - claim0[0] == 1, (claim0, claim1)
    assert probe1[1] - probe0[1] == 6 and probe1[0] - probe0[0] == 1, (probe0, probe1)


# ---------------------------------------------------------------------------------------
# claim
# ---------------------------------------------------------------------------------------

def test_claim_stamps_tokens_and_lease(q):
    schedule_many(q, ["b"], now=NOW - ms(300))
    schedule_many(q, ["a"], now=NOW)
    schedule_many(q, ["c"], now=NOW - ms(100))
    schedule_many(q, ["later"], delay_ms=10000)
    rows = q.claim(now=NOW + ms(50), lease_ms=30000)
    assert [r["timer_key"] for r in rows] == ["b", "c", "a"]      # pre-claim visible_at order
    assert [r["late_ms"] for r in rows] == [350, 150, 50]
    assert rows[0]["deliver_at_ms"] == epoch_ms(NOW) - 300
    assert len({r["claim_token"] for r in rows}) == 3
    for r in rows:
        t = q.timer(r["timer_key"])
        assert t["claim_token"] == r["claim_token"]
        assert t["claimed_until"] == NOW + ms(50) + ms(30000)
        assert r["partition"] == "Default" and r["txn"] == "txn-" + r["timer_key"]
        assert bytes(r["payload"]) == b"{}" and r["attempts"] == 0
        assert r["producer_sub"] == "producer-1" and r["tenant_id"] == T1 and r["queue"] == "q"
    assert q.claim(now=NOW + ms(60)) == []                        # in somebody's hands


def test_claim_respects_max_rows_and_takes_back_lapsed_leases(q):
    schedule_many(q, ["k%d" % i for i in range(10)])
    first = q.claim(max_rows=4, lease_ms=1000)
    assert len(first) == 4
    second = q.claim(max_rows=100, lease_ms=1000)
    assert len(second) == 6
    assert not {r["timer_key"] for r in first} & {r["timer_key"] for r in second}
    again = q.claim(now=NOW + ms(1000), max_rows=100)              # leases lapsed at == now
    assert len(again) == 10
    assert not {r["claim_token"] for r in again} & {r["claim_token"] for r in first + second}


def test_claim_from_two_connections_takes_disjoint_rows(q, connections):
    schedule_many(q, ["k%02d" % i for i in range(40)])
    a = connections()
    a.autocommit = False
    b = connections(options="-c statement_timeout=10000")
    with a.cursor() as cur:
        cur.execute("SELECT timer_key FROM queen.log_timers_claim_v4(null, %s, 30000, 15, 50, NULL, NULL, NULL, NULL, NULL, NULL, NULL)", (NOW,))
        got_a = {r[0] for r in cur.fetchall()}
    # a has not committed: its rows are locked, b skips them without waiting
    with b.cursor() as cur:
        cur.execute("SELECT timer_key FROM queen.log_timers_claim_v4(null, %s, 30000, 100, 50, NULL, NULL, NULL, NULL, NULL, NULL, NULL)", (NOW,))
        got_b = {r[0] for r in cur.fetchall()}
    # Not waiting is proven by the lock still held: a wait would end in the lock or
    # statement timeout (an error), not in a result. No wall-clock bound.
    a.commit()
    assert len(got_a) == 15 and len(got_b) == 25 and not got_a & got_b


def test_claim_never_waits_on_a_locked_row(q, connections):
    schedule_many(q, ["k%d" % i for i in range(6)])
    locker = connections()
    locker.autocommit = False
    with locker.cursor() as cur:
        cur.execute("SELECT timer_key FROM queen.log_timers WHERE timer_key IN ('k1', 'k3', 'k5') FOR UPDATE")
    claimer = connections(options="-c statement_timeout=1000 -c lock_timeout=500")
    with claimer.cursor() as cur:
        cur.execute("SELECT timer_key FROM queen.log_timers_claim_v4(null, %s, 30000, 100, 50, NULL, NULL, NULL, NULL, NULL, NULL, NULL)", (NOW,))
        got = sorted(r[0] for r in cur.fetchall())
    assert got == ["k0", "k2", "k4"]
    locker.rollback()
    assert sorted(r["timer_key"] for r in q.claim()) == ["k1", "k3", "k5"]


def test_claim_is_fair_across_tenants_with_identical_queue_names(q):
    # T1 floods (older rows), T2 has a few newer ones; same queue name, same keys.
    keys1 = ["k%02d" % i for i in range(12)]
    schedule_many(q, keys1, tenant=T1, now=NOW - ms(10000))
    schedule_many(q, keys1[:4], tenant=T2, now=NOW - ms(1000))
    # The oldest pool is T1's ten; T2, named as the probe names it, gets its share of 3, and
    # the rounds of 3 per tenant then fill the claim with T1's: 3 + 3, 3, 1.
    rows = q.claim(max_rows=10, per_tenant=3, tenants=[T2])
    per = {T1: 0, T2: 0}
    for r in rows:
        per[r["tenant_id"]] += 1
    assert per == {T1: 7, T2: 3}
    # returned in due_at order: all of T1 (older) first
    assert [r["tenant_id"] for r in rows] == [T1] * 7 + [T2] * 3


def test_claim_is_work_conserving(q):
    schedule_many(q, ["k%02d" % i for i in range(12)], tenant=T1)
    rows = q.claim(max_rows=10, per_tenant=3)
    assert len(rows) == 10


def test_claim_without_fairness_cap_still_fills(q):
    schedule_many(q, ["k%02d" % i for i in range(5)], tenant=T1)
    schedule_many(q, ["k%02d" % i for i in range(5)], tenant=T2)
    assert len(q.claim(max_rows=8, per_tenant=None)) == 8


def test_claim_takes_only_rows_of_the_given_shards(q):
    schedule_many(q, ["k%03d" % i for i in range(200)])
    shards = q.all("SELECT DISTINCT shard FROM queen.log_timers ORDER BY shard")
    first, second = shards[0]["shard"], shards[1]["shard"]
    n_first = q.one("SELECT count(*) FROM queen.log_timers WHERE shard = %s", (first,))
    rows = q.claim(shards=[second, first], max_rows=1000)
    got = {q.timer(r["timer_key"])["shard"] for r in rows}
    assert got == {first, second}
    rows2 = q.claim(shards=[first], max_rows=1000)
    assert rows2 == []
    assert n_first > 0


def test_claim_returns_nothing_while_the_fire_is_switched_off(q):
    schedule_many(q, ["a", "b"])
    q.switch("timers_fire_enabled", False)
    assert q.claim() == []
    q.switch("timers_fire_enabled", None)
    q.switch("maintenance_mode", True)
    assert q.claim() == []
    assert q.one("SELECT count(*) FROM queen.log_timers WHERE claim_token IS NULL") == 2
    q.switch("maintenance_mode", False)
    assert len(q.claim()) == 2


def test_paused_fire_drains_oldest_first(q):
    schedule_many(q, ["new"], delay_ms=0, now=NOW)
    schedule_many(q, ["old"], delay_ms=0, now=NOW - ms(60000))
    q.switch("timers_fire_enabled", False)
    assert q.due(now=NOW + ms(5000))["due"] == 2
    q.switch("timers_fire_enabled", True)
    rows = q.claim(now=NOW + ms(5000))
    assert [r["timer_key"] for r in rows] == ["old", "new"]


def test_claim_refuses_a_bad_lease(q):
    with pytest.raises(psycopg2.Error) as e:
        q.claim(lease_ms=0)
    assert e.value.pgcode == "22023"


def test_hot_path_functions_never_plan_a_sequential_scan(q):
    # A plan made while a table looked empty (a fresh install, a TRUNCATE before
    # autoanalyze) is cached for the session; the fire's dedup probe once ran at 1 s per call
    # that way in the bench (a sequential scan of everything fired). The hot path pins
    # enable_seqscan off, and its nested helpers inherit the setting. (The wrappers of
    # 006_compat.sql call these bodies, whose own settings apply.)
    for fn in ("log_timers_claim_v4", "log_timers_due_v2", "log_timers_fire_v2", "log_push_v1"):
        cfg = q.one("SELECT proconfig FROM pg_proc WHERE oid = to_regproc(%s)", ("queen." + fn,))
        assert "enable_seqscan=off" in cfg, (fn, cfg)
