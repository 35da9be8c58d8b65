"""Shared plumbing of the benchmark commands in tests/bench (fire, idle, load, frontier).

Not a test module: nothing here asserts. It finds (or builds) the library, starts a
throwaway PostgreSQL with tests/pg when QUEEN_TEST_CONNINFO is not set (and stops it at
exit), applies the schema, and offers small helpers (RSS, percentiles, printing).
"""

from __future__ import annotations

import atexit
import datetime as dt
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TENANT = "00000000-0000-0000-0000-000000000001"

# The shared test kit (tests/kit/queenkit.py): connections come from it, and importing it
# puts bindings/python on sys.path and on PYTHONPATH for the benchmarks' child processes.
# (Only the library is loaded late, by the first Sweeper: ensure_library() comes first.)
sys.path.insert(0, os.path.join(ROOT, "tests", "kit"))
from queenkit import connect  # noqa: E402,F401 - B.connect(conninfo, autocommit=True)
import queenkit  # noqa: E402
try:
    import psycopg2  # noqa: F401 - the kit's connect imports it when first called
except ImportError as e:  # pragma: no cover - environment problem
    raise SystemExit(f"the benchmarks need Debian's psycopg2 (apt-get install python3-psycopg2; "
                     f"tests/run installs it with the rest of its packages): {e}")


def say(*parts) -> None:
    print(*parts, flush=True)


# ---------------------------------------------------------------------------------------
# The library
# ---------------------------------------------------------------------------------------

def ensure_library() -> str:
    """The library path, in QUEEN_SWEEPER_LIBRARY for the binding and for subprocesses.

    Taken as given when QUEEN_SWEEPER_LIBRARY is set; otherwise <root>/build, configured
    and built there (RelWithDebInfo) when libqueen_sweeper.so is missing.
    """
    lib = os.environ.get("QUEEN_SWEEPER_LIBRARY")
    if lib:
        if not os.path.isfile(lib):
            sys.exit(f"QUEEN_SWEEPER_LIBRARY={lib} does not exist")
        return lib
    build = os.path.join(ROOT, "build")
    lib = os.path.join(build, "libqueen_sweeper.so")
    if not os.path.isfile(lib):
        say(f"# building the library into {build} (missing libqueen_sweeper.so)")
        subprocess.run(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                        "-DQUEEN_SWEEPER_TESTS=OFF"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", build, "-j2", "--target", "queen_sweeper"], check=True,
                       stdout=subprocess.DEVNULL)
    os.environ["QUEEN_SWEEPER_LIBRARY"] = lib
    return lib


def import_binding():
    """The binding of this tree (the kit put bindings/python first on sys.path)."""
    import queen_sweeper  # noqa: WPS433
    return queen_sweeper


# ---------------------------------------------------------------------------------------
# The database
# ---------------------------------------------------------------------------------------

def bench_sql_dir() -> str:
    """The schema a benchmark measures: $QUEEN_BENCH_SQL_DIR (another build's sql/, the
    "before" of a change) or this tree's sql/."""
    return os.environ.get("QUEEN_BENCH_SQL_DIR") or os.path.join(ROOT, "sql")


def ensure_database(sql_dir: str = None, huge_pages: bool = False) -> str:
    """QUEEN_TEST_CONNINFO, or a throwaway cluster started now and stopped at exit, holding
    only the schema of sql_dir (default bench_sql_dir()): tests/pg applies it and nothing of
    this tree's, so a "before" is not measured on top of the "after"'s indexes, triggers,
    storage settings or functions (until 2026-12-01 it was: tests/pg applied this tree's
    sql/ first, and an older schema applied over it kept everything the older one does
    not replace). huge_pages: the throwaway cluster keeps its shared memory in huge pages
    (tests/pg, QUEEN_PG_HUGE_PAGES=on); a server given by QUEEN_TEST_CONNINFO is as it is
    (the caller checks SHOW huge_pages)."""
    conninfo = os.environ.get("QUEEN_TEST_CONNINFO")
    if conninfo:
        return conninfo
    pgdir = tempfile.mkdtemp(prefix="queen-bench.")
    pg = os.path.join(ROOT, "tests", "pg")
    env = dict(os.environ, QUEEN_PG_SQL_DIR=os.path.abspath(sql_dir or bench_sql_dir()),
               QUEEN_PG_HUGE_PAGES="on" if huge_pages else "off")
    started = subprocess.run([pg, "start", pgdir], capture_output=True, text=True, env=env)
    if started.returncode != 0:
        subprocess.run([pg, "stop", pgdir], check=False)
        sys.exit(f"tests/pg start failed: {started.stderr.strip() or started.stdout.strip()}")
    out = started.stdout
    atexit.register(lambda: subprocess.run([pg, "stop", pgdir], check=False))
    for line in out.splitlines():
        line = line.strip()
        if not line.startswith("export "):
            continue
        for assignment in shlex.split(line[len("export "):]):
            name, _, value = assignment.partition("=")
            os.environ[name] = value
    say(f"# started a throwaway PostgreSQL in {pgdir} (stopped at exit)")
    return os.environ["QUEEN_TEST_CONNINFO"]


def sweeper_conninfo(default: str) -> tuple:
    """(conninfo, role) for a sweeper: the least-privilege LOGIN role tests/pg creates
    (QUEEN_TEST_SWEEPER_CONNINFO, a member of queen_sweeper only) when it is set, else the
    given conninfo (role None)."""
    ci = os.environ.get("QUEEN_TEST_SWEEPER_CONNINFO")
    if ci:
        return ci, conninfo_fields(ci).get("user")
    return default, None


def conninfo_fields(conninfo: str) -> dict:
    """key=value pairs of a libpq conninfo string (no URIs)."""
    out = {}
    for item in shlex.split(conninfo):
        key, _, value = item.partition("=")
        out[key.strip()] = value
    return out


def apply_schema(conn, sql_dir: str = None) -> None:
    """What the plugin applies: sql/NNN_*.sql concatenated, one multi-statement execute.
    sql_dir (default bench_sql_dir(): $QUEEN_BENCH_SQL_DIR measures another build's schema,
    the "before" of a change, with QUEEN_SWEEPER_LIBRARY at that build's library)."""
    try:
        files = queenkit.sql_files(sql_dir or bench_sql_dir())
    except AssertionError as e:
        sys.exit(str(e))
    queenkit.apply_schema(conn, files)


def scalar(conn, sql: str, args=()):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        row = cur.fetchone()
        return row[0] if row else None


def execute(conn, sql: str, args=()) -> None:
    with conn.cursor() as cur:
        cur.execute(sql, args)


def server_version(conn) -> str:
    return scalar(conn, "SHOW server_version")


# ---------------------------------------------------------------------------------------
# Small measures
# ---------------------------------------------------------------------------------------

def proc_status(pid="self") -> dict:
    """VmRSS and VmHWM of a process, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def percentile(values, p: float) -> float:
    """Nearest-rank percentile (p in [0, 100]) of a non-empty sequence."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, int(round(p / 100.0 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def machine_facts() -> str:
    cores = os.cpu_count()
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    return f"{cores} cores ({model or 'unknown cpu'}), load average {load}"


def _cpu_jiffies():
    """(busy, total) jiffies of the whole machine, from the first line of /proc/stat."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user and nice
    return total - idle, total


class CpuMeter:
    """The machine's CPU while a phase runs: every process counts (the database, the sweepers
    or workers, this command, anything else on a shared machine), so it says how much of the
    machine a phase used, not what one process cost."""

    def __init__(self):
        self.busy0, self.total0 = _cpu_jiffies()
        self.t0 = time.monotonic()

    def stop(self, timers: int) -> dict:
        busy1, total1 = _cpu_jiffies()
        secs = time.monotonic() - self.t0
        hz = os.sysconf("SC_CLK_TCK")
        cores = os.cpu_count() or 1
        busy_s = (busy1 - self.busy0) / hz
        frac = (busy1 - self.busy0) / (total1 - self.total0) if total1 > self.total0 else 0.0
        return {"cores": cores, "cores_busy": frac * cores, "cpu_s": busy_s,
                "cpu_ms_per_1k": busy_s * 1e6 / timers if timers else None, "seconds": secs}


def proc_cpu() -> dict:
    """{pid: (comm, start, jiffies)}: the CPU every process now alive has used (user +
    system, all of its threads) and when it started (a pid used again is another process),
    from /proc/<pid>/stat."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                s = f.read().decode("ascii", "replace")
        except OSError:
            continue
        r = s.rfind(")")
        fields = s[r + 2:].split()
        if len(fields) < 20:
            continue
        out[int(d)] = (s[s.find("(") + 1:r], int(fields[19]), int(fields[11]) + int(fields[12]))
    return out


class CpuSplit:
    """Where a window's CPU went, by process: named groups of pids (each a set, fixed when
    the window opens), "server, other" (every other postgres process: the bench's own
    monitoring backend, autovacuum, the WAL writer, the checkpointer), "this command" and
    "the rest". What processes that came and went inside the window used is not in any
    /proc entry at its end: it is the machine's busy time less the groups' sum ("gone")."""

    def __init__(self, groups: dict):
        self.groups = {name: set(pids) for name, pids in groups.items()}
        self.before = proc_cpu()

    def stop(self, machine_busy_s: float, timers: int) -> dict:
        after = proc_cpu()
        hz = os.sysconf("SC_CLK_TCK")
        me = os.getpid()
        sums = {name: 0 for name in self.groups}
        sums.update({"server, other": 0, "this command": 0, "the rest": 0})
        for pid, (comm, start, j) in after.items():
            prev = self.before.get(pid)
            d = j - (prev[2] if prev and prev[1] == start else 0)
            name = next((n for n, pids in self.groups.items() if pid in pids), None)
            if name is None:
                name = ("this command" if pid == me else "server, other" if comm == "postgres" else "the rest")
            sums[name] += d
        out = {name: j / hz * 1e6 / timers for name, j in sums.items()} if timers else {}
        if timers:
            out["gone"] = max(0.0, machine_busy_s * 1e6 / timers - sum(out.values()))
        return out


def split_note(split: dict) -> str:
    """CPU-ms per 1,000 timers by group, largest first."""
    if not split:
        return ""
    return ", ".join(f"{name} {ms:.1f}" for name, ms in sorted(split.items(), key=lambda kv: -kv[1]))


def cpu_note(cpu: dict) -> str:
    if not cpu:
        return ""
    per = f", {cpu['cpu_ms_per_1k']:.0f} CPU-ms per 1,000" if cpu.get("cpu_ms_per_1k") else ""
    return f"{cpu['cores_busy']:.2f} of {cpu['cores']} cores busy{per}"


class Stopwatch:
    def __init__(self):
        self.t0 = time.monotonic()

    def seconds(self) -> float:
        return time.monotonic() - self.t0


# ---------------------------------------------------------------------------------------
# Shared by frontier and load: fires timed, the probe's and the claim's server time, the
# dated results file
# ---------------------------------------------------------------------------------------

class Recorder:
    """Every on_fired callback: (instant ms, partition, count, base offset)."""

    def __init__(self):
        self.events = []
        self.lock = threading.Lock()

    def __call__(self, tenant, queue, partition, count, base_offset):
        now = time.time() * 1000.0
        with self.lock:
            self.events.append((now, partition, count, base_offset))

    def take(self) -> list:
        """The events recorded since the last take (and forgets them)."""
        with self.lock:
            out, self.events = self.events, []
        return out


def stmt_snapshot(conn) -> dict:
    """{"probe"|"claim": [calls, total ms, max ms]}: the sweepers' top-level probe and claim
    calls in pg_stat_statements, cumulative since its last reset (the benchmarks' own
    statements, marked /* bench-monitor */, left out)."""
    out = {"probe": [0, 0.0, 0.0], "claim": [0, 0.0, 0.0]}
    with conn.cursor() as cur:
        cur.execute("/* bench-monitor */ SELECT query, calls, total_exec_time, max_exec_time FROM pg_stat_statements "
                    "WHERE toplevel AND (query LIKE '%log_timers_due_v%' OR query LIKE '%log_timers_claim_v%')")
        for q, calls, total, mx in cur.fetchall():
            if "bench-monitor" in q:
                continue
            k = "probe" if "due_v" in q else "claim"
            out[k][0] += calls
            out[k][1] += total
            out[k][2] = max(out[k][2], mx)
    return out


def ensure_stat_settings(conn) -> dict:
    """pg_stat_statements.track = all and track_functions = pl (ALTER SYSTEM + reload when
    not already so; tests/pg sets neither), restored at exit."""
    execute(conn, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    try:  # writing commits per 1,000 (wal_commits); optional
        execute(conn, "CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except Exception:  # noqa: BLE001
        pass
    want = {"pg_stat_statements.track": "all", "track_functions": "pl"}
    changed = {}
    for name, value in want.items():
        cur = scalar(conn, f"SHOW {name}")
        if cur != value:
            execute(conn, f"ALTER SYSTEM SET {name} = '{value}'")
            changed[name] = cur
    if changed:
        execute(conn, "SELECT pg_reload_conf()")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            probe = connect(os.environ["QUEEN_TEST_CONNINFO"])
            ok = all(scalar(probe, f"SHOW {n}") == v for n, v in want.items())
            probe.close()
            if ok:
                break
            time.sleep(0.1)

        def restore():
            try:
                c = connect(os.environ["QUEEN_TEST_CONNINFO"])
                for n in changed:
                    execute(c, f"ALTER SYSTEM RESET {n}")
                execute(c, "SELECT pg_reload_conf()")
                c.close()
            except Exception:  # noqa: BLE001 - the throwaway cluster may be gone already
                pass
        atexit.register(restore)
    return {"set_by_bench": sorted(changed), **want}


def commit_id() -> str:
    """The short commit of this tree ('?' outside a checkout), with '+changes' when a tracked
    file differs from it: read it when a run starts, not when its results are written (a
    commit made meanwhile is not what ran)."""
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    if not head:
        return "?"
    changed = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--"], capture_output=True).returncode
    return head + ("+changes" if changed == 1 else "")


def results_dir_default() -> str:
    return os.path.join(ROOT, "tests", "bench", "results")


def write_results(results_dir: str, name: str, lines: list) -> str:
    """Writes lines to <results_dir>/YYYY-MM-DD-<name>.md (the UTC date) and says where."""
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}-{name}.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    say(f"# written to {os.path.relpath(path, ROOT)}")
    return path
