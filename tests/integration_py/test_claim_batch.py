"""The claim batch grows while a backlog lasts and returns to its base when it is over.

2,000 due timers, sweeper_claim_batch 50, sweeper_claim_batch_max 400: the claims double
(50, 100, 200, 400, 400, ...) while each is fired well inside the lease and the byte cap, so
the backlog goes in about 8 claims instead of 40; every timer fires once; and the claim that
finds the table short puts the batch back to 50 (stats claim_batch)."""

from queenkit import TENANT_A, PartitionLock, assert_clean_stop, op_schedule, wait_for


def test_the_claim_grows_through_a_backlog_and_shrinks_after_it(q, sweepers):
    queue = "batch-growth"
    n = 2000
    for start in range(0, n, 250):
        q.schedule([op_schedule(queue, f"k{i:05d}", b"g", partition=f"p{i % 8}")
                    for i in range(start, start + 250)])
    h = sweepers("batch-growth", sweeper_claim_batch=50, sweeper_claim_batch_max=400)
    h.start()
    wait_for(lambda: q.timers_left() == 0, 30, 0.05, "the backlog to drain")
    wait_for(lambda: h.stats()["fired_total"] == n, 5, 0.02, "the last fire's answer")
    st = h.stats()
    assert_clean_stop(h)
    print(f"\n[batch growth] claims {st['claims_total']}, claimed {st['claimed_total']}, "
          f"claim_batch at the end {st['claim_batch']}")
    assert st["claimed_total"] == n and st["stale_total"] == 0
    # Alone: no fire met another broker, and the claims of the backlog overlapped the fires
    # (each but the first of a cycle was sent while the one before it was being fired).
    assert st["contended_claims_total"] == 0
    assert st["claims_ahead_total"] >= st["claims_total"] // 2, st
    # Each taken ahead was packed beside the fire before it (its fire started at once), but
    # perhaps the last, which can find the table empty.
    assert st["claims_ahead_total"] - 1 <= st["claims_packed_ahead_total"] <= st["claims_ahead_total"], st
    assert st["claims_packed_ahead_total"] >= 1, st
    # 40 claims at a fixed 50; growth to 400 needs about 8 (+1 short one at the end).
    assert st["claims_total"] <= 16, st["claims_total"]
    assert st["claim_batch"] == 50
    delivered = [f.txn for *_x, f in q.delivered(TENANT_A, queue)]
    assert len(delivered) == len(set(delivered)) == n


def test_claims_wait_for_their_fires_while_another_broker_is_in_the_way(q, sweepers, conninfo):
    """A partition someone else holds makes the first fire busy (a contended claim); the
    claims that follow are sent after their fires rather than beside them, for a second
    after the last contended one, so the backlog is drained almost without claims ahead.
    Every timer still fires once."""
    queue = "batch-contended"
    n = 2000
    for start in range(0, n, 250):
        q.schedule([op_schedule(queue, f"k{i:05d}", b"c", partition="p0")
                    for i in range(start, start + 250)])
    lock = PartitionLock(conninfo, [q.provision(TENANT_A, queue, "p0")])
    h = sweepers("batch-contended", sweeper_claim_batch=100, sweeper_claim_batch_max=100)
    h.start()
    try:
        # The first fire meets the held partition: busy, then a second call that waits.
        wait_for(lambda: h.stats()["fire_busy_total"] >= 1, 15, 0.02, "a busy fire")
    finally:
        lock.close()
    wait_for(lambda: q.timers_left() == 0, 30, 0.05, "the backlog to drain")
    wait_for(lambda: h.stats()["fired_total"] == n, 5, 0.02, "the last fire's answer")
    st = h.stats()
    assert_clean_stop(h)
    print(f"\n[contended] claims {st['claims_total']}, ahead {st['claims_ahead_total']}, "
          f"contended {st['contended_claims_total']}, waiting first {st['fires_waiting_first_total']}")
    assert st["contended_claims_total"] >= 1
    # The claims after the busy one fire into the same partition within the second: their
    # fires are sent waiting for it at once (fire_waits_first), not skipping it first.
    assert st["fires_waiting_first_total"] >= 1, st
    # About 20 claims of 100: overlapped, all but the first would be ahead; in turn after
    # the contended one, at most the claim sent with the first fire and those after the
    # second has passed (none on a plain build, a few on a slow one).
    assert st["claims_ahead_total"] <= st["claims_total"] // 2, st
    delivered = [f.txn for *_x, f in q.delivered(TENANT_A, queue)]
    assert len(delivered) == len(set(delivered)) == n


def test_a_cycle_that_spends_its_budget_carries_the_next_claim_and_a_pause_hands_it_back(q, sweepers):
    """A backlog larger than a cycle's row budget: each cycle that spends its budget sends the
    claim beside its last fire for the next cycle (claims_carried_total), which fires it first.
    A pause of the fire then finds a carried claim held: the first paused cycle hands it back,
    so no row stays claimed while the fire is paused. Resumed, every timer fires once."""
    queue = "carry"
    n = 12000
    for start in range(0, n, 250):
        q.schedule([op_schedule(queue, f"k{i:05d}", b"c", partition=f"p{i % 8}")
                    for i in range(start, start + 250)])
    h = sweepers("carry", sweeper_cycle_max_rows=300, sweeper_claim_batch=100,
                 sweeper_claim_batch_max=100, sweeper_max_sleep_ms=200)
    h.start()
    wait_for(lambda: h.stats()["claims_carried_total"] >= 3, 30, 0.005, "a claim carried into a cycle")
    q.set_switch("timers_fire_enabled", False)
    try:
        paused = h.stats()["fire_paused_cycles_total"]
        wait_for(lambda: h.stats()["fire_paused_cycles_total"] >= paused + 2, 10, 0.02, "two paused cycles")
        left = q.timers_left()
        claimed = q.one("SELECT count(*) FROM queen.log_timers WHERE claim_token IS NOT NULL")
        st = h.stats()
        print(f"\n[carry] paused with {left} timers left, {claimed} claimed; "
              f"carried {st['claims_carried_total']} of {st['claims_total']} claims")
        assert left > 0, "the backlog ended before the pause: the test needs more timers"
        assert claimed == 0, claimed
    finally:
        q.set_switch("timers_fire_enabled", True)
    wait_for(lambda: q.timers_left() == 0, 60, 0.05, "the backlog to drain")
    wait_for(lambda: h.stats()["fired_total"] == n, 5, 0.02, "the last fire's answer")
    st = h.stats()
    assert_clean_stop(h)
    assert st["claims_carried_total"] >= 3 and st["stale_total"] == 0, st
    delivered = [f.txn for *_x, f in q.delivered(TENANT_A, queue)]
    assert len(delivered) == len(set(delivered)) == n


def test_nothing_is_carried_into_a_cycle_whose_usage_rollup_may_run_first(q, sweepers):
    """The usage rollup's gate always within half a lease (kv_usage_every_ms 2 s, a lease of
    30 s): a cycle that spends its budget carries no claim into the next one (its rows would
    wait through the rollup), and the backlog drains exactly once all the same."""
    queue = "no-carry"
    n = 3000
    for start in range(0, n, 250):
        q.schedule([op_schedule(queue, f"k{i:05d}", b"n", partition=f"p{i % 8}")
                    for i in range(start, start + 250)])
    h = sweepers("no-carry", sweeper_cycle_max_rows=300, sweeper_claim_batch=100,
                 sweeper_claim_batch_max=100, sweeper_lease_ms=30000, kv_usage_every_ms=2000)
    h.start()
    wait_for(lambda: q.timers_left() == 0, 60, 0.05, "the backlog to drain")
    wait_for(lambda: h.stats()["fired_total"] == n, 5, 0.02, "the last fire's answer")
    st = h.stats()
    assert_clean_stop(h)
    assert st["capped_cycles_total"] >= n // 300 - 1, st["capped_cycles_total"]
    assert st["claims_carried_total"] == 0, st["claims_carried_total"]
    delivered = [f.txn for *_x, f in q.delivered(TENANT_A, queue)]
    assert len(delivered) == len(set(delivered)) == n
