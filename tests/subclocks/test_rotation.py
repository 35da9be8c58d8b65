"""9. The start shard rotates by one per cycle.

Every broker scans every shard; only where it starts is derived from its identity, and
that start moves by one on each cycle so that N brokers do not queue on one head of the
index. Seen from the database: with kv_expire_batch = 1 the prune deletes from the first
shard of the cycle's order that holds an expired key, so a trigger recording the shard of
every deleted row shows the cycles' starting shards one after the other."""

from queenkit import assert_clean_stop, wait_for

LOG_TABLE = "public.subclocks_rotation_seen"


def install_recorder(q):
    q.q(f"CREATE TABLE IF NOT EXISTS {LOG_TABLE} (seq bigserial PRIMARY KEY, shard int2, xid xid8)")
    q.q(f"TRUNCATE {LOG_TABLE}")
    q.q("CREATE OR REPLACE FUNCTION public.subclocks_rotation_note() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER"
        " SET search_path = pg_catalog AS $f$"
        f" BEGIN INSERT INTO {LOG_TABLE} (shard, xid) VALUES (OLD.shard, pg_current_xact_id()); RETURN OLD; END $f$")
    q.q("CREATE TRIGGER subclocks_rotation AFTER DELETE ON queen.kv"
        " FOR EACH ROW EXECUTE FUNCTION public.subclocks_rotation_note()")


def remove_recorder(q):
    q.q("DROP TRIGGER IF EXISTS subclocks_rotation ON queen.kv")
    q.q("DROP FUNCTION IF EXISTS public.subclocks_rotation_note()")
    q.q(f"DROP TABLE IF EXISTS {LOG_TABLE}")


def test_the_start_shard_moves_by_one_each_cycle(q, sweepers):
    # About 60 expired keys per shard: a shard never runs dry within the few passes that
    # start on it, so the first shard with a key is the cycle's first shard.
    q.kv_insert("rotation", 64 * 60, expires_sql="now() - interval '1 minute'")
    assert q.one("SELECT min(c) FROM (SELECT count(*) c FROM queen.kv GROUP BY shard) x") >= 20
    install_recorder(q)
    h = sweepers("rotation", kv_expire_batch=1, kv_expire_every_ms=1, sweeper_max_sleep_ms=20)
    try:
        h.start()
        try:
            wait_for(lambda: q.one(f"SELECT count(DISTINCT shard) FROM {LOG_TABLE}") >= 24, 30,
                     what="prune passes over two dozen cycles")
        except AssertionError:
            st = h.stats()
            raise AssertionError(f"{q.q(f'SELECT shard FROM {LOG_TABLE} ORDER BY seq')[:40]} "
                                 f"{ {k: st[k] for k in ('cycles_total', 'kv_prune_calls_total', 'last_error', 'phases', 'sleep_ms')} }")
        st = h.stats()
        final = assert_clean_stop(h)
        rows = q.q(f"SELECT shard FROM {LOG_TABLE} ORDER BY seq")
    finally:
        remove_recorder(q)
    shards = [r[0] for r in rows]
    # One pass is up to 8 calls on the cycle's first shard; collapse each run to one entry.
    starts = [s for i, s in enumerate(shards) if i == 0 or s != shards[i - 1]]
    steps = [(b - a) % 64 for a, b in zip(starts, starts[1:])]
    print(f"\n[rotation] start shard {st['start_shard']}; first shards of {len(starts)} passes: "
          f"{starts[:30]}")
    assert starts[0] == (st["start_shard"] + 1) % 64, (st["start_shard"], starts[:5])
    assert steps and all(s == 1 for s in steps), steps
    assert final["kv_prune_calls_total"] >= len(starts)
