"""10. The usage rollup degrades to a block sample above a measured row count.

A full rollup reads every page of queen.kv (rows that never expire are in no index but the
key), so its cost grows with the table: measured 2026-11-30 (tests/soak/README.md) at about
1.4 s per pass at 1M rows on the test rig, 5x that at 5M. Above the threshold in
sql/005_kv_maintenance.sql (pg_class.reltuples) the pass reads a TABLESAMPLE SYSTEM share of
the pages worth ~200k rows, scales the counts up and marks the result sampled. The session
setting queen.kv_usage_sample_above overrides the threshold (a test and measurement seam,
and an operator's)."""

from conftest import TENANT_B
from queenkit import TENANT_A

ROLLUP = "SELECT queen.kv_usage_step_v1(NULL, now(), 100)"


def fill(q, n_a, n_b):
    for tenant, n in ((TENANT_A, n_a), (TENANT_B, n_b)):
        q.q("INSERT INTO queen.kv (tenant_id, namespace, key, value, expires_at)"
            " SELECT %s::uuid, 'sample', 'k' || g, jsonb_build_object('pad', repeat('v', 30)),"
            "        CASE WHEN g %% 2 = 0 THEN NULL ELSE now() + interval '1 hour' END"
            "   FROM generate_series(1, %s) g", (tenant, n))
    # Expired rows are not usage, sampled or not.
    q.q("INSERT INTO queen.kv (tenant_id, namespace, key, value, expires_at)"
        " SELECT %s::uuid, 'sample-dead', 'd' || g, '1', now() - interval '1 minute'"
        "   FROM generate_series(1, 20000) g", (TENANT_A,))
    q.q("ANALYZE queen.kv")


def per_tenant(result):
    return {t["tenant"]: t for t in result["tenants"]}


def test_below_the_threshold_the_rollup_is_exact(q):
    fill(q, 40000, 20000)
    r = q.one(ROLLUP)
    assert r["sampled"] is False
    t = per_tenant(r)
    assert t[TENANT_A]["kvRows"] == 40000 and t[TENANT_B]["kvRows"] == 20000
    assert q.one("SELECT bool_or(sampled) FROM queen.kv_usage") is False


def test_above_the_threshold_it_samples_pages_and_scales(q):
    fill(q, 400000, 200000)
    exact = dict(q.q("SELECT tenant_id::text, count(*) FROM queen.kv"
                     " WHERE queen.kv_live_v1(expires_at, now()) GROUP BY 1"))
    exact_bytes = dict(q.q("SELECT tenant_id::text, sum(pg_column_size(value) + pg_column_size(key))"
                           "  FROM queen.kv WHERE queen.kv_live_v1(expires_at, now()) GROUP BY 1"))
    # The default threshold is above this table: exact.
    full = q.one(ROLLUP)
    assert full["sampled"] is False
    assert {k: v["kvRows"] for k, v in per_tenant(full).items()} == exact

    q.q("SELECT set_config('queen.kv_usage_sample_above', '100000', false)")
    try:
        runs = [q.one(ROLLUP) for _ in range(3)]
    finally:
        q.q("SELECT set_config('queen.kv_usage_sample_above', '', false)")
    for r in runs:
        assert r["sampled"] is True
        t = per_tenant(r)
        for tenant in (TENANT_A, TENANT_B):
            rows, size = t[tenant]["kvRows"], t[tenant]["kvBytes"]
            # ~200k of 620k rows' pages: a third of the table; block sampling of rows
            # written in tenant runs is still within 15% per tenant here.
            assert abs(rows - exact[tenant]) <= 0.15 * exact[tenant], (tenant, rows, exact[tenant])
            assert abs(size - exact_bytes[tenant]) <= 0.15 * exact_bytes[tenant], (tenant, size)
        assert t[TENANT_A]["timerRows"] == 0
    # The samples differ from pass to pass (a fresh choice of pages), and are stored marked.
    assert q.one("SELECT bool_and(sampled) FROM queen.kv_usage") is True
    # Back under the default: exact again, and stored as exact.
    again = q.one(ROLLUP)
    assert again["sampled"] is False
    assert {k: v["kvRows"] for k, v in per_tenant(again).items()} == exact
    assert q.one("SELECT bool_or(sampled) FROM queen.kv_usage") is False
