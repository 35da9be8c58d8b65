#!/usr/bin/env python3
"""The demo's driver (examples/demo runs it once the build and the database are up).

Starts two demo brokers (examples/demo_broker.py, each its own process with its own
sweeper and broker_id). Broker "demo-a" schedules the timers and rings its own wake
after each commit; it is also a slow host (its on_fired takes a few milliseconds, and
it fires a claim in several small transactions: 256 random bytes per timer, at most
1 KiB per fire), so it holds claimed rows most of the time. The two run with different
leases (demo-a 3 s, demo-b 20 s), so a claim's end in queen.log_timers tells whose it
is. Midway, the driver waits until the table shows demo-a holding a handful of claimed
rows and SIGKILLs it on the spot. The rows it held stay claimed by a dead process: the
driver lists them from the table, and demo-b - which gets no wake from anyone - fires
them once their lease has run out.

At the end the log itself is read back (log_read_v1 + the segment codec) and every
total is reconciled against it, with no snapshot taken before the kill:
  - every scheduled txn is in the log exactly once;
  - every segment of the log was announced by exactly one broker's on_fired (each
    broker appends each call to a file that survives SIGKILL), except segments demo-a
    committed in the instant before the kill, whose on_fired never ran;
  - demo-b's own fired_total (after its graceful stop) equals what it announced;
  - every claim demo-a held at the kill was fired by demo-b, after the lease.

    demo_driver.py [--seconds N] [--timers N] [--partitions P] [--lease-ms MS]

Needs QUEEN_TEST_CONNINFO (or PG*) and the binding on PYTHONPATH. Exits 0 only if all
of that holds. Everything it starts is stopped, Ctrl-C included.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psycopg2

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bindings" / "python"))

from queen_sweeper import decode_segment  # noqa: E402

TENANT = "00000000-0000-0000-0000-000000000001"
# A queue of its own per run: the totals are reconciled against everything in its log.
QUEUE = f"demo-{time.strftime('%H%M%S')}-{os.getpid()}"
BROKERS = ["demo-a", "demo-b"]   # demo-a schedules, is the slow host, and is killed
VICTIM, SURVIVOR = BROKERS
SLOW_FIRED_MS = 10               # demo-a's on_fired: a host doing real work there
MIN_HELD = 10                    # kill when demo-a holds at least this many claimed rows
SURVIVOR_LEASE_MS = 20000        # demo-b's lease: long, so the table tells the two apart
ARM_TIMEOUT_S = 8                # kill anyway after this long armed (reported as a failure)


class Interrupted(Exception):
    pass


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def pct(sorted_values, q):
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, int(q * (len(sorted_values) - 1) + 0.5))]


def read_fired(path: Path) -> list[dict]:
    """A broker's on_fired calls, one JSON line each (a SIGKILL can cut nothing but a whole line)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def held_claims(cur, lease_ms):
    """Rows the victim holds right now (their claim ends within its lease from now):
    {(timer_key, claim_token): claimed_until_ms}."""
    cur.execute("SELECT timer_key, claim_token::text, queen.epoch_ms_v1(claimed_until) "
                "FROM queen.log_timers WHERE queue = %s AND claim_token IS NOT NULL "
                "AND claimed_until > now() "
                "AND claimed_until <= now() + make_interval(secs => %s / 1000.0)", (QUEUE, lease_ms))
    return {(k, t): u for k, t, u in cur.fetchall()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=10, help="the window the timers are due across")
    ap.add_argument("--timers", type=int, default=0, help="default: 300 per second of window")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--lease-ms", type=int, default=3000)
    ap.add_argument("--pid-file", help="where to list the brokers' pids (for the caller's cleanup)")
    args = ap.parse_args()
    n = args.timers or 300 * args.seconds
    window_ms = args.seconds * 1000
    conninfo = os.environ.get("QUEEN_TEST_CONNINFO", "")
    tty = sys.stdout.isatty()

    def on_signal(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    work = Path(tempfile.mkdtemp(prefix="queen-demo."))
    procs: dict[str, subprocess.Popen] = {}
    killed: dict[str, int] = {}
    events: list[str] = []
    t0 = now_ms()
    run = {"orphans": {}, "kill_ms": None, "arm_expired": False}

    def event(text):
        line = f"+{(now_ms() - t0) / 1000:5.1f}s  {text}"
        events.append(line)
        if not tty:
            print(line, flush=True)

    def state(name):
        try:
            return json.loads((work / f"{name}.json").read_text())
        except (OSError, ValueError):
            return None

    db = None
    try:
        for name in BROKERS:
            cmd = [sys.executable, str(HERE / "demo_broker.py"), "--broker-id", name,
                   "--state-file", str(work / f"{name}.json"),
                   "--fired-file", str(work / f"{name}.fired"),
                   "--lease-ms", str(args.lease_ms if name == VICTIM else SURVIVOR_LEASE_MS),
                   "--conninfo", conninfo]
            if name == VICTIM:
                cmd += ["--schedule", str(n), "--over-ms", str(window_ms), "--start-in-ms", "2000",
                        "--partitions", str(args.partitions), "--queue", QUEUE,
                        "--scheduled-file", str(work / "scheduled.json"),
                        "--slow-fired-ms", str(SLOW_FIRED_MS), "--max-fire-bytes", "1024",
                        "--claim-batch", "50", "--payload-bytes", "256"]
            with open(work / f"{name}.log", "w") as log:
                # Own process group: a Ctrl-C reaches the driver, which stops them in order.
                procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True)
        if args.pid_file:
            Path(args.pid_file).write_text("".join(f"{p.pid}\n" for p in procs.values()))
        event(f"started brokers {', '.join(f'{k} (pid {p.pid})' for k, p in procs.items())}, "
              f"{VICTIM}'s lease {args.lease_ms} ms, {SURVIVOR}'s {SURVIVOR_LEASE_MS} ms (so a claim's "
              f"end tells whose it is); {VICTIM} is a slow host ({SLOW_FIRED_MS} ms per on_fired)")

        db = psycopg2.connect(conninfo, application_name="demo-driver")
        db.autocommit = True
        scheduled_seen = False
        arm_at = None
        armed_since = None
        deadline = t0 + 2000 + window_ms + 60_000
        last_view = 0
        pending = in_log = claimed_now = None
        while True:
            # Poll quickly while waiting for the moment to kill; the view redraws 4 times a second.
            time.sleep(0.02 if armed_since and not killed else 0.25)
            for name, p in procs.items():
                if p.poll() is not None and name not in killed:
                    raise RuntimeError(f"{name} exited with {p.returncode}; see {work / (name + '.log')}")
            if not scheduled_seen and (work / "scheduled.json").exists():
                scheduled_seen = True
                event(f"{VICTIM} scheduled {n} timers on {args.partitions} partitions in "
                      f"{(n + 255) // 256} transactions, due over the next {args.seconds} s; "
                      f"it rang its own wake after each COMMIT")
                arm_at = now_ms() + 2000 + window_ms // 3
            if arm_at and not killed and armed_since is None and now_ms() >= arm_at:
                armed_since = now_ms()
                event(f"waiting for {VICTIM} to hold at least {MIN_HELD} claimed rows")
            if armed_since and not killed:
                try:
                    with db.cursor() as cur:
                        # claimed_until = claim time + lease: a claim ending within the
                        # victim's (short) lease from now is the victim's; the survivor's end
                        # later than that.
                        cur.execute("SELECT count(*) FROM queen.log_timers WHERE queue = %s "
                                    "AND claim_token IS NOT NULL AND claimed_until > now() "
                                    "AND claimed_until <= now() + make_interval(secs => %s / 1000.0)",
                                    (QUEUE, args.lease_ms))
                        old_claims = cur.fetchone()[0]
                except psycopg2.Error:
                    old_claims = 0
                expired = now_ms() - armed_since > ARM_TIMEOUT_S * 1000
                if old_claims >= MIN_HELD or expired:
                    run["arm_expired"] = expired and old_claims == 0
                    procs[VICTIM].send_signal(signal.SIGKILL)
                    procs[VICTIM].wait()
                    killed[VICTIM] = run["kill_ms"] = now_ms()
                    event(f"SIGKILL {VICTIM} (pid {procs[VICTIM].pid}) while the table showed "
                          f"{old_claims} row(s) claimed by it")
                    run["orphans"] = find_orphans(db, args.lease_ms)
                    if run["orphans"]:
                        until = max(run["orphans"].values())
                        event(f"{len(run['orphans'])} row(s) stay claimed by the dead {VICTIM}; "
                              f"their lease ends in {max(0, until - now_ms()) / 1000:.1f} s, then "
                              f"{SURVIVOR} (no wake from anyone) takes them within its sleep ceiling")
                    else:
                        event(f"no claim of {VICTIM}'s outlived the kill")
            try:
                with db.cursor() as cur:
                    cur.execute("SELECT (SELECT count(*) FROM queen.log_timers WHERE queue = %s), "
                                "(SELECT count(*) FROM queen.log_timers WHERE queue = %s "
                                "   AND claim_token IS NOT NULL AND claimed_until > now()), "
                                "(SELECT coalesce(sum(s.count), 0) FROM queen.log_segments s "
                                "   JOIN queen.log_partitions p ON p.id = s.partition_id "
                                "   JOIN queen.queues q ON q.id = p.queue_id "
                                "  WHERE q.tenant_id = %s AND q.name = %s)",
                                (QUEUE, QUEUE, TENANT, QUEUE))
                    pending, claimed_now, in_log = cur.fetchone()
            except psycopg2.Error:
                pending = claimed_now = in_log = None   # the schema is not there yet
            if now_ms() - last_view >= 250 or not tty:
                render(tty, t0, args, n, pending, claimed_now, in_log, work, killed, events, procs,
                       run, last_view)
                if tty or now_ms() - last_view >= 1000:
                    last_view = now_ms()
            if killed and scheduled_seen and pending == 0:
                event(f"queen.log_timers is empty for queue {QUEUE!r}")
                break
            if now_ms() > deadline:
                event("time limit reached before every timer fired")
                break
            if state(VICTIM) is None and now_ms() - t0 > 30_000:
                raise RuntimeError(f"{VICTIM} never reported; see {work / (VICTIM + '.log')}")

        # Stop the survivor gracefully (it releases its claims and writes its final stats).
        for name, p in procs.items():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(15)
        return summary(db, work, args, n, state(SURVIVOR), killed, run, t0)
    except Interrupted as e:
        print(f"\ninterrupted ({e}); stopping the brokers", flush=True)
        return 130
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(8)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if db is not None:
            db.close()


def find_orphans(db, lease_ms):
    """Claims the dead broker left behind: rows still claimed, under the same token, in two
    looks half a second apart after the kill. A live broker fires or hands back its claims
    within milliseconds; only a dead one's stay put until the lease runs out."""
    time.sleep(0.3)
    with db.cursor() as cur:
        first = held_claims(cur, lease_ms)
    time.sleep(0.5)
    with db.cursor() as cur:
        second = held_claims(cur, lease_ms)
    return {key: until for key, until in second.items() if key in first}


def render(tty, t0, args, n, pending, claimed_now, in_log, work, killed, events, procs, run, last_view):
    elapsed = (now_ms() - t0) / 1000
    rows = []
    for name in BROKERS:
        try:
            st = json.loads((work / f"{name}.json").read_text()).get("stats", {})
        except (OSError, ValueError):
            st = {}
        fired = sum(c["count"] for c in read_fired(work / f"{name}.fired"))
        lag = st.get("fire_lag_ms", {})
        status = "KILLED" if name in killed else st.get("state", "starting")
        # A killed broker's stats are its last snapshot: only its on_fired file is shown for it.
        live = name not in killed
        rows.append((name, procs[name].pid, status, fired,
                     lag.get("p50", 0) if live else "-", lag.get("p99", 0) if live else "-",
                     st.get("wakes_total", 0) if live else "-",
                     st.get("stale_total", 0) if live else "-", st.get("sleep_ms", 0) if live else "-"))
    pend = "?" if pending is None else str(pending)
    logged = "?" if in_log is None else str(in_log)
    held = "?" if claimed_now is None else str(claimed_now)
    orphans = ""
    if run["orphans"]:
        left = max(0, max(run["orphans"].values()) - now_ms()) / 1000
        orphans = (f"      left claimed by the dead {VICTIM}: {len(run['orphans'])}"
                   f" ({'lease over' if left == 0 else f'lease ends in {left:.1f} s'})")
    if tty:
        out = ["\x1b[H\x1b[2J",
               f"queen-sweeper demo: {len(BROKERS)} brokers, {n} timers due over {args.seconds} s, "
               f"{VICTIM}'s lease {args.lease_ms} ms{'':8}t+{elapsed:.1f}s",
               "",
               f"  timers pending in queen.log_timers: {pend:>6}   claimed right now: {held:>4}"
               f"      messages in the log: {logged:>6} / {n}",
               orphans,
               f"  {'broker':<8} {'pid':>7} {'state':<8} {'fired':>6} {'lag p50':>8} {'lag p99':>8} "
               f"{'wakes':>6} {'stale':>6} {'sleep':>6}"]
        for r in rows:
            out.append(f"  {r[0]:<8} {r[1]:>7} {r[2]:<8} {r[3]:>6} {r[4]:>6}ms {r[5]:>6}ms "
                       f"{r[6]:>6} {r[7]:>6} {r[8]:>4}ms")
        out += ["", "  fired = messages the broker announced through on_fired (kept across SIGKILL);",
                "  a killed broker's other figures are not shown: its last snapshot predates the kill.",
                "", "  events:"]
        out += [f"    {e}" for e in events[-8:]]
        sys.stdout.write("\n".join(out) + "\n")
        sys.stdout.flush()
    elif now_ms() - last_view >= 1000:
        parts = [f"{r[0]} {r[2]} fired {r[3]} stale {r[7]}" for r in rows]
        print(f"t+{elapsed:5.1f}s pending {pend:>5} claimed {held:>4} in log {logged:>5} | "
              + " | ".join(parts) + (f" |{orphans}" if orphans else ""), flush=True)


def summary(db, work, args, n, survivor_state, killed, run, t0):
    deliver = json.loads((work / "scheduled.json").read_text())
    count = Counter()
    lateness = []
    fired_at = {}                      # txn -> created_at of its segment (server ms)
    segments = {}                      # (partition, base_offset) -> (count, created_at_ms)
    with db.cursor() as cur:
        for p in range(args.partitions):
            part = f"p{p}"
            cur.execute("SELECT base_offset, count, blob, queen.epoch_ms_v1(created_at) "
                        "FROM queen.log_read_v1(%s, %s, %s, 0, NULL)", (TENANT, QUEUE, part))
            for base, seg_count, blob, created in cur.fetchall():
                segments[(part, int(base))] = (int(seg_count), int(created))
                for fr in decode_segment(bytes(blob)):
                    if fr.txn in deliver:
                        count[fr.txn] += 1
                        fired_at[fr.txn] = created
                        lateness.append(created - deliver[fr.txn])
    once = sum(1 for t in deliver if count[t] == 1)
    missing = sum(1 for t in deliver if count[t] == 0)
    dups = sum(1 for t in deliver if count[t] > 1)
    lateness.sort()
    problems = []
    if not (once == n == len(deliver) and missing == 0 and dups == 0):
        problems.append("not every scheduled timer is in the log exactly once")
    in_log = sum(c for c, _ in segments.values())

    # Who announced which segment: each broker's on_fired file, matched on (partition, base_offset).
    announced = {}
    per_broker = {}
    for name in BROKERS:
        calls = [c for c in read_fired(work / f"{name}.fired") if c["queue"] == QUEUE]
        per_broker[name] = (sum(c["count"] for c in calls), len(calls))
        for c in calls:
            key = (c["partition"], int(c["base_offset"]))
            if key in announced:
                problems.append(f"segment {key} announced twice ({announced[key]} and {name})")
            announced[key] = name
            if key not in segments:
                problems.append(f"{name} announced segment {key}, which is not in the log")
            elif segments[key][0] != c["count"]:
                problems.append(f"{name} announced {c['count']} messages for {key}; the log has "
                                f"{segments[key][0]}")
    silent = {k: v for k, v in segments.items() if k not in announced}
    silent_msgs = sum(c for c, _ in silent.values())
    kill_ms = run["kill_ms"] or 0
    late_silent = [k for k, (_, created) in silent.items() if created > kill_ms + 1000]
    if late_silent:
        problems.append(f"{len(late_silent)} segment(s) committed after the kill were never announced")

    sv = (survivor_state or {}).get("stats", {})
    if sv.get("state") != "stopped":
        problems.append(f"{SURVIVOR} did not stop gracefully (state {sv.get('state')!r})")
    if sv.get("fired_total") != per_broker[SURVIVOR][0]:
        problems.append(f"{SURVIVOR}'s fired_total {sv.get('fired_total')} differs from the "
                        f"{per_broker[SURVIVOR][0]} messages it announced")

    orphans = run["orphans"]
    orphan_txns = {key for key, _token in orphans}     # demo timer keys are their txns
    orphan_fired = [t for t in orphan_txns if count[t] == 1]
    after_lease = [t for t in orphan_fired if fired_at[t] >= orphans[next(k for k in orphans if k[0] == t)]]
    if run["arm_expired"] or not orphans:
        problems.append(f"{VICTIM} held no claim that outlived the kill: the recovery was not shown")
    if len(orphan_fired) != len(orphan_txns):
        problems.append(f"{len(orphan_txns) - len(orphan_fired)} of {VICTIM}'s orphaned claims never fired")

    total = per_broker[VICTIM][0] + per_broker[SURVIVOR][0] + silent_msgs
    if not (total == in_log == n):
        problems.append(f"totals do not add up: {per_broker[VICTIM][0]} + {per_broker[SURVIVOR][0]} + "
                        f"{silent_msgs} = {total}, log {in_log}, scheduled {n}")

    print()
    print("summary (read back from the log: queen.log_read_v1 + the segment codec)")
    print(f"  scheduled                       {len(deliver)}")
    print(f"  in the log exactly once         {once}   (missing {missing}, duplicated {dups})")
    print(f"  messages in the log             {in_log} in {len(segments)} segments")
    print(f"    announced by {VICTIM} (on_fired)  {per_broker[VICTIM][0]:>6} in {per_broker[VICTIM][1]} segments"
          f"  (its file, written before each callback returned)")
    print(f"    announced by {SURVIVOR} (on_fired)  {per_broker[SURVIVOR][0]:>6} in {per_broker[SURVIVOR][1]} segments"
          f"  (= its fired_total {sv.get('fired_total')} after a graceful stop)")
    print(f"    committed, never announced    {silent_msgs:>6} in {len(silent)} segments"
          f"  ({VICTIM} died after a fire's COMMIT reached the database, before its on_fired ran)")
    print(f"    sum                           {total:>6}  {'= the log = scheduled' if total == in_log == n else '!= the log'}")
    print(f"  claims {VICTIM} held at the kill    {len(orphans)}: fired by {SURVIVOR} {len(orphan_fired)}, "
          f"all after their lease ended: {'yes' if len(after_lease) == len(orphan_fired) else f'{len(after_lease)} of them'}")
    print(f"  lateness created_at - deliverAt:  p50 {pct(lateness, 0.5)} ms, p99 {pct(lateness, 0.99)} ms, "
          f"worst {lateness[-1] if lateness else 0} ms (the worst are the orphaned claims: "
          f"up to one {args.lease_ms} ms lease)")
    stale = sv.get("stale_total", 0)
    print(f"  {SURVIVOR}: stale {stale}, released {sv.get('released_total', 0)}, duplicate "
          f"{sv.get('duplicate_total', 0)}, wakes {sv.get('wakes_total', 0)}")
    if stale:
        print(f"    (a stale segment is one whose rows {SURVIVOR} could no longer fire under its own "
              f"claim: the other broker's claim query held them for an instant (SKIP LOCKED) or "
              f"their lease had run out. Those rows were handed back and fired by a later claim; "
              f"the exactly-once check above covers them.)")
    print(f"  {VICTIM}: killed; no stats shown (any snapshot of it predates the kill)")
    for p in problems:
        print(f"  PROBLEM: {p}")
    ok = not problems
    print(f"  run time {(now_ms() - t0) / 1000:.1f}s -> {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
