#!/usr/bin/env python3
"""The demo's driver (examples/demo runs it once the build and the database are up).

Starts two demo brokers (examples/demo_broker.py, each its own process with its own
sweeper and broker_id); broker "demo-a" schedules the timers and rings its own wake
after each commit; a live view redraws about four times a second (plain progress
lines when stdout is not a terminal); midway demo-a is killed with SIGKILL and
demo-b finishes the work alone, with no wake from anyone: its sleep ceiling is the
net. At the end the log itself is read back (log_read_v1 + the segment codec) to
check that every scheduled txn is there exactly once, and lateness is computed from
the segments' created_at against each timer's deliverAt.

    demo_driver.py [--seconds N] [--timers N] [--partitions P] [--lease-ms MS]

Needs QUEEN_TEST_CONNINFO (or PG*) and the binding on PYTHONPATH. Exit 0 only if
every timer fired exactly once. Everything it starts is stopped, Ctrl-C included.
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
QUEUE = "demo"
BROKERS = ["demo-a", "demo-b"]   # demo-a schedules; demo-a is the one killed


class Interrupted(Exception):
    pass


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def pct(sorted_values, q):
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, int(q * (len(sorted_values) - 1) + 0.5))]


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
                   "--state-file", str(work / f"{name}.json"), "--lease-ms", str(args.lease_ms),
                   "--conninfo", conninfo]
            if name == BROKERS[0]:
                cmd += ["--schedule", str(n), "--over-ms", str(window_ms), "--start-in-ms", "2000",
                        "--partitions", str(args.partitions), "--queue", QUEUE,
                        "--scheduled-file", str(work / "scheduled.json")]
            with open(work / f"{name}.log", "w") as log:
                # Own process group: a Ctrl-C reaches the driver, which stops them in order.
                procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True)
        if args.pid_file:
            Path(args.pid_file).write_text("".join(f"{p.pid}\n" for p in procs.values()))
        event(f"started brokers {', '.join(f'{k} (pid {p.pid})' for k, p in procs.items())}, "
              f"lease {args.lease_ms} ms")

        db = psycopg2.connect(conninfo, application_name="demo-driver")
        db.autocommit = True
        scheduled_seen = False
        kill_at = None
        deadline = t0 + 2000 + window_ms + 60_000
        last_plain = 0
        pending = None
        while True:
            time.sleep(0.25)
            states = {name: state(name) for name in BROKERS}
            for name, p in procs.items():
                if p.poll() is not None and name not in killed:
                    raise RuntimeError(f"{name} exited with {p.returncode}; see {work / (name + '.log')}")
            try:
                with db.cursor() as cur:
                    cur.execute("SELECT (SELECT count(*) FROM queen.log_timers WHERE queue = %s), "
                                "(SELECT coalesce(sum(s.count), 0) FROM queen.log_segments s "
                                "   JOIN queen.log_partitions p ON p.id = s.partition_id "
                                "   JOIN queen.queues q ON q.id = p.queue_id "
                                "  WHERE q.tenant_id = %s AND q.name = %s)", (QUEUE, TENANT, QUEUE))
                    pending, in_log = cur.fetchone()
            except psycopg2.Error:
                pending = in_log = None   # the schema is not there yet
            sa = states[BROKERS[0]]
            if not scheduled_seen and (work / "scheduled.json").exists():
                scheduled_seen = True
                event(f"{BROKERS[0]} scheduled {n} timers on {args.partitions} partitions in "
                      f"{(n + 255) // 256} transactions, due over the next {args.seconds} s; "
                      f"it rang its own wake after each COMMIT")
                kill_at = now_ms() + 2000 + window_ms // 2
            if kill_at and not killed and now_ms() >= kill_at:
                victim = BROKERS[0]
                procs[victim].send_signal(signal.SIGKILL)
                procs[victim].wait()
                killed[victim] = now_ms()
                event(f"SIGKILL {victim} (pid {procs[victim].pid}) midway: its claims come back "
                      f"after the {args.lease_ms} ms lease; {BROKERS[1]} gets no wake from anyone "
                      f"and finds the work within its sleep ceiling")
            render(tty, t0, args, n, pending, in_log, states, killed, events, procs, last_plain)
            if not tty and now_ms() - last_plain >= 1000:
                last_plain = now_ms()
            if killed and scheduled_seen and pending == 0:
                event(f"queen.log_timers is empty for queue {QUEUE!r}")
                break
            if now_ms() > deadline:
                event("time limit reached before every timer fired")
                break
            if sa is None and now_ms() - t0 > 30_000:
                raise RuntimeError(f"{BROKERS[0]} never reported; see {work / (BROKERS[0] + '.log')}")

        # Stop the survivor gracefully (it releases its claims), then read the log.
        for name, p in procs.items():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(15)
        return summary(db, work, args, n, states_final={b: state(b) for b in BROKERS}, killed=killed,
                       t0=t0)
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


def render(tty, t0, args, n, pending, in_log, states, killed, events, procs, last_plain):
    elapsed = (now_ms() - t0) / 1000
    rows = []
    for name in BROKERS:
        s = states.get(name)
        st = (s or {}).get("stats", {})
        lag = st.get("fire_lag_ms", {})
        status = "KILLED" if name in killed else st.get("state", "starting")
        rows.append((name, procs[name].pid, status, st.get("fired_total", 0), lag.get("p50", 0), lag.get("p99", 0),
                     st.get("wakes_total", 0), st.get("wake_signals_total", 0), st.get("stale_total", 0),
                     st.get("timers_due", 0), st.get("sleep_ms", 0), (s or {}).get("scheduled", 0)))
    pend = "?" if pending is None else str(pending)
    logged = "?" if in_log is None else str(in_log)
    if tty:
        out = ["\x1b[H\x1b[2J",
               f"queen-sweeper demo: {len(BROKERS)} brokers, {n} timers due over {args.seconds} s, "
               f"lease {args.lease_ms} ms{'':8}t+{elapsed:.1f}s",
               "",
               f"  timers pending in queen.log_timers: {pend:>6}      messages in the log: {logged:>6} / {n}",
               "",
               f"  {'broker':<8} {'pid':>7} {'state':<8} {'sched':>6} {'fired':>6} {'lag p50':>8} {'lag p99':>8} "
               f"{'wakes':>6} {'signals':>8} {'stale':>6} {'due':>6} {'sleep':>6}"]
        for r in rows:
            out.append(f"  {r[0]:<8} {r[1]:>7} {r[2]:<8} {r[11]:>6} {r[3]:>6} {r[4]:>6}ms {r[5]:>6}ms "
                       f"{r[6]:>6} {r[7]:>8} {r[8]:>6} {r[9]:>6} {r[10]:>4}ms")
        out += ["", "  wakes = wake() calls by the host; signals = times they actually rang the loop",
                "  (only an instant earlier than the one already promised rings it).", "", "  events:"]
        out += [f"    {e}" for e in events[-8:]]
        sys.stdout.write("\n".join(out) + "\n")
        sys.stdout.flush()
    elif now_ms() - last_plain >= 1000:
        parts = [f"{r[0]} {r[2]} fired {r[3]} lag p50/p99 {r[4]}/{r[5]} ms wakes/signals {r[6]}/{r[7]} "
                 f"stale {r[8]}" for r in rows]
        print(f"t+{elapsed:5.1f}s pending {pend:>5} in log {logged:>5} | " + " | ".join(parts), flush=True)


def summary(db, work, args, n, states_final, killed, t0):
    deliver = json.loads((work / "scheduled.json").read_text())
    count = Counter()
    lateness = []
    with db.cursor() as cur:
        for p in range(args.partitions):
            cur.execute("SELECT blob, queen.epoch_ms_v1(created_at) FROM queen.log_read_v1(%s, %s, %s, 0, NULL)",
                        (TENANT, QUEUE, f"p{p}"))
            for blob, created in cur.fetchall():
                for fr in decode_segment(bytes(blob)):
                    if fr.txn in deliver:
                        count[fr.txn] += 1
                        lateness.append(created - deliver[fr.txn])
    once = sum(1 for t in deliver if count[t] == 1)
    missing = sum(1 for t in deliver if count[t] == 0)
    dups = sum(1 for t in deliver if count[t] > 1)
    lateness.sort()
    ok = once == n == len(deliver) and missing == 0 and dups == 0
    print()
    print("summary (read back from the log: queen.log_read_v1 + the segment codec)")
    print(f"  scheduled                {len(deliver)}")
    print(f"  fired exactly once       {once}   (missing {missing}, duplicated {dups})")
    print(f"  lateness created_at - deliverAt:  p50 {pct(lateness, 0.5)} ms, p99 {pct(lateness, 0.99)} ms, "
          f"worst {lateness[-1] if lateness else 0} ms")
    held = sum(1 for v in lateness if v >= args.lease_ms // 2)
    if held:
        print(f"  ({held} timers were late by half a lease or more: the claims {BROKERS[0]} held when it "
              f"was killed wait out the {args.lease_ms} ms lease before {BROKERS[1]} may take them)")
    else:
        print(f"  ({BROKERS[0]} held no claim when it was killed, so nothing waited out the "
              f"{args.lease_ms} ms lease)")
    for name in BROKERS:
        s = states_final.get(name) or {}
        st = s.get("stats", {})
        tag = "killed (last snapshot)" if name in killed else st.get("state", "?")
        print(f"  {name}: {tag}; fired_total {st.get('fired_total', 0)}, stale {st.get('stale_total', 0)}, "
              f"duplicate {st.get('duplicate_total', 0)}, wakes/signals {st.get('wakes_total', 0)}/"
              f"{st.get('wake_signals_total', 0)}")
    print(f"  run time {(now_ms() - t0) / 1000:.1f}s -> {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
