"""The tenants' ring as a table (queen.log_timers_tenants, schema version 27).

The claims under a backlog walk the tenants with pending timers in uuid order
(log_timers_tenant_ring_v1). The ring is read from a table of its own, entered by the commit
that writes a tenant's timers (log_timers_at_commit_v1) and tidied beside the cycle
(log_timers_tenants_tidy_v1), so that finding the next tenant never passes the fired rows a
snapshot held elsewhere keeps. These tests hold what the table promises: every commit's tenant
is in it, the ring names only what it holds, the tidy removes only tenants without timers,
and a ring's walk reads nothing of queen.log_timers but one descent of the tenant's due index.
"""
import uuid

from sqlkit import NOW, T1, T2, ms, nested_plans, ring_place, sched_many, set_ring_place

RING = "SELECT queen.log_timers_tenant_ring_v1(%s, %s, %s, %s)"


def ring_tenants(q):
    return [r["tenant_id"] for r in q.all("SELECT tenant_id FROM queen.log_timers_tenants ORDER BY 1")]


def tidy(q, max_n=100):
    return q.one("SELECT queen.log_timers_tenants_tidy_v1(%s)", (max_n,))


def index_reads(q, index):
    """Index entries read from `index` by this database's sessions, as flushed so far
    (pg_stat_force_next_flush makes this session's counts of the statement before current)."""
    q.exec("SELECT pg_stat_force_next_flush()")
    q.exec("SELECT pg_stat_clear_snapshot()")
    return q.one("SELECT idx_tup_read FROM pg_stat_user_indexes WHERE schemaname = 'queen'"
                 " AND indexrelname = %s", (index,))


def fired_under_a_held_snapshot(q, connections):
    """A REPEATABLE READ snapshot held on a connection of its own (returned: roll it back),
    then tenant 1's 5,000 timers fired (deleted: their entries stay), 5 due of tenant 1 and 5 of
    tenant 2, and ANALYZE, which counts live rows only: the planner takes the table for 10
    rows, as it does under a held snapshot in production."""
    snap = connections(autocommit=False)
    c = snap.cursor()
    c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    c.execute("SELECT count(*) FROM queen.log_timers_tenants")
    sched_many(q, 5000, tenant=T1, now=NOW - ms(10_000), prefix="f")
    q.exec("DELETE FROM queen.log_timers WHERE tenant_id = %s", (str(T1),))  # fired
    sched_many(q, 5, tenant=T1, now=NOW - ms(1000), prefix="a")
    sched_many(q, 5, tenant=T2, now=NOW - ms(1000), prefix="b")
    q.exec("ANALYZE queen.log_timers")
    return snap


def test_a_commit_enters_its_tenants_once_and_a_rename_enters_the_new_tenant(q):
    sched_many(q, 30, tenant=T1, now=NOW - ms(1000))
    sched_many(q, 3, tenant=T2, now=NOW - ms(1000))
    assert ring_tenants(q) == sorted([T1, T2])
    # a rename that moves a queue's timers to another tenant enters that tenant
    other = uuid.UUID(int=0x77)
    q.exec("INSERT INTO queen.queues (tenant_id, name) VALUES (%s, 'q')", (str(T2),))
    q.exec("UPDATE queen.queues SET tenant_id = %s WHERE tenant_id = %s AND name = 'q'", (str(other), str(T2)))
    assert q.one("SELECT count(*) FROM queen.log_timers WHERE tenant_id = %s", (str(other),)) == 3
    assert other in ring_tenants(q)


def test_the_ring_names_only_the_tenants_in_its_table(q):
    """Tenant 1's 300 rows are older than tenant 2's 5; with tenant 2 out of the table a claim
    under a backlog is the oldest-first walk (tenant 1 only); back in, tenant 2 gets its share."""
    sched_many(q, 300, tenant=T1, now=NOW - ms(2000), prefix="a")
    sched_many(q, 5, tenant=T2, now=NOW - ms(1000), prefix="b")
    q.exec("DELETE FROM queen.log_timers_tenants WHERE tenant_id = %s", (str(T2),))
    assert q.one(RING, (NOW, None, False, 64)) == [T1]
    rows = q.claim4(max_rows=64, per_tenant=8, tenants=[])
    assert {r["tenant_id"] for r in rows} == {T1}
    q.exec("UPDATE queen.log_timers SET claim_token = NULL, claimed_until = NULL, claim_due = NULL")
    q.exec("INSERT INTO queen.log_timers_tenants VALUES (%s)", (str(T2),))
    assert sorted(q.one(RING, (NOW, None, False, 64))) == sorted([T1, T2])
    rows = q.claim4(max_rows=64, per_tenant=8, tenants=[])
    assert sum(1 for r in rows if r["tenant_id"] == T2) == 5


def test_the_ring_looks_at_1024_tenants_a_call_and_moves_its_place_to_the_last_named(q):
    """1,500 tenants with a timer due later (none due) and 3 due ones after them: a claim's
    ring looks at 1,024 and names none, the next goes on from there and names the 3."""
    later = [uuid.UUID(int=0x10000 + i) for i in range(1500)]
    q.exec("INSERT INTO queen.log_timers_tenants SELECT unnest(%s::uuid[])", ([str(t) for t in later],))
    due = [uuid.UUID(int=0x90000 + i) for i in range(3)]
    for t in due:
        sched_many(q, 2, tenant=t, now=NOW - ms(1000), prefix="d")
    set_ring_place(q, uuid.UUID(int=0))
    q.exec("BEGIN")
    assert q.one(RING, (NOW, None, True, 64)) == []
    assert ring_place(q) == later[1023]
    assert q.one(RING, (NOW, None, True, 2)) == due[:2]
    assert ring_place(q) == due[1]
    assert q.one(RING, (NOW, None, True, 2)) == due[2:]
    q.exec("COMMIT")


def test_the_tidy_removes_the_tenants_without_timers_and_keeps_the_rest(q):
    sched_many(q, 4, tenant=T1, now=NOW - ms(1000))
    sched_many(q, 4, tenant=T2, delay_ms=3_600_000)  # future timers keep a tenant too
    gone = [uuid.UUID(int=0x500 + i) for i in range(20)]
    q.exec("INSERT INTO queen.log_timers_tenants SELECT unnest(%s::uuid[])", ([str(t) for t in gone],))
    assert tidy(q, 5)["looked"] == 5
    a = tidy(q, 1000)
    assert a["looked"] + 5 >= 22 and a["tenants"] == 2
    assert ring_tenants(q) == sorted([T1, T2])


def test_the_tidy_passes_an_entry_another_transaction_holds(q, connections):
    gone = uuid.UUID(int=0x600)
    q.exec("INSERT INTO queen.log_timers_tenants VALUES (%s)", (str(gone),))
    other = connections(autocommit=False)
    other.cursor().execute("SELECT 1 FROM queen.log_timers_tenants WHERE tenant_id = %s FOR UPDATE", (str(gone),))
    try:
        assert tidy(q)["removed"] == 0
    finally:
        other.rollback()
    assert tidy(q)["removed"] == 1 and ring_tenants(q) == []


def test_the_ring_reads_no_fired_row_of_a_busy_tenant_under_a_held_snapshot(q, connections):
    """A snapshot held elsewhere keeps every fired row's index entries. Tenant 1 (first in the
    ring) had 5,000 timers fired; tenant 2 has 5 due. The ring finds both without reading the
    primary key (where finding the next tenant in queen.log_timers passed tenant 1's dead
    entries), and its one descent of the due index per tenant starts at the floor, whatever the
    planner believes of the table's size."""
    snap = fired_under_a_held_snapshot(q, connections)
    try:
        set_ring_place(q, uuid.UUID(int=0))
        pk0 = index_reads(q, "log_timers_pkey")
        due0 = index_reads(q, "log_timers_tenant_due_at_idx")
        assert q.one(RING, (NOW, NOW - ms(5000), True, 64)) == [T1, T2]
        pk1 = index_reads(q, "log_timers_pkey")
        due1 = index_reads(q, "log_timers_tenant_due_at_idx")
        assert pk1 - pk0 == 0
        assert due1 - due0 <= 4, due1 - due0  # one live entry found per tenant
    finally:
        snap.rollback()


def test_a_late_commit_that_rewrote_its_row_after_writing_it_is_still_moved(q, connections):
    """The commit's trigger moves a late row by its address; a later write of the same
    transaction that leaves no event of its own (here a payload rewritten by hand) moves the
    row, and then it is found by its key."""
    conn = connections(autocommit=False)
    cur = conn.cursor()
    cur.execute("SELECT now()")
    start = cur.fetchone()[0]
    cur.execute("SELECT queen.log_timers_apply_v1(%s::jsonb, %s, 'p', now())",
                ('[{"op": "schedule", "queue": "q", "timerKey": "x", "delayMs": 0, "txn": "t", "payload": "e30="}]',
                 str(T1)))
    cur.execute("UPDATE queen.log_timers SET payload = '\\x7b7d7b7d' WHERE timer_key = 'x'")
    cur.execute("SELECT pg_sleep(1.2)")
    cur.execute("SELECT clock_timestamp()")
    before = cur.fetchone()[0]
    conn.commit()
    r = q.one("SELECT row_to_json(t) FROM (SELECT due_at, claimed_until FROM queen.log_timers) t")
    assert r["claimed_until"] is not None and r["due_at"] == r["claimed_until"]
    assert q.one("SELECT due_at >= %s FROM queen.log_timers", (before,)) and start < before


def test_the_commits_move_of_a_late_row_is_a_tid_scan_whatever_the_tables_size(q, connections):
    """On a fresh, small table the planner once took (tenant_id, due_at) for the move's lookup
    by key, which walks a tenant's rows for every row of a large import. The move goes by the
    row's address: every plan of it (custom and generic, 12 rows) is a TID scan."""
    conn = connections(autocommit=False)
    cur = conn.cursor()
    ops = ",".join('{"op": "schedule", "queue": "q", "timerKey": "k%d", "delayMs": 0, "txn": "t%d", "payload": "e30="}'
                   % (i, i) for i in range(12))
    cur.execute("SELECT queen.log_timers_apply_v1(%s::jsonb, %s, 'p', now())", ("[" + ops + "]", str(T1)))
    cur.execute("SELECT pg_sleep(1.2)")
    cur.execute("LOAD 'auto_explain'")
    for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                    "auto_explain.log_level = notice", "client_min_messages = notice"):
        cur.execute("SET " + setting)
    conn.notices.clear()
    conn.commit()
    moves = [n for n in conn.notices if "SET claimed_until = v_clock" in n]
    assert len(moves) >= 12, len(moves)
    for plan in moves:
        assert "Tid Scan" in plan and "log_timers_tenant_due_at_idx" not in plan, plan
    assert q.one("SELECT count(*) FROM queen.log_timers WHERE claimed_until IS NOT NULL") == 12


def test_every_walk_of_the_due_index_is_an_index_scan_when_analyze_saw_only_live_rows(q, db, connections):
    """Under a held snapshot ANALYZE counts the live rows only, and the planner takes a table of
    a million dead rows for ten: a bitmap scan of the whole range then looks as cheap as one
    descent (the ring took 373 ms so, reading 1,062,213 entries). The probe, the claim (its
    head, its ring, its shares, its oldest-first walk) and the walk from the head are planned
    as index scans in index order, which stop at their LIMIT."""
    snap = fired_under_a_held_snapshot(q, connections)
    try:
        floor = NOW - ms(5000)
        for sql, args in (("SELECT queen.log_timers_due_v2(NULL, %s, 2000, %s, NULL)", (NOW, floor)),
                          ("SELECT count(*) FROM queen.log_timers_claim_v4(NULL, %s, 30000, 100, 5, NULL, NULL,"
                           " NULL, NULL, NULL, %s, '{}'::uuid[])", (NOW, floor)),
                          ("SELECT queen.log_timers_below_floor_v1(NULL, %s)", (floor,)),
                          ("SELECT queen.log_timers_release_claims_v2(ARRAY[gen_random_uuid()], %s, %s, %s, %s)",
                           (NOW, NOW + ms(30_000), NOW, floor))):
            for _ in range(6):  # past plpgsql's first custom plans
                db.rollback() if not db.autocommit else None
                _, plans = nested_plans(db, sql, args, like="queen.log_timers t")
                q.exec("UPDATE queen.log_timers SET claim_token = NULL, claimed_until = NULL, claim_due = NULL")
            assert plans, sql
            for p in plans:
                assert "Bitmap" not in p and "Seq Scan on log_timers " not in p, p
                assert not whole_tenant_index_scans(p), p
    finally:
        snap.rollback()


def test_the_functions_whose_walks_are_all_in_the_due_index_order_pin_sorts_off(db):
    """The probe and a lost claim's hand-back read log_timers by due_at ranges only, each in
    the due index's order: with enable_sort off a plan that reads the tenant index by its
    second column (and would need a sort for the order) is never the cheaper one, whatever
    ANALYZE saw (the held-row run planned the probe's count so; whole_tenant_index_scans)."""
    with db.cursor() as cur:
        cur.execute("SELECT p.proname, p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                    " WHERE n.nspname = 'queen' AND p.proname IN ('log_timers_due_v2', 'log_timers_release_claims_v2')")
        found = dict(cur.fetchall())
    assert set(found) == {"log_timers_due_v2", "log_timers_release_claims_v2"}, found
    for name, cfg in found.items():
        assert "enable_sort=off" in cfg, (name, cfg)


def whole_tenant_index_scans(plan):
    """The scans of log_timers_tenant_due_at_idx in plan whose Index Cond does not name the
    tenant: with due_at, its second column, bounded and tenant_id not, such a scan reads the
    whole index (every tenant's entries, every dead one a held snapshot keeps) where the due
    index reads the range. A generic plan that costs both alike may take either unless the
    statement orders by due_at (schema version 37: the probe's count of the due rows read
    the whole index so, 16.5 ms a call after 29 minutes of a held snapshot)."""
    lines = plan.splitlines()
    out = []
    for i, line in enumerate(lines):
        if "using log_timers_tenant_due_at_idx" in line:
            cond = next((c for c in lines[i + 1:i + 4] if "Index Cond:" in c), "")
            if "tenant_id =" not in cond and "ROW(tenant_id, due_at) <=" not in cond:
                out.append(line.strip() + " / " + cond.strip())
    return out
