"""SQL versioned at releases (sql/README.md, "Versions"; docs: DESIGN "SQL is versioned at
releases"). What holds:

- sql/006_compat.sql holds only wrappers: each function there is one SQL statement calling
  one function defined outside it (a current body), and it holds only names a release
  shipped (the 1.0.0 copy in tests/upgrade/v1/), with their released signatures and result
  types;
- every function a release shipped is still callable with its released signature, except
  the internal helpers named below (granted to nobody, never a caller's contract);
- every statement the library sends (src/pg/statements.hpp) names a function that exists,
  is defined outside the compatibility file, and is the highest version of its family;
- nothing superseded lives outside the compatibility file: outside it, one version per
  family;
- one schema version per distinct schema: the statements of sql/*.sql (comments and
  whitespace aside) hash to the digest recorded for SCHEMA_VERSION in schema_digests.txt,
  and no two versions record the same digest. A change to the schema without a new version
  fails here (schema version 12 was recorded by two different schemas once, and an apply
  that saw 12 skipped DDL it needed).
"""

import glob
import hashlib
import os
import re
import uuid

import psycopg2

from queenkit import ROOT, SQL_DIR, sql_files
from sqlkit import SCHEMA_VERSION

COMPAT = os.path.join(SQL_DIR, "006_compat.sql")
RELEASED_1_0_0 = os.path.join(ROOT, "tests", "upgrade", "v1")
DIGESTS = os.path.join(os.path.dirname(__file__), "schema_digests.txt")
# 1.0.0's internal helper whose name the current schema keeps as the guard against a 1.0.0
# apply (sql/001_log.sql): same arguments, another result type. Never granted, never called
# by anything but 1.0.0's own bodies.
GUARD_1_0_0 = "log_append_v1"
FN_RE = re.compile(r"CREATE OR REPLACE FUNCTION (queen\.\w+)\s*\(", re.I)


def functions_in(path):
    with open(path, encoding="utf-8") as f:
        return {m.group(1).split(".")[1] for m in FN_RE.finditer(f.read())}


def family(name):
    m = re.fullmatch(r"(.+)_v(\d+)", name)
    assert m, "%s has no _vN suffix" % name
    return m.group(1), int(m.group(2))


def current_functions():
    out = set()
    for f in sql_files():
        if f != COMPAT:
            out |= functions_in(f)
    return out


def strip_comments(text):
    return re.sub(r"--[^\n]*", "", text)


def test_the_compat_file_holds_only_one_statement_wrappers_of_current_bodies(q):
    with open(COMPAT, encoding="utf-8") as f:
        text = strip_comments(f.read())
    wrappers = functions_in(COMPAT)
    assert wrappers, "006_compat.sql defines no function"
    current = current_functions()
    # Every statement is a wrapper or the file's boilerplate (schema, apply mutex, the switch
    # that lets 005's wrapper be created without 005).
    statements = [s.strip() for s in re.split(r";\s*\n", re.sub(r"\$fn\$.*?\$fn\$", "$fn$$fn$", text, flags=re.S))
                  if s.strip()]
    allowed = (r"CREATE SCHEMA IF NOT EXISTS queen", r"CREATE TABLE IF NOT EXISTS queen\.schema_apply\b",
               r"INSERT INTO queen\.schema_apply\b", r"SET check_function_bodies = off$",
               r"RESET check_function_bodies$", r"CREATE OR REPLACE FUNCTION queen\.\w+\(")
    for s in statements:
        assert any(re.match(a, s) for a in allowed), "not a wrapper nor boilerplate: %s" % s[:120]
    rows = q.all("SELECT p.proname, l.lanname, p.prosrc FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
                 " WHERE p.pronamespace = 'queen'::regnamespace AND p.proname = ANY (%s)", (sorted(wrappers),))
    assert sorted(r["proname"] for r in rows) == sorted(wrappers)
    for r in rows:
        assert r["lanname"] == "sql", r["proname"]
        body = r["prosrc"].strip()
        assert ";" not in body.rstrip(";"), "%s: more than one statement" % r["proname"]
        assert re.match(r"SELECT\b", body), r["proname"]
        called = set(re.findall(r"queen\.(\w+)\s*\(", body))
        assert len(called) == 1, (r["proname"], called)
        callee = called.pop()
        assert callee in current, "%s wraps %s, which is not a current body" % (r["proname"], callee)
        assert family(callee)[0] == family(r["proname"])[0] and family(callee)[1] > family(r["proname"])[1], \
            (r["proname"], callee)


def released_signatures(connections, directory):
    """name -> (identity arguments, result) of every function the release's files create,
    read from a scratch database they are applied to."""
    admin = connections()
    admin.autocommit = True
    name = "released_%s" % uuid.uuid4().hex[:12]
    with admin.cursor() as cur:
        cur.execute("CREATE DATABASE %s" % name)
    try:
        dsn = admin.get_dsn_parameters()
        conn = psycopg2.connect(host=dsn.get("host"), port=dsn.get("port"), user=dsn.get("user"), dbname=name)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                for f in sorted(glob.glob(os.path.join(directory, "[0-9][0-9][0-9]_*.sql"))):
                    with open(f, encoding="utf-8") as fh:
                        cur.execute(fh.read())
                return signatures(cur)
        finally:
            conn.close()
    finally:
        with admin.cursor() as cur:
            cur.execute("DROP DATABASE %s" % name)


def signatures(cur):
    cur.execute("SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid)"
                " FROM pg_proc p WHERE p.pronamespace = 'queen'::regnamespace")
    return {r[0]: (r[1], r[2]) for r in cur.fetchall()}


def test_what_1_0_0_shipped_is_callable_with_its_signature_and_the_compat_file_holds_only_that(q, connections):
    released = released_signatures(connections, RELEASED_1_0_0)
    assert "log_timers_claim_v1" in released and "log_timers_fire_v1" in released
    with q.conn.cursor() as cur:
        now = signatures(cur)
    for fn, sig in sorted(released.items()):
        if fn == GUARD_1_0_0:
            # Its input arguments (1.0.0's identity lists its OUT ones too) and not its result.
            assert now[fn][0] == re.sub(r", OUT [^,]+", "", sig[0]) and now[fn][1] != sig[1], \
                (fn, sig, now.get(fn))
            continue
        assert fn in now, "1.0.0 shipped %s; it is gone" % fn
        assert now[fn] == sig, (fn, sig, now[fn])
    assert functions_in(COMPAT) <= set(released), functions_in(COMPAT) - set(released)


def test_a_1_0_0_apply_on_the_current_schema_fails_whole_and_changes_nothing(q, connections):
    """1.0.0 applies its embedded files (tests/upgrade/v1/, concatenated, one implicit
    transaction) at every start with apply_schema on: on this schema that apply fails on the
    guard (42P13) and leaves every body as it was."""
    def bodies():
        return q.all("SELECT p.oid::regprocedure::text AS fn, md5(p.prosrc) AS src, p.prolang FROM pg_proc p"
                     " WHERE p.pronamespace = 'queen'::regnamespace ORDER BY 1")
    before = bodies()
    text = "\n".join(open(f, encoding="utf-8").read()
                     for f in sorted(glob.glob(os.path.join(RELEASED_1_0_0, "[0-9][0-9][0-9]_*.sql"))))
    conn = connections()
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(text)
        raise AssertionError("the 1.0.0 apply went through")
    except psycopg2.Error as e:
        assert e.pgcode == "42P13" and "log_append_v1" in str(e), (e.pgcode, str(e))
    assert bodies() == before


def test_every_function_the_library_calls_exists_and_is_current(q):
    with open(os.path.join(ROOT, "src", "pg", "statements.hpp"), encoding="utf-8") as f:
        named = set(re.findall(r"queen\.(\w+)\(", f.read()))
    assert "log_timers_claim_v4" in named and len(named) >= 10, named
    current = current_functions()
    existing = {r["proname"] for r in q.all("SELECT proname FROM pg_proc WHERE pronamespace = 'queen'::regnamespace")}
    for fn in sorted(named):
        assert fn in existing, fn
        assert fn in current, "%s is called by the library but lives only in 006_compat.sql" % fn
        fam, n = family(fn)
        higher = [c for c in existing if family(c)[0] == fam and family(c)[1] > n]
        assert not higher, "%s is superseded by %s" % (fn, higher)


def test_nothing_superseded_lives_outside_the_compat_file(q):
    current = current_functions()
    by_family = {}
    for fn in current:
        by_family.setdefault(family(fn)[0], []).append(fn)
    several = {f: sorted(v) for f, v in by_family.items() if len(v) > 1}
    assert several == {}, several
    # And the database holds nothing else: no function of an earlier build left behind.
    existing = {r["proname"] for r in q.all("SELECT proname FROM pg_proc WHERE pronamespace = 'queen'::regnamespace")}
    assert existing == current | functions_in(COMPAT), existing ^ (current | functions_in(COMPAT))


def schema_digest():
    parts = []
    for f in sql_files():
        with open(f, encoding="utf-8") as fh:
            text = strip_comments(fh.read())
        if f.endswith("_version.sql"):
            # The version's own number is what the digest is recorded against.
            text = re.sub(r"VALUES \('queen-sweeper', \d+, now\(\)\)", "VALUES ('queen-sweeper', N, now())", text)
        parts.append(os.path.basename(f) + "\n" + " ".join(text.split()))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def test_one_schema_version_per_distinct_schema():
    with open(DIGESTS, encoding="utf-8") as f:
        recorded = [line.split() for line in f if line.strip() and not line.startswith("#")]
    versions = [int(v) for v, _ in recorded]
    digests = [d for _, d in recorded]
    assert len(set(versions)) == len(versions) and len(set(digests)) == len(digests), recorded
    assert versions == sorted(versions)
    got = schema_digest()
    mine = dict((int(v), d) for v, d in recorded).get(SCHEMA_VERSION)
    assert mine is not None, "schema version %d has no digest in %s" % (SCHEMA_VERSION, DIGESTS)
    assert got == mine, (
        "sql/ changed since schema version %d was recorded: bump the version (008_version.sql and "
        "kSchemaVersion) and add '<version> %s' to %s" % (SCHEMA_VERSION, got, DIGESTS))
