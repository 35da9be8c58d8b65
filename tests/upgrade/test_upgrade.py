"""Upgrade.*: the previous released schema (tests/upgrade/v1/, a copy of sql/ as of commit
f43141e) on a populated database, then the current sql/*.sql on top of it.

What must hold after the upgrade: every timer, KV row and log segment written under v1 is
still there and reads back the same through the v1 functions a host calls; re-applying the
current schema changes nothing; and a sweeper of this build fires every old timer exactly
once - including those an old broker had claimed when it died, once their lease is over.

Two ways to upgrade, both tested: an operator running the files in order (`psql -f` each,
here one execute per file), and a broker starting with apply_schema=true (the schema
embedded in the library).

And a rolling upgrade: a 1.0.0 broker (its library and binding built from the release commit
by tests/upgrade/build-release; QUEEN_UPGRADE_RELEASE_DIR names a directory it built before)
beside a broker of this build on the current schema while timers fire: every timer once, and
no hot loop of the 1.0.0 broker's fire (pg_stat_statements counts its calls).

Run:  eval "$(tests/pg start "$(mktemp -d)")"
      QUEEN_SWEEPER_LIBRARY=build/libqueen_sweeper.so PYTHONPATH=bindings/python \\
          /usr/bin/python3 -m pytest -q tests/upgrade
Each test creates and drops its own database in that cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg2
import psycopg2.extensions
import pytest

from queenkit import (ROOT, TENANT_A, Queen, Sweeper, connect, decode_segment, one, op_schedule,
                      rows, run_sql_files, schema_version, sql_files, stand_in_hash, wait_for)

HERE = Path(__file__).resolve().parent
V1_DIR = HERE / "v1"

TENANT = TENANT_A
OTHER_TENANT = "00000000-0000-0000-0000-0000000000a2"
TIMER_QUEUE = "upgrade-timers"
LOG_QUEUE = "upgrade-log"
PARTITIONS = ["p0", "p1", "p2", "Default"]
N_TIMERS = 60          # due at once, across tenants and partitions
N_CLAIMED = 8          # of them claimed by the "old broker" that dies
N_LATER = 5            # due a few seconds after the upgrade
OLD_LEASE_MS = 2000


def v1_files() -> list[str]:
    files = sql_files(V1_DIR)
    assert [os.path.basename(f) for f in files] == ["001_log.sql", "002_timers.sql", "003_kv.sql",
                                                    "004_kv_maintenance.sql"], files
    return files


@pytest.fixture()
def database(conninfo):
    """A fresh database of its own in the test cluster (created by the superuser, the shared
    conninfo fixture: creating a database and applying 007_roles.sql need it); its conninfo.
    Dropped afterwards."""
    admin = connect(conninfo)
    name = "queen_upgrade_" + uuid.uuid4().hex[:10]
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    dsn = psycopg2.extensions.parse_dsn(admin.dsn)
    dsn["dbname"] = name
    try:
        yield " ".join(f"{k}={v}" for k, v in dsn.items())
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


def populate(conn) -> dict:
    """Write through v1's functions as a v1 host and a v1 broker would; return what was written."""
    timers = {}   # txn -> (tenant, partition, payload)
    ops_by_tenant: dict[str, list] = {TENANT: [], OTHER_TENANT: []}
    for i in range(N_TIMERS):
        tenant = TENANT if i % 3 else OTHER_TENANT
        txn = f"upgrade-txn-{i}"
        payload = f"timer {i} scheduled under v1".encode()
        op = op_schedule(TIMER_QUEUE, f"key-{i}", payload, partition=PARTITIONS[i % 3], txn=txn)
        if not i % 5:   # these take the default partition
            del op["partition"]
        ops_by_tenant[tenant].append(op)
        timers[txn] = (tenant, op.get("partition", "Default"), payload)
    for i in range(N_LATER):
        txn = f"upgrade-later-{i}"
        payload = f"later {i}".encode()
        ops_by_tenant[TENANT].append(
            op_schedule(TIMER_QUEUE, f"later-{i}", payload, partition="p0", delay_ms=3000, txn=txn))
        timers[txn] = (TENANT, "p0", payload)
    message_ids = {}
    for tenant, ops in ops_by_tenant.items():
        results = Queen(conn).apply(ops, tenant)
        assert [r["status"] for r in results] == ["scheduled"] * len(ops), results
        for op, r in zip(ops, results):
            message_ids[op["txn"]] = r["messageId"]

    # An old broker claims a few due timers with a short lease, then dies holding them.
    claimed = rows(conn, "SELECT txn, claim_token FROM queen.log_timers_claim_v1("
                         "NULL::int2[], now(), %s, %s, %s)", (OLD_LEASE_MS, N_CLAIMED, N_CLAIMED))
    assert len(claimed) == N_CLAIMED, claimed

    # The log: two pushes of plain messages (no timer) on a queue of their own.
    for batch in (["log-a", "log-b", "log-c"], ["log-d"]):
        hashes = b"".join(stand_in_hash(t) for t in batch)
        one(conn, "SELECT queen.log_push_v1(%s::uuid, %s, 'p0', %s, %s, %s, now())",
            (TENANT, LOG_QUEUE, len(batch), psycopg2.Binary(hashes),
             psycopg2.Binary(("v1 blob " + ",".join(batch)).encode())))

    # KV: one row forever, one with a long ttl, one already expired (a read hides it).
    one(conn, "SELECT queen.kv_put_v1(%s::uuid, 'ns', 'forever', %s::jsonb, NULL, true, now())",
        (TENANT, json.dumps({"v": 1, "kept": "forever"})))
    one(conn, "SELECT queen.kv_put_v1(%s::uuid, 'ns', 'ttl', %s::jsonb, 3600000, NULL, now())",
        (TENANT, json.dumps({"v": 2})))
    one(conn, "SELECT queen.kv_put_v1(%s::uuid, 'ns', 'gone', %s::jsonb, 1, NULL, now() - interval '1 hour')",
        (TENANT, json.dumps({"v": 3})))
    return {"timers": timers, "message_ids": message_ids,
            "claimed": {txn for txn, _ in claimed}}


def snapshot(conn) -> dict:
    """What a host reads back through the v1 functions, plus the raw timer rows."""
    return {
        "log": rows(conn, "SELECT base_offset, end_offset, count, hashes, blob, created_at "
                          "FROM queen.log_read_v1(%s::uuid, %s, 'p0', 0, 100)", (TENANT, LOG_QUEUE)),
        "kv": [one(conn, "SELECT queen.kv_get_v1(%s::uuid, 'ns', %s, now())", (TENANT, k))
               for k in ("forever", "ttl", "gone")],
        "timers": rows(conn, "SELECT tenant_id, queue, timer_key, partition, deliver_at, txn, "
                             "message_id, payload, claim_token, claimed_until, attempts "
                             "FROM queen.log_timers ORDER BY tenant_id, queue, timer_key"),
        "peek": one(conn, "SELECT queen.log_timers_peek_v1(%s::uuid, %s, 'key-1')",
                    (TENANT, TIMER_QUEUE)),
    }


def fired_txns(conn, partitions=PARTITIONS) -> dict:
    """txn -> [(tenant, partition, message_id, payload)] for every frame of the timer queue
    in the given partitions."""
    seen: dict[str, list] = {}
    for tenant in (TENANT, OTHER_TENANT):
        for partition in partitions:
            for (blob,) in rows(conn, "SELECT blob FROM queen.log_read_v1(%s::uuid, %s, %s, 0, NULL)",
                                (tenant, TIMER_QUEUE, partition)):
                for frame in decode_segment(bytes(blob)):
                    seen.setdefault(frame.txn, []).append(
                        (tenant, partition, str(frame.message_id), frame.payload))
    return seen


@pytest.mark.parametrize("how", ["sql_files_in_order", "broker_apply_schema"])
def test_upgrade_from_v1_keeps_data_and_fires_old_timers(database, how):
    conn = connect(database)
    try:
        run_sql_files(conn, v1_files())
        written = populate(conn)
        before = snapshot(conn)
        assert len(before["timers"]) == N_TIMERS + N_LATER
        assert before["kv"][0]["value"] == {"v": 1, "kept": "forever"}
        assert before["kv"][1]["value"] == {"v": 2}
        assert before["kv"][2] is None, before["kv"][2]     # expired: a read never returns it

        config = {"conninfo": database, "broker_id": f"upgrade-{how}", "read_env": False,
                  "sweeper_max_sleep_ms": 200, "log_level": "warn"}
        if how == "sql_files_in_order":
            run_sql_files(conn, sql_files())
            run_sql_files(conn, sql_files())          # re-applying is a no-op
            after = snapshot(conn)
            assert after == before, "the upgrade changed data written under v1"
        else:
            config["apply_schema"] = True

        if how == "sql_files_in_order" and (ROOT / "sql" / "008_version.sql").exists():
            # The schema records its version from 007 on; v1 had no such record.
            assert one(conn, "SELECT queen.schema_version_v1()") >= 2

        logs: list[str] = []
        with Sweeper(**config) as sw:
            sw.on_log(lambda level, msg: logs.append(f"{level} {msg}"))
            sw.start()
            try:
                wait_for(lambda: one(conn, "SELECT count(*) FROM queen.log_timers") == 0, 90, 0.1,
                         "every v1 timer to fire after the upgrade")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; sweeper log: {logs}; stats: {sw.stats()}") from None
            stats = sw.stats()
            sw.stop(10000)

        assert stats["fired_total"] == N_TIMERS + N_LATER, (stats, logs)
        seen = fired_txns(conn)
        timers = written["timers"]
        assert set(seen) == set(timers), sorted(set(timers) ^ set(seen))
        for txn, hits in seen.items():
            assert len(hits) == 1, f"{txn} fired {len(hits)} times"
            tenant, partition, message_id, payload = hits[0]
            assert (tenant, partition, payload) == timers[txn], txn
            assert message_id == written["message_ids"][txn], txn   # the id v1 handed out

        # Rows claimed by the dead v1 broker fired too, only after its lease.
        assert written["claimed"] <= set(seen)
        # The data a host reads through the v1 functions is still there after the fire.
        after = snapshot(conn)
        assert after["log"] == before["log"]
        assert after["kv"][:2] == before["kv"][:2]
    finally:
        conn.close()


# ---- A 1.0.0 broker on the current schema (a rolling upgrade), while timers fire ----------

RELEASE = "1.0.0"
ROLLING_TIMERS = 600       # scheduled in waves while both brokers run
ROLLING_WAVES = 6
ROLLING_PARTITIONS = [f"r{i}" for i in range(8)]
ROLLING_LEASE_MS = 3000


def release_build(version: str) -> Path:
    """The released library and its Python binding, built from git history by
    tests/upgrade/build-release (QUEEN_UPGRADE_RELEASE_DIR: a directory it built before).
    A clone without the release commit fails here, loudly."""
    cmd = [str(HERE / "build-release"), version]
    if os.environ.get("QUEEN_UPGRADE_RELEASE_DIR"):
        cmd.append(os.environ["QUEEN_UPGRADE_RELEASE_DIR"])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"build-release {version} failed: {done.stderr}"
    out = Path(done.stdout.strip().splitlines()[-1])
    assert (out / "build" / "libqueen_sweeper.so").exists(), out
    return out


def statement_calls(admin, dbname: str, function: str) -> int:
    """Top-level calls of statements naming the function, in that database (pg_stat_statements,
    which tests/pg preloads and creates in the admin database)."""
    return one(admin, "SELECT coalesce(sum(s.calls), 0)::bigint FROM pg_stat_statements s"
                      " JOIN pg_database d ON d.oid = s.dbid"
                      " WHERE d.datname = %s AND s.query LIKE %s", (dbname, f"%queen.{function}(%"))


def test_a_1_0_0_broker_on_the_current_schema_fires_every_timer_once_without_a_hot_loop(database, conninfo):
    """The rolling upgrade: 1.0.0's schema, upgraded by an operator to the current one, then a
    1.0.0 broker (its own library and binding, built from the release commit) and a broker of
    this build fire the same timers while a host schedules more and a third session keeps
    passing over claimed rows (FOR UPDATE SKIP LOCKED, held 200 ms, as another broker's claim
    does). That lock is what makes the current fire answer a waiting call "busy"; a 1.0.0
    broker answers busy by firing again at once with wait true, so it would loop for as long
    as the lock is held. What must hold: every timer fired exactly once, each broker fired
    some, and the 1.0.0 broker's fire calls stay within a small multiple of its claims."""
    release = release_build(RELEASE)
    conn = connect(database)
    dbname = psycopg2.extensions.parse_dsn(database)["dbname"]
    admin = connect(conninfo)
    passer_conn = psycopg2.connect(database)
    stop = threading.Event()
    old = None
    try:
        run_sql_files(conn, v1_files())
        run_sql_files(conn, sql_files())
        assert one(conn, "SELECT queen.schema_version_v1()") == schema_version()
        one(admin, "SELECT count(*) FROM (SELECT pg_stat_statements_reset(0, d.oid, 0)"
                   " FROM pg_database d WHERE d.datname = %s) x", (dbname,))

        env = dict(os.environ, PYTHONPATH=str(release / "src" / "bindings" / "python"),
                   QUEEN_SWEEPER_LIBRARY=str(release / "build" / "libqueen_sweeper.so"))
        # With apply_schema on, as a 1.0.0 broker left with its settings would start: its apply
        # of 1.0.0's files must fail whole on the guard (sql/001_log.sql) and change nothing.
        bodies_before = rows(conn, "SELECT p.oid::regprocedure::text, md5(p.prosrc) FROM pg_proc p"
                                   " WHERE p.pronamespace = 'queen'::regnamespace ORDER BY 1")
        old = subprocess.Popen([sys.executable, str(HERE / "old_broker.py"), database, "release-1.0.0",
                                str(ROLLING_LEASE_MS), "apply"], env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert old.stdout.readline().strip() == "started", old.stderr.read()

        def pass_over():
            # Other brokers' claims walking over claimed rows: every 5 ms, every claimed row
            # nobody has locked is locked (a claim's FOR UPDATE SKIP LOCKED), and all of them
            # are kept 200 ms, then let go for 30 ms. Most rows are locked this way between
            # their claim and their fire.
            passer_conn.autocommit = False
            while not stop.is_set():
                until = time.monotonic() + 0.2
                with passer_conn.cursor() as cur:
                    while time.monotonic() < until and not stop.is_set():
                        cur.execute("SELECT 1 FROM queen.log_timers t WHERE t.claim_token IS NOT NULL"
                                    " FOR UPDATE SKIP LOCKED")
                        time.sleep(0.005)
                passer_conn.commit()
                time.sleep(0.03)

        passer = threading.Thread(target=pass_over, daemon=True)
        passer.start()

        written = {}
        config = {"conninfo": database, "broker_id": "current", "read_env": False,
                  "sweeper_max_sleep_ms": 100, "sweeper_lease_ms": ROLLING_LEASE_MS, "log_level": "warn"}
        logs: list[str] = []
        with Sweeper(**config) as sw:
            sw.on_log(lambda level, msg: logs.append(f"{level} {msg}"))
            sw.start()
            per_wave = ROLLING_TIMERS // ROLLING_WAVES
            for wave in range(ROLLING_WAVES):
                ops = {TENANT: [], OTHER_TENANT: []}
                for j in range(per_wave):
                    i = wave * per_wave + j
                    tenant = TENANT if i % 2 else OTHER_TENANT
                    txn = f"rolling-{i}"
                    payload = f"rolling {i}".encode()
                    partition = ROLLING_PARTITIONS[i % len(ROLLING_PARTITIONS)]
                    ops[tenant].append(op_schedule(TIMER_QUEUE, f"r-{i}", payload, partition=partition,
                                                   delay_ms=(i * 7) % 500, txn=txn))
                    written[txn] = (tenant, partition, payload)
                for tenant, tenant_ops in ops.items():
                    got = Queen(conn).apply(tenant_ops, tenant)
                    assert [r["status"] for r in got] == ["scheduled"] * len(tenant_ops), got
                time.sleep(0.5)
            try:
                wait_for(lambda: one(conn, "SELECT count(*) FROM queen.log_timers") == 0, 120, 0.1,
                         "every timer to fire with a 1.0.0 broker alongside")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; current log: {logs[-20:]}; stats: {sw.stats()}") from None
            stop.set()
            passer.join(5)
            new_stats = sw.stats()
            sw.stop(10000)
        out, err = old.communicate("stop\n", timeout=60)
        assert old.returncode == 0, err
        old_run = json.loads(out.strip().splitlines()[-1])
        old_stats = old_run["stats"]
        assert any("schema apply failed (SQLSTATE 42P13)" in line for line in old_run["logs"]), \
            old_run["logs"]
        assert rows(conn, "SELECT p.oid::regprocedure::text, md5(p.prosrc) FROM pg_proc p"
                          " WHERE p.pronamespace = 'queen'::regnamespace ORDER BY 1") == bodies_before

        seen = fired_txns(conn, ROLLING_PARTITIONS)
        assert set(seen) == set(written), sorted(set(written) ^ set(seen))
        twice = {txn: len(hits) for txn, hits in seen.items() if len(hits) != 1}
        assert twice == {}, twice
        for txn, hits in seen.items():
            assert hits[0][0] == written[txn][0] and hits[0][1] == written[txn][1] \
                and hits[0][3] == written[txn][2], txn
        assert old_stats["fired_total"] + new_stats["fired_total"] == ROLLING_TIMERS, (old_stats, new_stats)
        assert old_stats["fired_total"] > 0 and new_stats["fired_total"] > 0, (old_stats, new_stats)

        # No hot loop: each 1.0.0 claim is fired in at most two calls (without waiting, then
        # waiting for what was busy), plus a split by bytes or an isolation now and then. A
        # busy answer to a waiting call would have cost one call per round trip for as long
        # as the passer held its lock (200 ms, over and over).
        claims = statement_calls(admin, dbname, "log_timers_claim_v1")
        fires = statement_calls(admin, dbname, "log_timers_fire_v1")
        report = (f"1.0.0 broker: fired {old_stats['fired_total']}, claim_v1 calls {claims}, fire_v1 calls "
                  f"{fires}, busy {old_stats.get('fire_busy_total')}, stale {old_stats.get('stale_total')}; "
                  f"current broker: fired {new_stats['fired_total']}")
        print(report)
        assert claims > 0 and fires > 0, report
        # The passer's locks were met: stale is what the 1.0.0 broker was answered for them.
        assert old_stats["stale_total"] > 0, report
        # Measured 2026-12-04: 27-36 fire calls for 29-37 claims with the wrapper as it is;
        # 176 for 35 (busy 661) with a wrapper that passes a waiting call's busy through.
        assert fires <= 2 * claims + 20, report
    finally:
        stop.set()
        if old is not None and old.poll() is None:
            old.kill()
            old.wait(10)
        passer_conn.close()
        admin.close()
        conn.close()

