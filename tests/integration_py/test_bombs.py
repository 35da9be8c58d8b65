"""Decompression bombs in the table (issue 8, item 1).

log_timers_apply_v1 refuses a payloadZstd payload that is not a zstd frame, declares no
content size or declares one over the payload limit. But what is already in the table, or
written there by anything other than apply, must not decide how much memory a sweeper takes:
the packer never inflates a payload past the 1 MiB payload limit nor a claim past its
budget. Here 20 bombs of 300 MiB each (9.6 KB stored: RLE blocks), with and without a
declared content size, are written straight into queen.log_timers next to good timers.
Before, a few such timers took a sweeper to ~3 GiB. The sweeper runs in a child process so
its peak RSS (VmHWM) is its own; the figure is printed and bounded generously."""

import json
import os
import struct
import subprocess
import sys
import textwrap
import uuid

from queenkit import TENANT_A, op_schedule, wait_for

BOMB_BYTES = 300 << 20
BOMBS = 20
GOOD = 200


def zstd_rle_bomb(total, declare_size):
    """A valid zstd frame of RLE blocks that inflates to `total` zero bytes."""
    block = 128 << 10
    fhd = 0xC0 if declare_size else 0x00          # FCS 8 bytes, or none (unknown size)
    out = bytearray(b"\x28\xb5\x2f\xfd") + bytes([fhd, 0x38])  # window 128 KiB
    if declare_size:
        out += struct.pack("<Q", total)
    left = total
    while left > 0:
        n = min(block, left)
        left -= n
        header = (1 if left == 0 else 0) | (1 << 1) | (n << 3)  # RLE block
        out += struct.pack("<I", header)[:3] + b"\x00"
    return bytes(out)


CHILD = textwrap.dedent("""
    import json, os, sys, time
    from queen_sweeper import Sweeper
    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    conninfo, expect = sys.argv[1], int(sys.argv[2])
    before = hwm()
    sw = Sweeper(conninfo=conninfo, broker_id="bombs", read_env=False, log_stderr=False,
                 sweeper_max_attempts=1, sweeper_max_sleep_ms=50, sweeper_claim_batch=200)
    sw.start()
    deadline = time.time() + 120
    while time.time() < deadline:
        st = sw.stats()
        if st["fired_total"] >= expect and st["dlq_total"] + st["rejected_total"] >= 1:
            time.sleep(1.0)
            break
        time.sleep(0.05)
    st = sw.stats()
    sw.stop(10000)
    sw.close()
    print(json.dumps({"hwm_before": before, "hwm_after": hwm(), "fired": st["fired_total"],
                      "rejected": st["rejected_total"], "dlq": st["dlq_total"],
                      "deferred": st.get("inflate_deferred_total")}))
""")


def test_bombs_in_the_table_never_inflate_a_sweeper(q, sweeper_conninfo):
    assert len(zstd_rle_bomb(BOMB_BYTES, True)) < 16 << 10
    good = [op_schedule("bombs", f"g{i:03d}", os.urandom(200), partition=f"p{i % 4}") for i in range(GOOD)]
    q.schedule(good)
    for i in range(BOMBS):
        q.q("INSERT INTO queen.log_timers (tenant_id, queue, timer_key, deliver_at, txn, message_id,"
            " payload, payload_zstd) VALUES (%s, 'bombs', %s, now() - interval '1 s', %s, %s, %s, true)",
            (TENANT_A, f"bomb{i:02d}", f"bomb-txn-{i}", str(uuid.uuid4()),
             zstd_rle_bomb(BOMB_BYTES, declare_size=(i % 2 == 0))))
    env = dict(os.environ)
    out = subprocess.run(["/usr/bin/python3", "-c", CHILD, sweeper_conninfo, str(GOOD)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    grew = (r["hwm_after"] - r["hwm_before"]) / (1 << 20)
    print(f"\n[bombs] {BOMBS} bombs of {BOMB_BYTES >> 20} MiB each + {GOOD} good timers: peak RSS "
          f"{r['hwm_before'] / (1 << 20):.0f} MiB before start, {r['hwm_after'] / (1 << 20):.0f} MiB after "
          f"(+{grew:.0f} MiB); fired {r['fired']}, rejected {r['rejected']}, dlq {r['dlq']}")
    assert r["fired"] == GOOD
    wait_for(lambda: q.one("SELECT count(*) FROM queen.log_timers WHERE queue = 'bombs'") == 0, 30, 0.1,
             "every bomb out of the table")
    assert q.one("SELECT count(*) FROM queen.log_dlq") == BOMBS
    # Each bomb failed with its own reason, naming the limit.
    for (err,) in q.q("SELECT error FROM queen.log_dlq"):
        assert "payload limit" in (err or ""), err
    # One payload is never inflated past 1 MiB and a claim never past its budget (16 MiB by
    # default); 20 x 300 MiB inflated would be 6000 MiB. The bound leaves room for the
    # interpreter, libpq and the claim's raw rows.
    assert grew < 256, f"peak RSS grew by {grew:.0f} MiB"
