"""12. on_fired announces every delivery, after its commit.

The callback receives (tenant, queue, partition, count, base_offset) once per fired
segment: the number of calls equals fired_segments_total, the sum of the counts equals
fired_total, every (partition, base_offset) is a segment that queen.log_read_v1 returns
with that count, no segment is announced twice or left out, and each announced segment is
already visible to another connection while the callback runs (after the commit, never
before)."""

import threading

from queenkit import (TENANT_A, TENANT_B, FiredLog, assert_clean_stop, connect,
                      op_schedule, wait_for)


def test_on_fired_reports_every_segment_after_its_commit(q, sweepers, conninfo):
    seen_conn = connect(conninfo)
    seen_lock = threading.Lock()

    def visible(tenant, queue, partition, count, base_offset):
        # Runs on the sweeper's thread: a quick read on our own connection.
        with seen_lock, seen_conn.cursor() as cur:
            cur.execute("SELECT count FROM queen.log_read_v1(%s::uuid, %s, %s, %s, 1)"
                        " WHERE base_offset = %s", (tenant, queue, partition, base_offset, base_offset))
            row = cur.fetchone()
            return row[0] if row else None

    fired = FiredLog(check=visible)
    h = sweepers("on-fired", fired=fired, sweeper_claim_batch=40, sweeper_max_fire_bytes=8192)
    h.start()
    expected = 0
    for tenant in (TENANT_A, TENANT_B):
        ops = [op_schedule(f"cb{i % 3}", f"{tenant[-1]}-{i:03d}", b"y" * (i % 7 * 100),
                           partition=f"p{i % 4}") for i in range(150)]
        q.schedule(ops, tenant)
        expected += len(ops)
    wait_for(lambda: q.timers_left() == 0, 15, 0.02, "the fire")
    wait_for(lambda: fired.total() == expected, 5, 0.02, "every on_fired call")
    st = h.stats()
    assert_clean_stop(h)
    seen_conn.close()
    calls = fired.snapshot()
    print(f"\n[on_fired] {len(calls)} calls, {sum(c[4] for c in calls)} messages; stats fired "
          f"{st['fired_total']} in {st['fired_segments_total']} segments")

    assert sum(c[4] for c in calls) == st["fired_total"] == expected
    assert len(calls) == st["fired_segments_total"]
    announced = [(c[1], c[2], c[3], c[5]) for c in calls]
    assert len(set(announced)) == len(announced), "a segment was announced twice"
    # Each call saw its own segment already committed, with the announced count.
    not_visible = [c for c in calls if c[6] != c[4]]
    assert not not_visible, f"announced before visible (or wrong count): {not_visible[:5]}"
    # The announced set is exactly the log, segment for segment.
    log = {(t, qn, p, base): count for t, qn, p, base, _e, count, *_r in q.log_rows()}
    assert set(announced) == set(log), (set(announced) ^ set(log))
    for _at, t, qn, p, count, base, _seen in calls:
        assert log[(t, qn, p, base)] == count
        rows = q.read_partition(t, qn, p, base, 1)
        assert rows and rows[0][0] == base and rows[0][2] == count, (t, qn, p, base, rows)
    # Tenants and names come through as text, exactly.
    assert {c[1] for c in calls} == {TENANT_A, TENANT_B}
    assert {c[2] for c in calls} == {"cb0", "cb1", "cb2"}
    assert {c[3] for c in calls} == {"p0", "p1", "p2", "p3"}
