"""The claim turn (issue 20, schema version 13: sql/002_timers.sql, log_timers_claim_v4,
"The turn").

Every claim locks the one row of queen.log_timers_claim_turn FOR UPDATE before its walk and
keeps it until its transaction ends, waiting for it under a 50 ms lock_timeout; a claim
that cannot have it walks without it. These tests hold the turn's promises: it is held for the claim's
transaction and no longer taken than that, a claim behind it waits and no more than the
bound (another claim's open transaction or a session of the operator's holding the row
cost that wait a claim, never a timer), the caller's lock_timeout comes back either way, and
without the row the claim still claims.
"""
import threading
import time

import psycopg2
import pytest

from queenkit import apply_schema
from sqlkit import NOW, sched_many

TURN_LOCK_NOWAIT = "SELECT id FROM queen.log_timers_claim_turn WHERE id = 1 FOR UPDATE NOWAIT"


def claim4(q, max_rows=10, lease_ms=30000):
    return q.all("SELECT timer_key FROM queen.log_timers_claim_v4(NULL, %s, %s, %s, %s, NULL, NULL,"
                 " NULL, NULL, NULL, NULL, NULL)", (NOW, lease_ms, max_rows, max_rows))


def turn_free(other):
    """Whether the turn's row can be locked at once from another session (then let go)."""
    other.autocommit = False
    try:
        with other.cursor() as cur:
            cur.execute(TURN_LOCK_NOWAIT)
        return True
    except psycopg2.errors.LockNotAvailable:
        return False
    finally:
        other.rollback()
        other.autocommit = True


def claim_beside(q_other, max_rows=10):
    """A claim on another session, in a thread: (keys, seconds) once it returns."""
    out = {}

    def run():
        t0 = time.monotonic()
        out["keys"] = [r["timer_key"] for r in claim4(q_other, max_rows=max_rows)]
        out["secs"] = time.monotonic() - t0

    th = threading.Thread(target=run)
    th.start()
    return th, out


def test_the_schema_writes_the_turn_and_the_sweeper_cannot_touch_it(q, as_sweeper):
    assert q.one("SELECT count(*) FROM queen.log_timers_claim_turn") == 1
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        as_sweeper.one("SELECT id FROM queen.log_timers_claim_turn FOR UPDATE")


def test_a_claim_holds_the_turn_until_its_transaction_ends(q, db, connections):
    sched_many(q, 20)
    other = connections()
    db.autocommit = False
    try:
        got = claim4(q, max_rows=5)
        assert len(got) == 5
        assert not turn_free(other), "the claim's transaction holds the turn"
    finally:
        db.commit()
        db.autocommit = True
    assert turn_free(other), "its commit lets the turn go"


def test_a_claim_that_takes_nothing_takes_no_turn(q, db, connections):
    sched_many(q, 5)
    other = connections()
    db.autocommit = False
    try:
        assert claim4(q, max_rows=0) == []
        assert turn_free(other)
        q.switch("timers_fire_enabled", False)
        assert claim4(q, max_rows=5) == []
        assert turn_free(other)
    finally:
        db.rollback()
        db.autocommit = True


@pytest.mark.parametrize("holder", ["a claim in an open transaction", "an operator's session"])
def test_a_claim_behind_the_turn_waits_for_it_no_more_than_the_bound(q, db, connections, as_sweeper, holder):
    """The second claim waits (the turn is held), then walks without it after 50 ms: it
    returns while the holder's transaction is still open, with rows of its own (the
    holder's claimed rows are locked, and skipped)."""
    sched_many(q, 30)
    db.autocommit = False
    try:
        if holder == "an operator's session":
            q.exec("SELECT id FROM queen.log_timers_claim_turn WHERE id = 1 FOR UPDATE")
            mine = set()
        else:
            mine = {r["timer_key"] for r in claim4(q, max_rows=10)}
            assert len(mine) == 10
        th, out = claim_beside(as_sweeper, max_rows=10)
        th.join(timeout=20)
        assert not th.is_alive(), "the claim behind the turn did not come back"
        assert len(out["keys"]) == 10 and not (set(out["keys"]) & mine)
        # lock_timeout: it waited for the turn (50 ms), not for the holder's transaction,
        # which is still open here.
        assert out["secs"] >= 0.045
        assert not turn_free(connections())
    finally:
        db.rollback()
        db.autocommit = True
    # The holder's claim rolled back: every row is claimable again, none was lost.
    assert len(claim4(q, max_rows=100)) == 30 - len(out["keys"])


def test_the_callers_lock_timeout_comes_back_whether_the_turn_was_had_or_not(q, db, connections, as_sweeper):
    sched_many(q, 10)
    sw = as_sweeper.conn
    for held in (False, True):
        if held:
            db.autocommit = False
            q.exec("SELECT id FROM queen.log_timers_claim_turn WHERE id = 1 FOR UPDATE")
        sw.autocommit = False
        try:
            as_sweeper.exec("SET LOCAL lock_timeout = '7s'")
            assert len(claim4(as_sweeper, max_rows=2)) == 2
            assert as_sweeper.one("SHOW lock_timeout") == "7s"
        finally:
            sw.rollback()
            sw.autocommit = True
            if held:
                db.rollback()
                db.autocommit = True


def test_without_the_turns_row_the_claim_claims_and_the_apply_puts_it_back(q, db):
    sched_many(q, 10)
    q.exec("DELETE FROM queen.log_timers_claim_turn")
    assert len(claim4(q, max_rows=10)) == 10
    apply_schema(db)
    assert q.one("SELECT count(*) FROM queen.log_timers_claim_turn") == 1


def test_the_turn_helper_says_whether_it_had_the_turn(q, db, connections):
    other = connections()
    oq = type(q)(other)
    other.autocommit = False
    try:
        assert oq.one("SELECT queen.log_timers_take_turn_v1()") is True
        t0 = time.monotonic()
        assert q.one("SELECT queen.log_timers_take_turn_v1()") is False
        assert time.monotonic() - t0 >= 0.045
    finally:
        other.rollback()
        other.autocommit = True
    assert q.one("SELECT queen.log_timers_take_turn_v1()") is True
    q.exec("DELETE FROM queen.log_timers_claim_turn")
    assert q.one("SELECT queen.log_timers_take_turn_v1()") is False
    apply_schema(db)
