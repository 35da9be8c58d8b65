"""Session settings imposed by the role or the database (issue 8, items 5 and 6).

A role or database default changes what a session reads and how it behaves: bytea_output
'escape' once emptied every fired payload without an error, client_encoding LATIN1 changed
txn bytes (and so the dedup identity) and stalled the fire on a txn it cannot represent.
Every setting the plugin depends on is pinned per transaction (SET LOCAL inside the pinned
pipeline; client_encoding in the startup packet), so each of them set as a role default
must leave the fire byte-exact: every payload and every txn as scheduled, exactly once.

The roles here are superusers on purpose: these tests are about settings, not privileges
(the least-privilege suites are elsewhere), and a superuser role is the one that could have
overridden anything."""

import time
import uuid

import psycopg2
import pytest

from firekit import (TENANT_A, FiredLog, Queen, assert_clean_stop, connect, op_schedule,
                     txn_hash, wait_for)

# Each (setting, value) is a role default a careless operator or a hostile DBA could set.
ROLE_SETTINGS = [
    ("bytea_output", "escape"),
    ("client_encoding", "LATIN1"),
    ("DateStyle", "SQL, DMY"),
    ("IntervalStyle", "sql_standard"),
    ("TimeZone", "Pacific/Chatham"),
    ("extra_float_digits", "-15"),
    ("search_path", "hostile, public"),
    ("standard_conforming_strings", "off"),
    ("default_transaction_isolation", "serializable"),
    ("default_transaction_read_only", "on"),
    ("lock_timeout", "1"),
    ("idle_in_transaction_session_timeout", "1"),
    ("row_security", "off"),
]

N = 60
QUEUE = "settings"


def _payload(i):
    # Every byte value, backslashes and quotes included: escape output mangles these.
    return bytes(range(256)) + f"#{i}\\'\"".encode()


def _txn(i):
    # Not representable in LATIN1 (the euro sign and a CJK character): a LATIN1 session
    # cannot send these back unchanged.
    return f"txn-€-漢-{i:03d}"


def _role_conninfo(base, role):
    parts = [p for p in base.split() if not p.startswith("user=")]
    return " ".join(parts + [f"user={role}"])


@pytest.fixture
def role_with(conninfo, connections):
    made = []

    def make(setting, value):
        role = "qsw_set_" + uuid.uuid4().hex[:8]
        admin = connections()
        with admin.cursor() as cur:
            cur.execute(f'CREATE ROLE "{role}" LOGIN SUPERUSER')
            cur.execute(f'ALTER ROLE "{role}" SET {setting} = %s', (value,))
            # A schema the hostile search_path names, holding a trap that would shadow a
            # built-in the fire uses if the plugin's own search path were not pinned.
            cur.execute("CREATE SCHEMA IF NOT EXISTS hostile")
            cur.execute("CREATE OR REPLACE FUNCTION hostile.now() RETURNS timestamptz"
                        " LANGUAGE sql AS $$ SELECT 'infinity'::timestamptz $$")
        made.append(role)
        return _role_conninfo(conninfo, role)

    yield make
    admin = connections()
    with admin.cursor() as cur:
        for role in made:
            cur.execute(f'DROP OWNED BY "{role}"')
            cur.execute(f'DROP ROLE IF EXISTS "{role}"')
        cur.execute("DROP SCHEMA IF EXISTS hostile CASCADE")


@pytest.mark.parametrize("setting,value", ROLE_SETTINGS, ids=[s for s, _ in ROLE_SETTINGS])
def test_role_default_leaves_the_fire_byte_exact(q, sweepers, role_with, setting, value):
    ci = role_with(setting, value)
    # The role really carries the setting (so the test cannot pass vacuously). Read from
    # the catalog: psycopg2 itself overrides DateStyle and client_encoding in its sessions.
    probe = connect(ci)
    with probe.cursor() as cur:
        cur.execute("SELECT rolconfig FROM pg_roles WHERE rolname = current_user")
        config = cur.fetchone()[0] or []
    probe.close()
    assert any(c.lower().startswith(setting.lower() + "=") for c in config), (setting, config)

    ops = [op_schedule(QUEUE, f"k{i:03d}", _payload(i), partition=f"p{i % 3}", txn=_txn(i))
           for i in range(N)]
    q.schedule(ops)
    fired = FiredLog()
    h = sweepers(f"settings-{setting}", conninfo=ci, apply_schema=False, fired=fired)
    h.start()
    try:
        wait_for(lambda: q.timers_left() == 0 and fired.total() == N, 60, 0.05,
                 f"all timers fired with the role's {setting}={value}")
    except AssertionError:
        st = h.stats()
        pytest.fail(f"{setting}={value}: {q.timers_left()} left, fired {fired.total()}, "
                    f"last_error={st.get('last_error')!r} db_last_error="
                    f"{st.get('db_last_error')!r}\n" + h.log_text())
    st = assert_clean_stop(h)
    assert st["fired_total"] == N
    got = {}
    for _ten, _qn, part, _off, f in q.delivered(TENANT_A, QUEUE):
        txn = bytes(f.txn).decode("utf-8") if isinstance(f.txn, (bytes, bytearray)) else f.txn
        assert txn not in got, f"{txn} delivered twice"
        got[txn] = (part, bytes(f.payload))
    assert len(got) == N
    for i in range(N):
        part, payload = got[_txn(i)]
        assert payload == _payload(i), f"payload of timer {i} changed under {setting}={value}"
        assert part == f"p{i % 3}"
    # Dedup identity: the stored hashes are of the UTF-8 txn bytes, whatever the session.
    hashes = set()
    for row in q.log_rows(TENANT_A, QUEUE):
        h8 = row[8]
        for k in range(0, len(h8), 16):
            hashes.add(bytes(h8[k:k + 16]))
    for i in range(N):
        assert txn_hash(_txn(i).encode("utf-8")) in hashes, f"txn hash {i} under {setting}={value}"


def test_setup_failure_backs_off_is_visible_and_stop_is_bounded(q, sweepers, role_with):
    """A role statement_timeout of 1 ms makes calls fail at random; before, the pool opened
    ~97 server sessions a second with db_last_error empty and stop timed out. Now failures
    back off like failed connects, say why, and stop stays bounded."""
    ci = role_with("statement_timeout", "1")
    q.schedule([op_schedule(QUEUE, f"t{i}", b"x", txn=f"t{i}") for i in range(20)])
    h = sweepers("settings-stmt-timeout", conninfo=ci, apply_schema=False)
    h.start()
    time.sleep(5)
    st = h.stats()
    pool = st["pool"]
    print(f"\n[settings] statement_timeout=1ms: connects={pool['connects_total']} "
          f"disconnects={pool['disconnects_total']} last_error={st.get('db_last_error')!r} "
          f"fired={st['fired_total']}")
    # Four connections with a backoff of 50 ms doubling to 5 s make at most a few dozen
    # attempts in five seconds; without it the count ran into the hundreds.
    assert pool["disconnects_total"] < 150, pool
    if pool["disconnects_total"] > 0:
        assert st.get("db_last_error"), "a failing session must say why"
    t0 = time.monotonic()
    h.sw.stop(timeout_ms=2000)  # raises Timeout if the graceful stop overran
    took = time.monotonic() - t0
    print(f"[settings] stop(2000) took {took:.2f}s")
    st = h.stats()
    assert st["state"] == "stopped"
    assert st["teardown_clean"] is True
    h.sw.close()
