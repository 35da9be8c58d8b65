"""Schema.Apply*: the files are idempotent, safe to apply concurrently, self-describing,
and keep the design document's rules (no advisory lock, no LISTEN/NOTIFY, no clock read
inside a function, dated storage settings)."""
import os
import re
import shutil
import subprocess
import threading
import uuid

import psycopg2
import pytest

from queenkit import apply_schema, connect, sql_files
from sqlkit import NOW, T1, T2, Queen, ms

RETRYABLE = {"23505", "42P07", "42710", "XX000"}


def strip_comments(text):
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


# ---------------------------------------------------------------------------------------
# static rules
# ---------------------------------------------------------------------------------------

def test_files_are_numbered_and_complete():
    names = [os.path.basename(p) for p in sql_files()]
    assert names == ["001_log.sql", "002_timers.sql", "003_fire.sql", "004_kv.sql",
                     "005_kv_maintenance.sql", "006_compat.sql", "007_roles.sql", "008_version.sql"]


def test_no_listen_notify_outside_comments():
    for path in sql_files():
        code = strip_comments(open(path, encoding="utf-8").read())
        for word in ("listen", "notify", "pg_notify"):
            assert not re.search(r"\b%s\b" % word, code, re.I), (path, word)


def test_no_advisory_lock_no_meta_commands_no_explicit_transaction():
    for path in sql_files():
        code = strip_comments(open(path, encoding="utf-8").read())
        assert "advisory" not in code.lower(), path
        for line in code.splitlines():
            assert not line.lstrip().startswith("\\"), (path, line)
            assert not re.match(r"^\s*(BEGIN|COMMIT|ROLLBACK|START\s+TRANSACTION)\s*;", line, re.I), (path, line)


def test_every_function_has_a_locks_header():
    for path in sql_files():
        lines = open(path, encoding="utf-8").read().splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"CREATE OR REPLACE FUNCTION (queen\.\w+)", line)
            if not m:
                continue
            block = []
            j = i - 1
            while j >= 0 and lines[j].startswith("--"):
                block.append(lines[j])
                j -= 1
            header = "\n".join(block)
            assert "Locks" in header, "%s: %s has no 'Locks' header comment" % (path, m.group(1))


# Every function is held to the rule; a name here would be an exception to justify.
LONG_FUNCTIONS = set()


def test_no_function_is_longer_than_150_lines():
    """From CREATE to the closing $fn$, header comment not counted: a longer body is split
    into internal helpers (SECURITY INVOKER, granted to nobody), as the fire is (003)."""
    for path in sql_files():
        lines = open(path, encoding="utf-8").read().splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"CREATE OR REPLACE FUNCTION (queen\.\w+)", line)
            if not m or m.group(1) in LONG_FUNCTIONS:
                continue
            end = next(j for j in range(i, len(lines)) if lines[j].rstrip().endswith("$fn$;"))
            assert end - i + 1 <= 150, "%s: %s is %d lines" % (path, m.group(1), end - i + 1)


def test_storage_settings_carry_dated_blocks():
    for path in sql_files():
        text = open(path, encoding="utf-8").read()
        code_lines = [l for l in text.splitlines() if not l.lstrip().startswith("--")]
        for setting in ("fillfactor", "autovacuum_", "vacuum_truncate", "SET STORAGE"):
            if any(setting in l for l in code_lines):
                comments = "\n".join(l for l in text.splitlines() if l.lstrip().startswith("--"))
                assert re.search(r"%s.*\n?.*(measured|not measured) \(\d{4}-\d{2}-\d{2}\)" % setting,
                                 comments), (path, setting)


def test_no_function_reads_the_clock(q):
    rows = q.all("""SELECT p.proname, p.prosrc FROM pg_proc p
                     JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'queen'""")
    assert len(rows) >= 20
    for r in rows:
        if r["proname"] in ("log_timers_not_behind_v1", "log_timers_at_commit_v1",
                           "log_timers_queue_gone_v1"):
            # the triggers: a write by hand (or a queue's removal) has no caller's now, and the commit's clock is
            # what log_timers_at_commit_v1 is for (002_timers.sql)
            continue
        src = strip_comments(r["prosrc"]).lower()
        for clock in ("now()", "current_timestamp", "clock_timestamp", "statement_timestamp",
                      "transaction_timestamp", "localtimestamp", "timeofday"):
            assert clock not in src, (r["proname"], clock)


def test_log_timers_shape(q):
    idx = q.all("""SELECT indexrelid::regclass::text AS name, indisprimary
                     FROM pg_index WHERE indrelid = 'queen.log_timers'::regclass""")
    secondary = [r["name"] for r in idx if not r["indisprimary"]]
    assert sorted(secondary) == ["queen.log_timers_due_idx", "queen.log_timers_tenant_due_at_idx"]
    # Schema version 9: no index on anything a claim changes (claim_token, claimed_until,
    # visible_at, updated_at), so that the claim's UPDATE can be heap-only.
    for name in secondary:
        d = q.one("SELECT pg_get_indexdef(%s::regclass)", (name,))
        assert " WHERE " not in d and not any(c in d for c in ("claim_token", "claimed_until", "visible_at")), d
    assert "(tenant_id, due_at)" in q.one("SELECT pg_get_indexdef('queen.log_timers_tenant_due_at_idx'::regclass)")
    opts = q.one("SELECT reloptions FROM pg_class WHERE oid = 'queen.log_timers'::regclass")
    assert "fillfactor=50" in opts and "vacuum_truncate=off" in opts
    assert any(o.startswith("autovacuum_vacuum_scale_factor=") for o in opts)
    kv_opts = q.one("SELECT reloptions FROM pg_class WHERE oid = 'queen.kv'::regclass")
    assert "fillfactor=100" in kv_opts and "vacuum_truncate=off" in kv_opts
    kv_idx = q.all("""SELECT pg_get_indexdef(indexrelid) AS d, indisprimary
                        FROM pg_index WHERE indrelid = 'queen.kv'::regclass""")
    partial = [r["d"] for r in kv_idx if not r["indisprimary"]]
    assert len(partial) == 1 and "(shard, expires_at)" in partial[0] and "IS NOT NULL" in partial[0]


def test_generated_shard_and_visible_at(q):
    for i in range(50):
        q.schedule("key-%d" % i, delay_ms=1000)
    bad = q.one("""SELECT count(*) FROM queen.log_timers
                    WHERE shard <> (hashtextextended(timer_key, 0) & 63)
                       OR shard NOT BETWEEN 0 AND 63 OR visible_at <> deliver_at""")
    assert bad == 0
    assert q.one("SELECT count(DISTINCT shard) FROM queen.log_timers") > 20
    q.exec("UPDATE queen.log_timers SET claimed_until = deliver_at + interval '5 s' WHERE timer_key = 'key-1'")
    t = q.timer("key-1")
    assert t["visible_at"] == t["deliver_at"] + ms(5000)
    q.exec("UPDATE queen.log_timers SET claimed_until = deliver_at - interval '5 s' WHERE timer_key = 'key-1'")
    t = q.timer("key-1")
    assert t["visible_at"] == t["deliver_at"]


# ---------------------------------------------------------------------------------------
# idempotence
# ---------------------------------------------------------------------------------------

def populate(q):
    for i in range(10):
        q.schedule("k%d" % i, delay_ms=i * 100)
    q.schedule("k0", delay_ms=0, tenant=T2)
    claimed = [r for r in q.claim(max_rows=3) if r["tenant_id"] == T1]
    q.fire([(T1, "q", "Default", claimed[:2])])
    q.push(["a", "b"], queue="other")
    q.put("kk", {"x": 1}, ttl_ms=1000)
    q.put("forever", [1, 2], forever=True)
    q.usage_step()
    q.switch("maintenance_mode", False)


def snapshot(q):
    return {t: q.one("SELECT count(*) FROM %s" % t) for t in (
        "queen.queues", "queen.log_partitions", "queen.log_segments", "queen.log_txns",
        "queen.log_txn_index", "queen.log_timers", "queen.kv", "queen.kv_usage",
        "queen.system_state")}


def test_apply_twice_on_a_populated_database(q, db):
    populate(q)
    before = snapshot(q)
    tokens = q.one("SELECT array_agg(claim_token ORDER BY timer_key) FROM queen.log_timers")
    apply_schema(db)
    apply_schema(db)
    assert snapshot(q) == before
    assert q.one("SELECT array_agg(claim_token ORDER BY timer_key) FROM queen.log_timers") == tokens
    # Still serving after the re-apply.
    assert q.schedule("after", delay_ms=0)["status"] == "scheduled"
    assert q.push(["c"], queue="other")["baseOffset"] == 2
    assert q.get("forever") is not None


def test_each_file_applies_statement_by_statement_with_psql(q, db):
    populate(q)
    before = snapshot(q)
    psql = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
    for _ in range(2):
        for path in sql_files():
            out = subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", path],
                                 capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
    assert snapshot(q) == before


def test_reapply_takes_no_lock_on_broker_tables(q, db, connections):
    """A re-apply must not queue behind (or in front of) running broker transactions."""
    populate(q)
    other = connections()
    other.autocommit = False
    with other.cursor() as cur:
        # A broker transaction holding row-exclusive locks on every busy table.
        cur.execute("UPDATE queen.log_timers SET updated_at = updated_at")
        cur.execute("UPDATE queen.kv SET updated_at = updated_at")
        cur.execute("UPDATE queen.log_partitions SET last_offset = last_offset")
        cur.execute("INSERT INTO queen.log_dlq (queue, partition, consumer_group, log_offset)"
                    " VALUES ('q', 'p', 'g', 1)")
    applier = connections(options="-c lock_timeout=2000")
    apply_schema(applier)      # raises 55P03 if any statement waited on a table lock
    other.rollback()


def fresh_database(connections):
    admin = connections()
    name = "queen_apply_%s" % uuid.uuid4().hex[:10]
    with admin.cursor() as cur:
        cur.execute("CREATE DATABASE %s" % name)
    return admin, name


def drop_database(admin, name):
    with admin.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)


def apply_with_one_retry(dbname, barrier, errors, first_failures):
    conn = connect(dbname=dbname)
    try:
        barrier.wait()
        try:
            apply_schema(conn)
        except psycopg2.Error as e:
            if e.pgcode not in RETRYABLE:
                raise
            first_failures.append(e.pgcode)
            apply_schema(conn)          # the plugin retries the whole apply once
    except Exception as e:              # noqa: BLE001 - collected and asserted below
        errors.append(repr(e))
    finally:
        conn.close()


@pytest.mark.parametrize("workers", [2, 4])
def test_concurrent_apply_on_an_empty_database(connections, workers):
    admin, name = fresh_database(connections)
    try:
        errors, first = [], []
        barrier = threading.Barrier(workers)
        threads = [threading.Thread(target=apply_with_one_retry, args=(name, barrier, errors, first))
                   for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        conn = connect(dbname=name)
        try:
            qq = Queen(conn)
            assert qq.schedule("k")["status"] == "scheduled"
            assert qq.one("SELECT apply_count FROM queen.schema_apply") == workers
        finally:
            conn.close()
    finally:
        drop_database(admin, name)


def test_concurrent_reapply_needs_no_retry(q, connections):
    """After the first boot, simultaneous applies are serialised and none fails."""
    populate(q)
    errors = []
    barrier = threading.Barrier(6)

    def work():
        conn = connect()
        try:
            barrier.wait()
            apply_schema(conn)
        except Exception as e:          # noqa: BLE001
            errors.append(repr(e))
        finally:
            conn.close()

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


def test_broker_serves_without_the_maintenance_file(connections):
    admin, name = fresh_database(connections)
    try:
        conn = connect(dbname=name)
        try:
            files = [p for p in sql_files() if not p.endswith("005_kv_maintenance.sql")]
            apply_schema(conn, files)
            apply_schema(conn, files)
            qq = Queen(conn)
            assert qq.schedule("k", delay_ms=0)["ok"]
            assert qq.due()["due"] == 1
            rows = qq.claim()
            assert qq.fire([(T1, "q", "Default", rows)])["fired"] == 1
            qq.put("a", {"v": 1}, ttl_ms=10)
            assert qq.get("a")["value"] == {"v": 1}
            assert qq.get("a", now=NOW + ms(10)) is None
            with pytest.raises(psycopg2.Error) as e:
                qq.expire_step()
            assert e.value.pgcode.startswith("42")     # the sweeper turns the prune off
            # and the full schema still applies on top
            apply_schema(conn)
            assert qq.expire_step(now=NOW + ms(10))["deleted"] == 1
        finally:
            conn.close()
    finally:
        drop_database(admin, name)
