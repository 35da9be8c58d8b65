"""11. The start shard comes from the broker's identity, and the sweeper lives in the
maintenance lane.

* Different broker ids start at different shards (several ids, several distinct shards),
  the same id always at the same shard: in two sweepers of one process, at two moments,
  and in another process (so it is derived from the identity, not from the clock or a
  per-process seed).
* The sweeper's calls all go through the maint lane: the push, pop and ack lanes see zero
  calls while maint sees every one of them."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from queenkit import assert_clean_stop, op_schedule, wait_for

IDS = ["broker-a", "broker-b", "broker-c", "broker-d", "eu-west-1:4711", "us-east-2:99",
       "queen-0", "queen-1"]


def _start_shard_in_another_process(conninfo, broker_id):
    code = (
        "import json, sys\n"
        "from queen_sweeper import Sweeper\n"
        "sw = Sweeper(conninfo=sys.argv[1], broker_id=sys.argv[2], read_env=False,"
        " apply_schema=False)\n"
        "print(json.dumps(sw.stats()['start_shard']))\n"
        "sw.close()\n")
    env = dict(os.environ)
    bindings = str(Path(__file__).resolve().parents[2] / "bindings" / "python")
    env["PYTHONPATH"] = bindings + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run([sys.executable, "-c", code, conninfo, broker_id], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_start_shard_is_derived_from_the_broker_id(q, sweepers, conninfo):
    shards = {}
    for bid in IDS:
        h = sweepers(bid)
        st = h.stats()
        assert st["broker_id"] == bid
        assert 0 <= st["start_shard"] < 64
        shards[bid] = st["start_shard"]
        h.sw.close()
    print(f"\n[start shard] {shards}")
    assert len(set(shards.values())) >= 4, f"8 broker ids share too few start shards: {shards}"

    # Two running sweepers with different ids, chosen to differ, start at different shards;
    # the same id gives the same shard at another moment and in another process.
    a_id, b_id = next((x, y) for x in IDS for y in IDS if shards[x] != shards[y])
    a, b = sweepers(a_id), sweepers(b_id)
    a.start()
    b.start()
    time.sleep(0.05)
    a2 = sweepers(a_id)
    sa, sb, sa2 = a.stats()["start_shard"], b.stats()["start_shard"], a2.stats()["start_shard"]
    assert sa != sb, (a_id, sa, b_id, sb)
    assert sa == sa2 == shards[a_id]
    assert _start_shard_in_another_process(conninfo, a_id) == shards[a_id]
    assert _start_shard_in_another_process(conninfo, b_id) == shards[b_id]
    a2.sw.close()
    assert_clean_stop(a)
    assert_clean_stop(b)


def test_the_sweeper_only_uses_the_maintenance_lane(q, sweepers):
    h = sweepers("lanes", kv_expire_every_ms=100)
    h.start()
    q.schedule([op_schedule("lanes", f"k{i}", b"l", partition=f"p{i % 3}") for i in range(30)])
    # Some KV rows expiring, so the prune phase has work too.
    q.q("INSERT INTO queen.kv (tenant_id, namespace, key, value, expires_at)"
        " SELECT '00000000-0000-0000-0000-000000000001', 'ns', 'key' || g, '1'::jsonb,"
        "        now() - interval '1 second' FROM generate_series(1, 20) g")
    wait_for(lambda: q.timers_left() == 0, 10, 0.02, "the fire")
    wait_for(lambda: q.one("SELECT count(*) FROM queen.kv") == 0, 10, 0.05, "the KV prune")
    # The tables empty at each commit; the counters follow when its answer is read.
    wait_for(lambda: h.stats()["fired_total"] == 30 and h.stats()["kv_deleted_total"] == 20, 5, 0.02,
             "the answers to be counted")
    st = h.stats()
    assert_clean_stop(h)
    lanes = st["pool"]["lanes"]
    print(f"\n[lanes] {json.dumps(lanes)}")
    assert st["fired_total"] == 30 and st["kv_deleted_total"] == 20
    for lane in ("push", "pop", "ack"):
        assert lanes[lane]["calls_total"] == 0, (lane, lanes[lane])
    assert lanes["maint"]["calls_total"] > 0
    assert lanes["maint"]["calls_total"] == st["pool"]["calls_total"], (lanes, st["pool"]["calls_total"])
