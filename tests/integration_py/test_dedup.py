"""5. Dedup: one transaction id, one message, whatever the number of timers carrying it.

The same txn scheduled under two timer keys of one queue, within the queue's dedup window,
lands once; the second reports `duplicate` (duplicate_total == 1) and its timer is gone.
Three ways for the second to arrive: in the same claim as the first, in a later fire after
the first was delivered, and after a plain push (queen.log_push_v1) of that txn. Another
queue (and another tenant's same-named queue) is a different dedup scope."""

import os
import time

import pytest

from queenkit import (TENANT_A, TENANT_B, assert_clean_stop, op_schedule, txn_hash,
                      wait_for)


def _index_count(q, queue, tenant=TENANT_A):
    return q.one("SELECT count(*) FROM queen.log_txn_index i JOIN queen.queues q"
                 " ON q.id = i.queue_id WHERE q.tenant_id = %s::uuid AND q.name = %s",
                 (tenant, queue))


def _messages(q, queue, tenant=TENANT_A):
    return q.one("SELECT coalesce(sum(s.count), 0) FROM queen.log_segments s"
                 " JOIN queen.log_partitions p ON p.id = s.partition_id"
                 " JOIN queen.queues q ON q.id = p.queue_id"
                 " WHERE q.tenant_id = %s::uuid AND q.name = %s", (tenant, queue))


@pytest.mark.parametrize("when", ["same_claim", "later_fire", "after_push"])
def test_same_txn_under_two_keys_lands_once(q, sweepers, when):
    queue = "dedup"
    txn = "order-42"
    h = sweepers(f"dedup-{when}")
    if when == "after_push":
        # A producer already wrote this txn (hash recorded in the dedup index).
        q.q("SELECT queen.log_push_v1(%s::uuid, %s, 'p0', 1, %s, %s, now())",
            (TENANT_A, queue, txn_hash(txn), b"pushed-blob"))
    if when == "same_claim":
        q.schedule([op_schedule(queue, "first", b"one", partition="p0", txn=txn),
                    op_schedule(queue, "second", b"two", partition="p1", txn=txn)])
        h.start()
    else:
        h.start()
        if when == "later_fire":
            q.schedule([op_schedule(queue, "first", b"one", partition="p0", txn=txn)])
            wait_for(lambda: h.stats()["fired_total"] == 1, 10, 0.02, "the first delivery")
        q.schedule([op_schedule(queue, "second", b"two", partition="p1", txn=txn)])
    wait_for(lambda: q.timers_left() == 0, 10, 0.02, "both timers to be handled")
    # Same txn in another queue and in the other tenant's same-named queue: not duplicates.
    q.schedule([op_schedule("dedup-other", "x", b"other", txn=txn)])
    q.schedule([op_schedule(queue, "y", b"tenant-b", txn=txn)], tenant=TENANT_B)
    wait_for(lambda: q.timers_left() == 0, 10, 0.02, "the other scopes")
    time.sleep(0.1)
    st = h.stats()
    assert_clean_stop(h)
    print(f"\n[dedup {when}] fired {st['fired_total']} duplicate {st['duplicate_total']} "
          f"released {st['released_total']} stale {st['stale_total']}")

    assert st["duplicate_total"] == 1, st["duplicate_total"]
    # One of (first, second) plus the two other-scope timers; after a push neither of the
    # queue's timers is new, so only the two others.
    expected_fired = 2 if when == "after_push" else 3
    assert st["fired_total"] == expected_fired, st["fired_total"]
    # The log of the queue holds the txn once.
    assert _index_count(q, queue) == 1
    assert _messages(q, queue) == 1
    if when != "after_push":
        frames = [f for *_x, f in q.delivered(TENANT_A, queue)]
        assert [f.txn for f in frames] == [txn]
    assert _messages(q, "dedup-other") == 1
    assert _messages(q, queue, TENANT_B) == 1
    assert q.one("SELECT count(*) FROM queen.log_dlq") == 0


def test_dedup_window_is_per_queue_setting(q, sweepers):
    """A queue whose dedup window is 0 accepts the same txn again (the window, not the
    index, decides); a second timer with that txn is then delivered, not a duplicate."""
    queue = "nowindow"
    q.provision(TENANT_A, queue, "p0")
    q.q("UPDATE queen.queues SET dedup_window_ms = 0 WHERE name = %s", (queue,))
    h = sweepers("dedup-window")
    h.start()
    q.schedule([op_schedule(queue, "a", b"1", txn="same")])
    wait_for(lambda: h.stats()["fired_total"] == 1, 10, 0.02, "the first")
    q.schedule([op_schedule(queue, "b", b"2", txn="same")])
    wait_for(lambda: h.stats()["fired_total"] == 2, 10, 0.02, "the second (window 0)")
    st = h.stats()
    assert_clean_stop(h)
    assert st["duplicate_total"] == 0
    assert _messages(q, queue) == 2
    payloads = sorted(os.fsdecode(f.payload) for *_x, f in q.delivered(TENANT_A, queue))
    assert payloads == ["1", "2"]
