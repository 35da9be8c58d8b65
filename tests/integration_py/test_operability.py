"""Operability.*: what an operator and a host see of a sweeper, against a real PostgreSQL.

- Metrics pass `promtool check metrics` on real output from a running sweeper.
- A role without privileges (SQLSTATE 42501 on every cycle) turns the health signal and
  the per-phase error counters while db_up stays 1 and cycles_total climbs.
- Readiness: ready only once the schema step succeeded and a probe completed; a failed
  apply shows not ready with the reason; wait_ready returns, times out or refuses.
- Schema version: a least-privilege role with apply_schema=true skips the DDL when the
  database already records this version; an older or newer recorded version says what
  to do.
- Silent by default no more: without a callback, warnings reach stderr (unless
  log_stderr is false), a misspelt QUEEN_SWEEPER_* variable is reported at create, and a
  sweeper switched off (QUEEN_SWEEPER=false) says so at start as a warning.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from queenkit import TENANT_A, assert_clean_stop, connect, op_schedule, unique, wait_for
from queen_sweeper import StateError, Timeout

ROOT = Path(__file__).resolve().parents[2]
# What sql/008_version.sql records (its last statement), read rather than repeated here.
SCHEMA_VERSION = int(re.search(r"VALUES \('queen-sweeper', (\d+), now\(\)\)",
                               (ROOT / "sql" / "008_version.sql").read_text()).group(1))


def metric(text: str, sample: str) -> float:
    """The value of one sample line (`name{labels}`) of a Prometheus text."""
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {sample} in the metrics:\n{text[:3000]}")


def promtool() -> str:
    """promtool (Debian's prometheus package), installed when missing."""
    path = shutil.which("promtool")
    if path:
        return path
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    proc = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"],
                          env=env, capture_output=True, text=True, check=False)
    path = shutil.which("promtool")
    assert path, f"promtool is missing and apt-get install prometheus failed:\n{proc.stdout}\n{proc.stderr}"
    return path


def with_user(conninfo: str, user: str) -> str:
    """The same keyword conninfo with another user."""
    parts = [p for p in conninfo.split() if not p.startswith("user=")]
    return " ".join(parts + [f"user={user}"])


@pytest.fixture
def bare_role(conninfo, schema):
    """A LOGIN role with no grants at all: every call of the sweeper is refused (42501)."""
    name = "queen_test_nogrants_" + uuid.uuid4().hex[:8]
    admin = connect(conninfo)
    with admin.cursor() as cur:
        cur.execute(f'CREATE ROLE "{name}" LOGIN')
    yield with_user(conninfo, name)
    with admin.cursor() as cur:
        cur.execute(f'DROP OWNED BY "{name}"')
        cur.execute(f'DROP ROLE "{name}"')
    admin.close()


@pytest.fixture
def recorded_version(conninfo, schema):
    """Set what queen.schema_info records for this project; restored afterwards."""
    admin = connect(conninfo)

    def set_to(version):
        with admin.cursor() as cur:
            cur.execute("UPDATE queen.schema_info SET version = %s WHERE component = 'queen-sweeper'",
                        (version,))
            assert cur.rowcount == 1, "queen.schema_info has no queen-sweeper row"

    yield set_to
    set_to(SCHEMA_VERSION)
    admin.close()


def test_metrics_pass_promtool_on_a_running_sweeper(sweepers, q):
    h = sweepers(unique("prom"))
    h.sw.start()
    h.sw.wait_ready(60)
    queue = unique("promq")
    q.schedule([op_schedule(queue, f"k{i}", b"x", delay_ms=0) for i in range(20)])
    h.sw.wake(0)
    wait_for(lambda: h.stats()["fired_total"] >= 20, 60, 0.05, "20 timers fired")
    text = h.sw.metrics()
    assert metric(text, "queen_sweeper_fire_lag_seconds_count") >= 20
    assert metric(text, "queen_sweeper_healthy") == 1, h.stats()
    assert metric(text, "queen_sweeper_ready") == 1
    assert metric(text, "queen_sweeper_fired_total") >= 20
    proc = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                          check=False)
    # promtool prints lint findings (HELP/TYPE, units, _total) and exits non-zero on any.
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        f"promtool check metrics failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    assert_clean_stop(h)


def test_role_without_privileges_turns_the_health_signal(sweepers, bare_role):
    h = sweepers(unique("nogrants"), conninfo=bare_role, apply_schema=False)
    h.sw.start()
    # Every cycle fails with 42501 while the database itself is up.
    wait_for(lambda: h.stats()["consecutive_failed_cycles"] >= 3, 60, 0.05, "three failed cycles in a row")
    st = h.stats()
    text = h.sw.metrics()
    assert metric(text, "queen_sweeper_db_up") == 1, st["pool"]
    assert metric(text, "queen_sweeper_cycles_total") >= 3
    assert metric(text, "queen_sweeper_healthy") == 0
    assert metric(text, "queen_sweeper_consecutive_failed_cycles") >= 3
    assert metric(text, 'queen_sweeper_errors_total{phase="fire",class="config"}') >= 3
    assert metric(text, 'queen_sweeper_errors_total{phase="fire",class="transient"}') == 0
    assert metric(text, "queen_sweeper_ready") == 0
    assert st["healthy"] is False and st["ready"] is False
    assert "42501" in st["ready_reason"], st["ready_reason"]
    assert st["phase_errors"]["fire"]["config"] >= 3
    with pytest.raises(Timeout, match="42501"):
        h.sw.wait_ready(0.2)
    assert_clean_stop(h)


def test_failed_apply_is_not_ready_and_says_why(sweepers, bare_role):
    h = sweepers(unique("applyfail"), conninfo=bare_role, apply_schema=True)
    h.sw.start()
    wait_for(lambda: h.stats()["schema"]["state"] == "failed", 60, 0.05, "the schema apply to fail")
    st = h.stats()
    assert st["ready"] is False
    assert "schema apply failed" in st["ready_reason"] and "42501" in st["ready_reason"], st["ready_reason"]
    # probes_total rises all the same: that is why hosts must not poll it for readiness.
    wait_for(lambda: h.stats()["probes_total"] >= 1, 30, 0.05, "a probe")
    assert h.stats()["ready"] is False
    assert metric(h.sw.metrics(), 'queen_sweeper_errors_total{phase="schema",class="config"}') >= 1
    with pytest.raises(Timeout, match="schema apply failed"):
        h.sw.wait_ready(0.2)
    assert_clean_stop(h)
    with pytest.raises(StateError):
        h.sw.wait_ready(0.01)


def test_least_privilege_role_with_apply_schema_skips_the_ddl(sweepers):
    sweeper_conninfo = os.environ.get("QUEEN_TEST_SWEEPER_CONNINFO")
    assert sweeper_conninfo, "QUEEN_TEST_SWEEPER_CONNINFO is not set (tests/pg start exports it)"
    h = sweepers(unique("leastpriv"), conninfo=sweeper_conninfo, apply_schema=True)
    h.sw.start()
    h.sw.wait_ready(60)
    st = h.stats()
    assert st["schema"] == {"state": "skipped", "version_expected": SCHEMA_VERSION,
                            "version_database": SCHEMA_VERSION}, st["schema"]
    assert st["phase_errors"]["schema"] == {"transient": 0, "config": 0, "permanent": 0, "provider": 0,
                                         "internal": 0}
    assert any("DDL skipped" in m for _t, _l, m in h.logs), h.log_text()
    assert_clean_stop(h)


def test_an_older_recorded_version_says_what_to_do_until_it_is_current(sweepers, recorded_version):
    recorded_version(SCHEMA_VERSION - 1)
    h = sweepers(unique("older"), apply_schema=False)
    h.sw.start()
    wait_for(lambda: h.stats()["schema"]["state"] == "older", 30, 0.05, "the version check")
    st = h.stats()
    assert st["ready"] is False
    reason = st["ready_reason"]
    assert f"version {SCHEMA_VERSION - 1}, older than this library's {SCHEMA_VERSION}" in reason, reason
    assert "apply_schema=true" in reason and "sql/" in reason, reason
    assert any(lvl == 1 and "older than this library" in m for _t, lvl, m in h.logs), h.log_text()
    # The operator upgrades the schema: the sweeper looks again and becomes ready.
    recorded_version(SCHEMA_VERSION)
    h.sw.wait_ready(60)
    assert h.stats()["schema"]["state"] == "current"
    assert_clean_stop(h)


def test_a_newer_recorded_version_is_never_downgraded(sweepers, recorded_version, q):
    recorded_version(SCHEMA_VERSION + 1)
    h = sweepers(unique("newer"), apply_schema=True)
    h.sw.start()
    h.sw.wait_ready(60)
    st = h.stats()
    assert st["schema"]["state"] == "newer" and st["schema"]["version_database"] == SCHEMA_VERSION + 1
    # The DDL did not run: the newer version is still what the database records.
    assert q.one("SELECT queen.schema_version_v1()") == SCHEMA_VERSION + 1
    assert any(lvl == 1 and "newer than this library" in m for _t, lvl, m in h.logs), h.log_text()
    assert_clean_stop(h)


# -- stderr by default -------------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import json, sys, time
    from queen_sweeper import Sweeper
    cfg = json.loads(sys.argv[1])
    sw = Sweeper(**cfg)
    print("created", flush=True)
    if cfg.get("conninfo"):
        sw.start()
        deadline = time.monotonic() + 30
        while sw.stats()["cycle_errors_total"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        print("errors", sw.stats()["cycle_errors_total"], flush=True)
    print("warnings", json.dumps(sw.stats()["config_warnings"]), flush=True)
    sw.close()
""")


def run_child(config: dict, extra_env: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(extra_env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bindings" / "python"), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", _CHILD, json.dumps(config)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_without_a_callback_warnings_go_to_stderr_unless_turned_off(conninfo, schema):
    missing_db = conninfo + " dbname=queen_no_such_database"
    cfg = {"conninfo": missing_db, "read_env": False, "connect_timeout_ms": 1000}
    loud = run_child(cfg, {})
    assert loud.returncode == 0, loud.stderr
    assert "errors" in loud.stdout, loud.stdout
    assert re.search(r"^queen_sweeper (warning|error): .*queen_no_such_database", loud.stderr, re.M), loud.stderr
    quiet = run_child(dict(cfg, log_stderr=False), {})
    assert quiet.returncode == 0, quiet.stderr
    assert "errors" in quiet.stdout, quiet.stdout
    assert "queen_sweeper" not in quiet.stderr, quiet.stderr


def test_a_misspelt_variable_is_reported_at_create(conninfo):
    env = {"QUEEN_SWEEPER_MIN_SLEEP": "5", "QUEEN_KV_EXPIRE_BATCHH": "10",
           "QUEEN_EPHEMERAL_SOMETHING": "1", "QUEEN_TEST_SOMETHING": "1", "QUEEN_HOST_OWN_SETTING": "1"}
    child = run_child({}, env)  # read_env defaults to true; no start needed
    assert child.returncode == 0, child.stderr
    warnings = json.loads(child.stdout.split("warnings ", 1)[1])
    text = "\n".join(warnings)
    assert "QUEEN_SWEEPER_MIN_SLEEP is not a sweeper setting" in text, text
    assert "did you mean QUEEN_SWEEPER_MIN_SLEEP_MS?" in text, text
    assert "QUEEN_KV_EXPIRE_BATCHH is not a sweeper setting" in text, text
    for foreign in ("QUEEN_EPHEMERAL_SOMETHING", "QUEEN_TEST_SOMETHING", "QUEEN_HOST_OWN_SETTING",
                    "QUEEN_TEST_CONNINFO", "QUEEN_SWEEPER_LIBRARY"):
        assert foreign not in text, text
    # At create, before any callback could be set: on stderr.
    assert "queen_sweeper warning: environment variable QUEEN_SWEEPER_MIN_SLEEP" in child.stderr, child.stderr


_DISABLED_CHILD = textwrap.dedent("""
    import json, sys
    from queen_sweeper import Sweeper
    sw = Sweeper(**json.loads(sys.argv[1]))
    if len(sys.argv) > 2:
        sw.on_log(lambda level, msg: print("log", level, msg, flush=True))
    sw.start()
    print("state", sw.stats()["state"], flush=True)
    sw.close()
""")


def test_a_sweeper_switched_off_says_so_as_a_warning(conninfo):
    """QUEEN_SWEEPER=false means timers do not fire from this process: an operator must see it
    even on a host that installed no log callback (stderr gets warnings and errors only),
    and a host whose callback listens to warnings only."""
    env = dict(os.environ, QUEEN_SWEEPER="false")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bindings" / "python"), env.get("PYTHONPATH", "")])
    cfg = {"conninfo": conninfo}   # read_env defaults to true: the variable counts
    bare = subprocess.run([sys.executable, "-c", _DISABLED_CHILD, json.dumps(cfg)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert bare.returncode == 0, bare.stderr
    assert "state disabled" in bare.stdout, bare.stdout
    assert re.search(r"^queen_sweeper warning: sweeper disabled by configuration .*timers will not fire",
                     bare.stderr, re.M), bare.stderr
    heard = subprocess.run([sys.executable, "-c", _DISABLED_CHILD, json.dumps(dict(cfg, log_level="warn")),
                            "callback"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert heard.returncode == 0, heard.stderr
    assert re.search(r"^log 1 sweeper disabled by configuration", heard.stdout, re.M), heard.stdout


# -- a healthy first start ----------------------------------------------------------------

@pytest.fixture
def fresh_database(conninfo):
    """A database of its own with nothing in it (no schema queen), as a new deployment has;
    dropped at teardown."""
    name = "queen_fresh_" + uuid.uuid4().hex[:8]
    admin = connect(conninfo)
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    parts = [p for p in conninfo.split() if not p.startswith("dbname=")]
    yield " ".join(parts + [f"dbname={name}"])
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


def test_a_healthy_first_start_counts_no_failed_call(sweepers, fresh_database):
    """apply_schema on a fresh database: the version check finds no schema (3F000), which is
    the answer it asked for, not a failure. No failed call, no error, healthy: an alert on
    pool_calls_failed_total must not fire on every new deployment."""
    h = sweepers(unique("fresh"), conninfo=fresh_database, apply_schema=True)
    h.sw.start()
    h.sw.wait_ready(60)
    wait_for(lambda: h.stats()["cycles_total"] >= 3, 30, 0.05, "three cycles after the apply")
    st = h.stats()
    text = h.sw.metrics()
    print(f"\n[first start] schema {st['schema']}, pool calls {st['pool']['calls_total']}, "
          f"failed {st['pool']['calls_failed_total']}, cycle errors {st['cycle_errors_total']}")
    assert st["schema"]["state"] == "applied", st["schema"]
    assert st["schema"]["version_database"] == SCHEMA_VERSION
    assert st["pool"]["calls_failed_total"] == 0, st["pool"]
    assert metric(text, "queen_sweeper_pool_calls_failed_total") == 0
    assert st["cycle_errors_total"] == 0 and st["last_error"] == "", st["last_error"]
    assert st["healthy"] is True and metric(text, "queen_sweeper_healthy") == 1
    assert all(n == 0 for per in st["phase_errors"].values() for n in per.values()), st["phase_errors"]
    assert_clean_stop(h)


# -- readiness after a rough start --------------------------------------------------------

@pytest.fixture
def refused_role(conninfo, schema):
    """A LOGIN role holding queen_sweeper whose every connection the server refuses at first
    (CONNECTION LIMIT 0: SQLSTATE 53300 at connect, what a server with every slot taken
    answers), and a function that lets it in."""
    name = "queen_test_full_" + uuid.uuid4().hex[:8]
    admin = connect(conninfo)
    with admin.cursor() as cur:
        cur.execute(f'CREATE ROLE "{name}" LOGIN CONNECTION LIMIT 0 IN ROLE queen_sweeper')

    def let_in():
        with admin.cursor() as cur:
            cur.execute(f'ALTER ROLE "{name}" CONNECTION LIMIT -1')

    yield with_user(conninfo, name), let_in
    with admin.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        cur.execute(f'DROP ROLE "{name}"')
    admin.close()


def test_ready_follows_the_first_cycle_that_succeeds_after_a_rough_start(sweepers, refused_role, q):
    """Every connection refused at start: the schema-version check and the probes fail. Once
    the server lets the sweeper in, the first cycle that succeeds fires the timers, and ready
    turns with it, not seconds later when a 5 s re-check of the schema comes round."""
    conninfo, let_in = refused_role
    h = sweepers(unique("rough"), conninfo=conninfo, sweeper_transient_backoff_ms=100)
    h.sw.start()
    wait_for(lambda: h.stats()["db_state"] == "down", 30, 0.02, 'db_state "down"')
    queue = unique("roughq")
    q.schedule([op_schedule(queue, f"k{i}", b"x", delay_ms=0) for i in range(5)])
    time.sleep(1.0)
    st = h.stats()
    assert st["ready"] is False and st["fired_total"] == 0, st["ready_reason"]
    let_in()
    t0 = time.monotonic()
    fired_at = ready_at = None
    while time.monotonic() < t0 + 30 and (fired_at is None or ready_at is None):
        st = h.stats()
        now = time.monotonic()
        if fired_at is None and st["fired_total"] >= 1:
            fired_at = now
        if ready_at is None and st["ready"]:
            ready_at = now
        time.sleep(0.005)
    assert fired_at is not None and ready_at is not None, (fired_at, ready_at, h.stats()["ready_reason"])
    print(f"\n[rough start] after the server let the sweeper in: first fire at {fired_at - t0:.2f} s, "
          f"ready at {ready_at - t0:.2f} s ({(ready_at - fired_at) * 1000:+.0f} ms from the fire)")
    wait_for(lambda: h.stats()["fired_total"] == 5, 30, 0.02, "every timer fired")
    assert ready_at - fired_at < 0.5, f"ready {ready_at - fired_at:.2f} s after the first fire"
    assert h.stats()["schema"]["state"] == "current"
    h.sw.wait_ready(1)
    assert_clean_stop(h)
