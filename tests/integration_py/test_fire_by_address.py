"""The sweeper fires by address (schema version 8): its claim returns each row's address
(log_timers_claim_v4's row_tid), it keeps it with the claimed timer and passes every one back
to the fire (log_timers_fire_v2), so the fire's fast way deletes the rows found by one TID scan
instead of looking each one up by key. Seen from pg_stat_statements (track = all, set for this
database while the test runs): the delete by address runs, the lookup by key never does, and
every timer is in the log once."""

import pytest

from queenkit import TENANT_A, FiredLog, assert_clean_stop, op_schedule, wait_for

N = 900
BY_ADDRESS = "%t.ctid = ANY (v_tids)%"
BY_KEY = "%t2.timer_key = u.k%"


@pytest.fixture
def tracked(q):
    """pg_stat_statements counting nested statements for new sessions of this database."""
    if q.one("SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'") != 1:
        pytest.fail("pg_stat_statements is not installed in this database (tests/pg installs it)")
    db = q.one("SELECT current_database()")
    q.q(f'ALTER DATABASE "{db}" SET pg_stat_statements.track = \'all\'')
    q.q("SELECT pg_stat_statements_reset()")
    yield
    q.q(f'ALTER DATABASE "{db}" RESET pg_stat_statements.track')


def calls(q, like):
    return q.one("SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE query LIKE %s", (like,))


def test_the_sweeper_finds_the_rows_it_fires_by_their_address(q, sweepers, tracked):
    q.schedule([op_schedule("addr", f"k{i:04d}", b"p%d" % i, partition=f"p{i % 3}") for i in range(N)])
    fired = FiredLog()
    h = sweepers("addr", fired=fired)
    h.start()
    wait_for(lambda: q.timers_left() == 0 and fired.total() == N, 60, 0.05, "every timer fired")
    st = assert_clean_stop(h)
    assert st["fired_total"] == N
    delivered = [f.txn for *_x, f in q.delivered(TENANT_A, "addr")]
    assert len(delivered) == len(set(delivered)) == N
    # The fires went by address, never by key: the sweeper passed an address for every row.
    assert calls(q, BY_ADDRESS) >= 1, "no fire deleted its rows by address"
    assert calls(q, BY_KEY) == 0, "a fire looked its rows up by key"



BY_PARTITION_KEY = "%p.queue_id = queue_ids[g.i] AND p.name = p_seg_partitions[g.i]%"
AT_HINTS = "%lp.ctid = ANY (p_hints)%"


def test_the_sweeper_takes_a_partition_it_fired_last_at_the_address_the_fire_answered(q, sweepers, tracked):
    """Schema 37: each fire answers where its partitions' rows are after its write, and the
    sweeper hands those addresses to its next fire of the same partitions, which takes the
    rows there instead of looking them up by key (under a held snapshot each lookup by key
    walks every version of the row since). A first round into three partitions a broker
    created looks them up by key; a second round into the same partitions is handed their
    addresses and never looks a partition up by key; every timer of both rounds is in the
    log once."""
    for p in ("p0", "p1", "p2"):  # as a broker's pushes leave them: the first round looks them up
        q.q("SELECT * FROM queen.log_provision_v1(%s, 'addr2', %s)", (TENANT_A, p))
    fired = FiredLog()
    h = sweepers("addr2", fired=fired)
    h.start()
    n = 0
    looked_up = []
    for rnd in range(2):
        q.schedule([op_schedule("addr2", f"r{rnd}-{i:04d}", b"p%d" % i, partition=f"p{i % 3}") for i in range(300)])
        n += 300
        wait_for(lambda: q.timers_left() == 0 and fired.total() == n, 60, 0.05, f"round {rnd} fired")
        looked_up.append(calls(q, BY_PARTITION_KEY))
    hinted = calls(q, AT_HINTS)
    st = assert_clean_stop(h)
    assert st["fired_total"] == 2 * 300
    delivered = [f.txn for *_x, f in q.delivered(TENANT_A, "addr2")]
    assert len(delivered) == len(set(delivered)) == 2 * 300
    assert looked_up[0] >= 1, "the first round's fires never looked a partition up by key"
    assert hinted >= 1, "no fire was handed its partitions' addresses"
    assert looked_up[1] == looked_up[0], f"the second round looked partitions up by key {looked_up[1] - looked_up[0]} times"
