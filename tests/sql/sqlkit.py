"""What only the SQL suite uses: a fixed NOW, the tenants T1 and T2 (as UUIDs), thin
wrappers over the queen.* functions (Queen), the plans of nested statements, and hand-built
zstd frames. Everything it shares with the other suites (connections, the schema's files and
its apply, the stand-in transaction hash, the queen tables, ...) comes from the test kit,
tests/kit/queenkit.py. Fixtures live in conftest.py."""
import datetime as dt
import json
import uuid

import psycopg2
import psycopg2.extras

from queenkit import TENANT_A, TENANT_B, b64, schema_version, set_switch, stand_in_hash

psycopg2.extras.register_uuid()

T1 = uuid.UUID(TENANT_A)
T2 = uuid.UUID(TENANT_B)

# A fixed instant: every function takes its `now` from the caller, so the tests never
# depend on the clock.
NOW = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)

SCHEMA_VERSION = schema_version()


def ms(n):
    return dt.timedelta(milliseconds=n)


def epoch_ms(ts):
    return int((ts - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) / dt.timedelta(milliseconds=1))


def nested_plans(conn, sql, args=None, like=None):
    """Run sql with auto_explain logging every nested statement's plan (EXPLAIN ANALYZE) as a
    notice: (the rows, the plans). like: keep only the plans whose text holds it."""
    with conn.cursor() as cur:
        cur.execute("LOAD 'auto_explain'")
        cur.execute("SET auto_explain.log_min_duration = 0")
        cur.execute("SET auto_explain.log_nested_statements = on")
        cur.execute("SET auto_explain.log_analyze = on")
        cur.execute("SET auto_explain.log_level = notice")
        cur.execute("SET client_min_messages = notice")
        conn.notices.clear()
        try:
            cur.execute(sql, args)
            out = cur.fetchall()
        finally:
            notices = list(conn.notices)
            cur.execute("SET auto_explain.log_min_duration = -1")
    plans = [n for n in notices if "Query Text" in n]
    return out, [n for n in plans if like is None or like in n]


def ring_place(q):
    """The fleet's place in the tenants' ring (the last tenant a claim holding the turn looked
    at), or None."""
    return q.one("SELECT (lpad(to_hex(h.last_value), 16, '0') || lpad(to_hex(l.last_value), 16, '0'))::uuid"
                 " FROM queen.log_timers_ring_place_hi h, queen.log_timers_ring_place_lo l"
                 " WHERE h.is_called AND l.is_called")


def set_ring_place(q, tenant):
    """Put the fleet's place in the tenants' ring after `tenant` (None: no place)."""
    if tenant is None:
        q.exec("SELECT setval('queen.log_timers_ring_place_hi', 0, false), setval('queen.log_timers_ring_place_lo', 0, false)")
        return
    hi, lo = divmod(tenant.int, 1 << 64)
    signed = lambda v: v - (1 << 64) if v >= 1 << 63 else v
    q.exec("SELECT setval('queen.log_timers_ring_place_hi', %s), setval('queen.log_timers_ring_place_lo', %s)",
           (signed(hi), signed(lo)))


def sched_many(q, n, tenant=T1, delay_ms=0, now=NOW, prefix="k", queue="q"):
    """n timers keyed prefix000000, prefix000001, ... scheduled through q (a Queen) in
    calls of at most 256 ops, every one accepted."""
    ops = [{"op": "schedule", "queue": queue, "timerKey": f"{prefix}{i:06d}", "delayMs": delay_ms,
            "txn": f"txn-{prefix}{i}", "payload": b64(b"{}")} for i in range(n)]
    for i in range(0, n, 256):
        res = q.apply(ops[i:i + 256], tenant=tenant, now=now)
        assert all(r["ok"] for r in res), res[:3]


class Queen:
    """Thin wrappers over the SQL functions, one connection.

    compact_answers: fire_raw asks log_timers_fire_v2 for its compact answer (as the sweeper
    does) and returns it expanded into the full form (expand_compact_answer), so every test
    of the fire's answer checks both forms (tests/sql/test_fire.py runs each of its tests
    with either)."""

    compact_answers = False

    def __init__(self, conn):
        self.conn = conn

    def one(self, sql, args=()):
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            row = cur.fetchone()
            return row[0] if row is not None else None

    def all(self, sql, args=()):
        with self.conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
            cur.execute(sql, args)
            return cur.fetchall()

    def exec(self, sql, args=()):
        with self.conn.cursor() as cur:
            cur.execute(sql, args)

    # timers -------------------------------------------------------------------------
    def apply(self, ops, tenant=T1, now=NOW, producer_sub="producer-1"):
        return self.one("SELECT queen.log_timers_apply_v1(%s::jsonb, %s, %s, %s)",
                        (json.dumps(ops), tenant, producer_sub, now))

    def schedule(self, key, delay_ms=0, queue="q", txn=None, payload=b"{}", tenant=T1,
                 now=NOW, partition=None, **extra):
        op = {"op": "schedule", "queue": queue, "timerKey": key, "delayMs": delay_ms,
              "txn": txn or ("txn-" + key), "payload": b64(payload)}
        if partition is not None:
            op["partition"] = partition
        op.update(extra)
        return self.apply([op], tenant=tenant, now=now)[0]

    def due(self, now=NOW, cap=2000, shards=None):
        """log_timers_due_v2 from the index's head, no horizon."""
        return self.one("SELECT queen.log_timers_due_v2(%s::int2[], %s, %s, NULL, NULL)", (shards, now, cap))

    def due1(self, now=NOW, cap=2000, shards=None):
        """log_timers_due_v1: the 1.0.0 wrapper (006_compat.sql)."""
        return self.one("SELECT queen.log_timers_due_v1(%s::int2[], %s, %s)", (shards, now, cap))

    def claim(self, now=NOW, lease_ms=30000, max_rows=200, per_tenant=50, shards=None, tenants=None):
        """log_timers_claim_v4 from the index's head, without a byte budget or a skip list,
        each row with a fresh token."""
        return self.all("SELECT * FROM queen.log_timers_claim_v4(%s::int2[], %s, %s, %s, %s,"
                        " NULL, NULL, NULL, NULL, NULL, NULL, %s::uuid[])",
                        (shards, now, lease_ms, max_rows, per_tenant,
                         None if tenants is None else [str(t) for t in tenants]))

    def claim1(self, now=NOW, lease_ms=30000, max_rows=200, per_tenant=50, shards=None):
        """log_timers_claim_v1: the 1.0.0 wrapper (006_compat.sql)."""
        return self.all("SELECT * FROM queen.log_timers_claim_v1(%s::int2[], %s, %s, %s, %s)",
                        (shards, now, lease_ms, max_rows, per_tenant))

    def fire(self, segments, now=NOW, wait=None, by_tid=False):
        """segments: list of (tenant, queue, partition, [claimed rows in frame order]).
        A claimed row is a dict with timer_key, claim_token, txn (from claim()), and row_tid
        (from claim4()) when by_tid: then log_timers_fire_v2 gets every row's address."""
        seg_t, seg_q, seg_p, seg_c, seg_h, seg_b = [], [], [], [], [], []
        keys, segs, toks = [], [], []
        for i, (tenant, queue, partition, rows) in enumerate(segments, start=1):
            seg_t.append(tenant)
            seg_q.append(queue)
            seg_p.append(partition)
            seg_c.append(len(rows))
            seg_h.append(b"".join(stand_in_hash(r["txn"]) for r in rows))
            seg_b.append(("blob:" + ",".join(r["timer_key"] for r in rows)).encode())
            for r in rows:
                keys.append(r["timer_key"])
                segs.append(i)
                toks.append(r["claim_token"])
        tids = None
        if by_tid:
            tids = [r["row_tid"] for _, _, _, rows in segments for r in rows]
        return self.fire_raw(seg_t, seg_q, seg_p, seg_c, seg_h, seg_b, keys, segs, toks, now, wait, tids)

    def fire_raw(self, seg_t, seg_q, seg_p, seg_c, seg_h, seg_b, keys, segs, toks, now=NOW, wait=None,
                 tids=None):
        args = (seg_t, seg_q, seg_p, seg_c, [psycopg2.Binary(h) for h in seg_h],
                [psycopg2.Binary(b) for b in seg_b], keys, segs, toks, now)
        # log_timers_fire_v2, with the rows' addresses as the claim gave them or without (null)
        res = self.one("SELECT queen.log_timers_fire_v2(%s::uuid[], %s::text[], %s::text[], %s::int[],"
                       " %s::bytea[], %s::bytea[], %s::text[], %s::int[], %s::uuid[], %s, %s, %s::tid[], %s)",
                       args + (True if wait is None else wait, tids, self.compact_answers))
        if not self.compact_answers:
            return res
        return self.expand_compact_answer(res, seg_t, seg_q, seg_p, seg_c)

    def expand_compact_answer(self, res, seg_t, seg_q, seg_p, seg_c):
        """The compact answer (a letter per segment, an array per kind) as the full one: the
        fields the compact form leaves out are the call's (count, the end offset) or the
        partition's id, read from queen.log_partitions."""
        assert "segments" not in res, res
        statuses = res.pop("statuses")
        kinds = {k: list(res.pop(k)) for k in ("baseOffsets", "staleHeld", "dupDuplicates", "dupReleased")}
        segments = []
        for i, letter in enumerate(statuses):
            if letter == "f":
                base = kinds["baseOffsets"].pop(0)
                pid = self.one("SELECT p.id FROM queen.log_partitions p JOIN queen.queues qu ON qu.id = p.queue_id"
                               " WHERE qu.tenant_id = %s AND qu.name = %s AND p.name = %s",
                               (seg_t[i], seg_q[i], seg_p[i]))
                segments.append({"status": "fired", "partitionId": pid, "baseOffset": base,
                                 "endOffset": base + seg_c[i] - 1, "count": seg_c[i]})
            elif letter == "s":
                segments.append({"status": "stale", "held": kinds["staleHeld"].pop(0)})
            elif letter == "d":
                segments.append({"status": "duplicate", "duplicates": kinds["dupDuplicates"].pop(0),
                                 "released": kinds["dupReleased"].pop(0)})
            else:
                assert letter == "b", statuses
                segments.append({"status": "busy", "count": seg_c[i]})
        assert all(not v for v in kinds.values()), (statuses, kinds)  # every element used
        return {"segments": segments, **res}

    def fire1_raw(self, seg_t, seg_q, seg_p, seg_c, seg_h, seg_b, keys, segs, toks, now=NOW, wait=None):
        """log_timers_fire_v1: the 1.0.0 wrapper (006_compat.sql); wait None: its ten-argument call."""
        args = (seg_t, seg_q, seg_p, seg_c, [psycopg2.Binary(h) for h in seg_h],
                [psycopg2.Binary(b) for b in seg_b], keys, segs, toks, now)
        sql = ("SELECT queen.log_timers_fire_v1(%s::uuid[], %s::text[], %s::text[], %s::int[],"
               " %s::bytea[], %s::bytea[], %s::text[], %s::int[], %s::uuid[], %s")
        if wait is None:  # the ten-argument call: waits on partitions
            return self.one(sql + ")", args)
        return self.one(sql + ", %s)", args + (wait,))

    def fail(self, rows, error="boom", klass="permanent", now=NOW, backoff_min_ms=1000,
             backoff_max_ms=60000, transient_backoff_ms=1000, max_attempts=5):
        """log_timers_fail_v2: the failure and the move of what it exhausts, in one call."""
        return self.fail2(rows, error, klass, now, backoff_min_ms, backoff_max_ms, transient_backoff_ms,
                          max_attempts)

    def fail1(self, rows, error="boom", klass="permanent", now=NOW, backoff_min_ms=1000,
              backoff_max_ms=60000, transient_backoff_ms=1000, max_attempts=5):
        """log_timers_fail_v1: the 1.0.0 wrapper (006_compat.sql)."""
        return self._fail("log_timers_fail_v1", rows, error, klass, now, backoff_min_ms, backoff_max_ms,
                          transient_backoff_ms, max_attempts)

    def fail2(self, rows, error="boom", klass="permanent", now=NOW, backoff_min_ms=1000,
              backoff_max_ms=60000, transient_backoff_ms=1000, max_attempts=5):
        return self._fail("log_timers_fail_v2", rows, error, klass, now, backoff_min_ms, backoff_max_ms,
                          transient_backoff_ms, max_attempts)

    def _fail(self, function, rows, error, klass, now, backoff_min_ms, backoff_max_ms,
              transient_backoff_ms, max_attempts):
        """queen.<function> (fail_v1 and fail_v2 take the same arguments) over claimed rows."""
        return self.one(
            f"SELECT queen.{function}(%s::uuid[], %s::text[], %s::text[], %s::uuid[],"
            " %s, %s, %s, %s, %s, %s, %s)",
            ([r["tenant_id"] for r in rows], [r["queue"] for r in rows],
             [r["timer_key"] for r in rows], [r["claim_token"] for r in rows], error, klass,
             now, backoff_min_ms, backoff_max_ms, transient_backoff_ms, max_attempts))

    def claim4(self, now=NOW, lease_ms=30000, max_rows=200, per_tenant=50, claim_id=None, floor=None,
               tenants=None):
        """log_timers_claim_v4: its rows, with row_tid, the address (text) of the row version
        the claim wrote."""
        return self.all("SELECT * FROM queen.log_timers_claim_v4(NULL, %s, %s, %s, %s,"
                        " NULL, %s::uuid, NULL, NULL, NULL, %s, %s::uuid[])",
                        (now, lease_ms, max_rows, per_tenant, str(claim_id or uuid.uuid4()), floor, tenants))

    def claim2(self, now=NOW, lease_ms=30000, max_rows=200, per_tenant=50, shards=None,
               max_bytes=None, claim_id=None, skip=None):
        """log_timers_claim_v4 from the index's head, with a byte budget, a claim id and a skip
        list: [(tenant, queue, partition), ...] left alone."""
        skip = skip or []
        return self.all("SELECT * FROM queen.log_timers_claim_v4(%s::int2[], %s, %s, %s, %s, %s, %s::uuid,"
                        " %s::uuid[], %s::text[], %s::text[], NULL, NULL)",
                        (shards, now, lease_ms, max_rows, per_tenant, max_bytes,
                         None if claim_id is None else str(claim_id),
                         [str(t) for t, _, _ in skip], [q for _, q, _ in skip], [p for _, _, p in skip]))

    def release_claims(self, claim_ids, lease_from, lease_to, now=NOW, floor=None):
        return self.one("SELECT queen.log_timers_release_claims_v2(%s::uuid[], %s, %s, %s, %s)",
                        ([str(c) for c in claim_ids], lease_from, lease_to, now, floor))

    def release(self, rows):
        return self.one(
            "SELECT queen.log_timers_release_v1(%s::uuid[], %s::text[], %s::text[], %s::uuid[])",
            ([r["tenant_id"] for r in rows], [r["queue"] for r in rows],
             [r["timer_key"] for r in rows], [r["claim_token"] for r in rows]))

    def dlq(self, rows, now=NOW):
        return self.one(
            "SELECT queen.log_timers_dlq_v1(%s::uuid[], %s::text[], %s::text[], %s)",
            ([r["tenant"] for r in rows], [r["queue"] for r in rows],
             [r["key"] for r in rows], now))

    def peek(self, key, queue="q", tenant=T1):
        return self.one("SELECT queen.log_timers_peek_v1(%s, %s, %s)", (tenant, queue, key))

    def timer(self, key, queue="q", tenant=T1):
        rows = self.all("SELECT * FROM queen.log_timers WHERE tenant_id = %s AND queue = %s"
                        " AND timer_key = %s", (tenant, queue, key))
        return rows[0] if rows else None

    def read(self, queue="q", partition="Default", tenant=T1, from_offset=0, max_segments=1000):
        return self.all("SELECT * FROM queen.log_read_v1(%s, %s, %s, %s, %s)",
                        (tenant, queue, partition, from_offset, max_segments))

    def push(self, txns, queue="q", partition="Default", tenant=T1, now=NOW):
        return self.one(
            "SELECT queen.log_push_v1(%s, %s, %s, %s, %s, %s, %s)",
            (tenant, queue, partition, len(txns),
             psycopg2.Binary(b"".join(stand_in_hash(t) for t in txns)),
             psycopg2.Binary(b"blob"), now))

    def switch(self, key, value):
        set_switch(self.conn, key, value)

    # kv -------------------------------------------------------------------------------
    def put(self, key, value, ttl_ms=None, forever=None, ns="ns", tenant=T1, now=NOW):
        return self.one("SELECT queen.kv_put_v1(%s, %s, %s, %s::jsonb, %s, %s, %s)",
                        (tenant, ns, key, json.dumps(value), ttl_ms, forever, now))

    def get(self, key, ns="ns", tenant=T1, now=NOW):
        return self.one("SELECT queen.kv_get_v1(%s, %s, %s, %s)", (tenant, ns, key, now))

    def delete(self, key, ns="ns", tenant=T1, now=NOW):
        return self.one("SELECT queen.kv_delete_v1(%s, %s, %s, %s)", (tenant, ns, key, now))

    def expire_step(self, now=NOW, max_rows=1000, shards=None):
        return self.one("SELECT queen.kv_expire_step_v1(%s::int2[], %s, %s)", (shards, now, max_rows))

    def usage_step(self, now=NOW, max_tenants=1000, shards=None):
        """kv_usage_step_v2 without its gate (every_ms null), its answer without "skipped"."""
        return self.one("SELECT queen.kv_usage_step_v2(%s::int2[], %s, %s, NULL) - 'skipped'",
                        (shards, now, max_tenants))

    def usage_step2(self, now=NOW, every_ms=300000, max_tenants=1000, shards=None):
        """kv_usage_step_v2: the rollup behind its fleet gate (schema version 10)."""
        return self.one("SELECT queen.kv_usage_step_v2(%s::int2[], %s, %s, %s)",
                        (shards, now, max_tenants, every_ms))




# zstd of b'{"hello": "world"}' * 40 (720 bytes) as the zstd command line wrote it (level
# 19, content size and checksum declared): a real compressed block, not a hand-built one.
ZSTD_REAL = bytes.fromhex("28b52ffd64d001cd0000907b2268656c6c6f223a2022776f726c64227d"
                          "0100765535c3cd477aeb")
ZSTD_REAL_PLAIN = b'{"hello": "world"}' * 40


def zstd_frame(blocks, content_size, fcs_len=None, checksum=False, single=True, dict_id=0,
               window=0x58, reserved=False, trailing=b""):
    """A zstd frame built from the format (RFC 8878) with raw and RLE blocks, so a test can
    declare any content size or break any rule on purpose. blocks: list of ("raw", bytes)
    or ("rle", byte, count). content_size None = Frame_Content_Size absent."""
    if content_size is None:
        fcs_flag, fcs = 0, b""
        single = False
    else:
        if fcs_len is None:
            fcs_len = 1 if (content_size < 256 and single) else (
                2 if 256 <= content_size < 65792 else (4 if content_size < 2 ** 32 else 8))
        fcs_flag = {1: 0, 2: 1, 4: 2, 8: 3}[fcs_len]
        value = content_size - 256 if fcs_len == 2 else content_size
        fcs = value.to_bytes(fcs_len, "little")
    did_flag, did = {0: (0, b"")}.get(dict_id, (2, dict_id.to_bytes(2, "little")))
    fhd = (fcs_flag << 6) | (32 if single else 0) | (8 if reserved else 0) | (4 if checksum else 0) | did_flag
    out = bytearray(b"\x28\xb5\x2f\xfd") + bytes([fhd])
    if not single:
        out.append(window)
    out += did + fcs
    for i, b in enumerate(blocks):
        last = 1 if i == len(blocks) - 1 else 0
        if b[0] == "raw":
            out += ((len(b[1]) << 3) | (0 << 1) | last).to_bytes(3, "little") + b[1]
        elif b[0] == "rle":
            out += ((b[2] << 3) | (1 << 1) | last).to_bytes(3, "little") + bytes([b[1]])
        else:  # ("type", n, size, body): any header at all
            out += ((b[2] << 3) | (b[1] << 1) | last).to_bytes(3, "little") + b[3]
    if checksum:
        out += b"\0\0\0\0"
    return bytes(out) + trailing


def sqlstate_of(excinfo):
    return getattr(excinfo.value, "pgcode", None)
