"""4. The fire transaction is capped in bytes, not rows.

With sweeper_max_fire_bytes = 64 KiB, one claim of 40 incompressible 4 KiB timers in one
partition (~166 KiB of frames) is split into several fire transactions, every segment
stays within the cap, and everything lands once, in claim order. A single timer larger
than the cap (300 KiB) still fires, alone in its own segment."""

import os
import time

from queenkit import TENANT_A, assert_clean_stop, decode_segment, op_schedule, wait_for

CAP = 64 * 1024


def test_byte_cap_splits_one_claim_into_several_transactions(q, sweepers):
    queue = "bytecap"
    n = 40
    payloads = {f"k{i:02d}": os.urandom(4096) for i in range(n)}
    # Distinct deliver instants (2 ms apart) so the claim order is known.
    q.schedule([op_schedule(queue, key, payloads[key], delay_ms=2 * i)
                for i, key in enumerate(sorted(payloads))])
    time.sleep(0.2)  # all due before the sweeper's first probe
    h = sweepers("bytecap", sweeper_max_fire_bytes=CAP, sweeper_claim_batch=200)
    h.start()
    wait_for(lambda: q.timers_left() == 0, 15, 0.05, "the byte-capped fire")
    # The table empties at the last commit; the counters follow when its answer is read.
    wait_for(lambda: h.stats()["fired_total"] == n, 5, 0.02, "the last fire's answer")
    st = h.stats()
    assert_clean_stop(h)
    print(f"\n[byte cap] claims {st['claims_total']} (claimed {st['claimed_total']}), fire txns "
          f"{st['fire_txns_total']}, segments {st['fired_segments_total']}, bytes "
          f"{st['fire_bytes_total']}")

    assert st["claimed_total"] == n and st["fired_total"] == n
    assert st["stale_total"] == 0
    # One claim (all 40 fit in a batch of 200), several transactions.
    raw = n * (4096 + 16)
    assert st["fire_txns_total"] > 1, st["fire_txns_total"]
    assert st["fire_txns_total"] >= -(-raw // CAP), (st["fire_txns_total"], raw)
    segs = q.log_rows(TENANT_A, queue)
    assert len(segs) == st["fired_segments_total"] >= st["fire_txns_total"]
    for *_x, base, end, count, _ca, blob, hashes in segs:
        assert len(blob) <= CAP, (base, count, len(blob))
        assert len(blob) + len(hashes) <= CAP + 64, (base, count, len(blob), len(hashes))
    # Everything once, in claim (= deliver) order, payloads intact.
    frames = [f for *_x, f in q.delivered(TENANT_A, queue)]
    assert [f.txn for f in frames] == [f"txn-{k}" for k in sorted(payloads)]
    assert all(f.payload == payloads[f.txn[4:]] for f in frames)
    assert st["fire_bytes_total"] <= st["fire_txns_total"] * CAP


def test_one_timer_larger_than_the_cap_fires_alone(q, sweepers):
    queue = "bytecap-big"
    big = os.urandom(300 * 1024)
    small = {f"s{i}": os.urandom(1000) for i in range(5)}
    ops = [op_schedule(queue, "big", big, delay_ms=0)]
    ops += [op_schedule(queue, k, v, delay_ms=0) for k, v in small.items()]
    q.schedule(ops)
    h = sweepers("bytecap-big", sweeper_max_fire_bytes=CAP)
    h.start()
    wait_for(lambda: q.timers_left() == 0, 15, 0.05, "the oversized timer to fire")
    # The rows leave the table at COMMIT; the sweeper counts them once it has read the answer.
    wait_for(lambda: h.stats()["fired_total"] >= 6, 15, 0.02, "the fire's answer to be counted")
    st = h.stats()
    assert_clean_stop(h)
    assert st["fired_total"] == 6 and st["rejected_total"] == 0, st
    assert st["fire_failures"] == {"transient": 0, "config": 0, "permanent": 0}, st["fire_failures"]
    assert q.one("SELECT count(*) FROM queen.log_dlq") == 0
    segs = q.log_rows(TENANT_A, queue)
    big_segs = []
    for *_x, base, end, count, _ca, blob, hashes in segs:
        frames = decode_segment(blob)
        if any(f.txn == "txn-big" for f in frames):
            big_segs.append((count, len(blob), frames))
        else:
            assert len(blob) <= CAP
    assert len(big_segs) == 1
    count, size, frames = big_segs[0]
    assert count == 1, "the oversized timer shares its segment"
    assert frames[0].payload == big
    print(f"\n[byte cap] a {len(big)}-byte timer fired alone in a {size}-byte segment "
          f"(cap {CAP}); fire txns {st['fire_txns_total']}")
