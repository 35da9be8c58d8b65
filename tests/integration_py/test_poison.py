"""6. Poison isolation.

One timer among 200 cannot be fired, ever: its partition does not exist yet and a trigger
the test installs on queen.log_partitions refuses to create a partition named 'poison'
(SQLSTATE P0001, a permanent failure). The fire of the batch that holds it fails as a
whole; the sweeper replays it one timer per call, so the 199 others are delivered at once
and only the poisoned one backs off. After sweeper_max_attempts (2) it sits in
queen.log_dlq under consumer group '__timer__'."""

import json
import time

from queenkit import TENANT_A, assert_clean_stop, connect, op_schedule, wait_for

QUEUE = "poisoned"


def _install_poison_trigger(q, partition_name):
    q.q(f"""
        CREATE OR REPLACE FUNCTION public.fire_test_refuse_partition() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.name = '{partition_name}' THEN
                RAISE EXCEPTION 'fire test: partition % is poisoned', NEW.name;
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER fire_test_poison BEFORE INSERT ON queen.log_partitions
            FOR EACH ROW EXECUTE FUNCTION public.fire_test_refuse_partition();
    """)


def test_one_poisoned_timer_does_not_hold_back_199_and_ends_in_the_dlq(q, sweepers):
    _install_poison_trigger(q, "poison")
    good = [op_schedule(QUEUE, f"good{i:03d}", f"good-{i}".encode(), partition=f"p{i % 10}")
            for i in range(199)]
    poison = op_schedule(QUEUE, "poison-key", json.dumps({"poison": True}).encode(),
                         partition="poison", txn="txn-poison")
    # The poisoned timer is the oldest, so it sits in the first claim with the others.
    q.schedule([poison])
    q.schedule(good)
    # The poisoned timer's backoff (8 s) outlasts the one-by-one replay of the other 199 even
    # on a loaded machine, so "the good ones first, the poisoned one waiting" is what is
    # tested, not the machine's speed.
    h = sweepers("poison", sweeper_max_attempts=2, sweeper_backoff_min_ms=8000,
                 sweeper_backoff_max_ms=9000, sweeper_claim_batch=200)
    t0 = time.monotonic()
    h.start()
    wait_for(lambda: q.one("SELECT coalesce(sum(count), 0) FROM queen.log_segments") == 199,
             30, 0.02, "the 199 good timers")
    t_good = time.monotonic() - t0
    # At that moment the poisoned timer is still waiting out its backoff, not in the DLQ.
    row = q.peek(QUEUE, "poison-key")
    assert row is not None and row["attempts"] == 1 and row["claimed"] is False, row
    wait_for(lambda: q.one("SELECT count(*) FROM queen.log_dlq") == 1, 45, 0.05,
             "the poisoned timer in the DLQ")
    t_dlq = time.monotonic() - t0
    wait_for(lambda: h.stats()["dlq_total"] == 1, 5, 0.02, "dlq_total")
    st = h.stats()
    assert_clean_stop(h)
    print(f"\n[poison] 199 good fired after {t_good:.2f}s, poison in the DLQ after {t_dlq:.2f}s; "
          f"fired {st['fired_total']} poisoned {st['poisoned_total']} dlq {st['dlq_total']} "
          f"failures {st['fire_failures']}")

    assert st["fired_total"] == 199
    assert st["poisoned_total"] >= 1
    assert st["dlq_total"] == 1
    assert st["fire_failures"]["permanent"] >= 2, st["fire_failures"]
    assert q.timers_left() == 0
    dlq = q.q("SELECT tenant_id::text, queue, partition, consumer_group, log_offset, payload,"
              "       error, txn, timer_key, attempts FROM queen.log_dlq")
    assert len(dlq) == 1
    tenant, queue, part, group, offset, payload, error, txn, key, attempts = dlq[0]
    assert (tenant, queue, part, group, offset) == (TENANT_A, QUEUE, "poison", "__timer__", -1)
    assert (txn, key, attempts) == ("txn-poison", "poison-key", 2)
    assert payload == {"poison": True}
    assert "poisoned" in (error or ""), error
    # The good ones are all there, once each; the poisoned one is not in any log.
    txns = sorted(f.txn for *_x, f in q.delivered(TENANT_A, QUEUE))
    assert txns == sorted(op["txn"] for op in good)
    assert q.one("SELECT count(*) FROM queen.log_partitions WHERE name = 'poison'") == 0


def test_a_kept_batch_replayed_one_by_one_fires_each_timer_with_its_own_payload(q, sweepers, conninfo):
    """A fire whose segments came back busy keeps them, still claimed, and tries them again
    later. When that later try fails as a whole for a permanent reason, the batch is replayed
    one timer per call: each of those calls must carry the timer's own payload, exactly as a
    first try's replay does (the kept segments are the claim's rows, not copies of part of
    them)."""
    _install_poison_trigger(q, "poison")
    host = connect(conninfo, autocommit=False)
    try:
        # The host creates queue 'kept' and holds its name: every segment of that queue
        # comes back busy (provision busy) and is kept.
        with host.cursor() as cur:
            cur.execute("SELECT queue_id FROM queen.log_provision_v1(%s::uuid, 'kept', 'p0')", (TENANT_A,))
        payloads = {f"txn-good{i}": json.dumps({"n": i, "pad": "x" * 40}).encode() for i in range(5)}
        good = [op_schedule("kept", f"good{i}", payloads[f"txn-good{i}"], partition="good") for i in range(5)]
        poison = op_schedule("kept", "poison-key", b'{"poison": true}', partition="poison", txn="txn-poison")
        q.schedule([poison] + good)
        h = sweepers("kept-poison", sweeper_max_attempts=1, sweeper_backoff_min_ms=8000,
                     sweeper_backoff_max_ms=9000, sweeper_claim_batch=50)
        h.start()
        wait_for(lambda: h.stats()["busy_kept_segments"] >= 2, 30, 0.02, "both segments kept")
        host.commit()
        wait_for(lambda: q.one("SELECT count(*) FROM queen.log_dlq") == 1, 30, 0.05, "the poisoned timer in the DLQ")
        wait_for(lambda: q.one("SELECT coalesce(sum(count), 0) FROM queen.log_segments") == 5, 30, 0.05,
                 "the 5 good timers")
        st = h.stats()
        assert_clean_stop(h)
    finally:
        host.close()
    print(f"\n[kept poison] fired {st['fired_total']} poisoned {st['poisoned_total']} dlq {st['dlq_total']} "
          f"busy retries {st['busy_retries_total']}")
    assert st["busy_retries_total"] >= 1, "the segments were never kept and tried again"
    assert st["poisoned_total"] >= 1, "the kept batch was not replayed one by one"
    got = {f.txn: f.payload for *_x, f in q.delivered(TENANT_A, "kept")}
    assert got == payloads, "a kept timer fired with another payload than its own"
