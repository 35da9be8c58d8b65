"""Monitoring.*: the alerting rules and the Grafana dashboard in docs/monitoring/, held
against the sweeper's real metrics.

- The rules file passes `promtool check rules`; every alert has a `for:`, a severity, a
  summary and a description, is documented in docs/operations.md, and has a case in
  queen-sweeper.rules.test.yml where it fires and one where it stays silent (the cases
  themselves run with `promtool test rules`, a step of tests/run).
- The dashboard is well formed (unique ids, panels inside the 24-column grid, every query
  on the dashboard's data source variable) and shows every figure the rules alert on.
- Against a running sweeper (the Python binding, the database tests/run starts): every
  metric name, and every label value a selector matches, that the rules and the dashboard
  use is in the sweeper's metrics text, so renaming a family or a label value fails here.
- A real Prometheus (Debian's package) scrapes a healthy sweeper and one whose role has no
  grants, and evaluates the rules every second: every rule evaluates without error, the
  healthy broker raises no alert, the broken one exactly the three it should (pending:
  their `for:` has not passed), and every dashboard query answers with data.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from queenkit import connect, op_schedule, unique, wait_for

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "monitoring" / "queen-sweeper.rules.yml"
DASHBOARD = ROOT / "docs" / "monitoring" / "grafana-dashboard.json"
RULE_TESTS = Path(__file__).resolve().parent / "queen-sweeper.rules.test.yml"
OPERATIONS = ROOT / "docs" / "operations.md"
METRIC = re.compile(r"\bqueen_sweeper_[a-z0-9_]+")
SELECTOR = re.compile(r"\b(queen_sweeper_[a-z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
SEVERITIES = {"critical", "warning", "info"}
# The alerts a sweeper whose role holds no grant raises at once: its cycles fail (42501),
# it cannot read the schema's version, and the prune and the rollup turn off (class 42).
BROKEN_ALERTS = {"QueenSweeperUnhealthy", "QueenSweeperSchemaBehind", "QueenSweeperPhaseOffConfig"}


def tool(name: str) -> str:
    """promtool or prometheus (Debian's prometheus package, which tests/run installs)."""
    path = shutil.which(name)
    assert path, f"{name} not found: apt-get install prometheus"
    return path


# ---------------------------------------------------------------------------------------
# The two files, read without a YAML library: the rules file keeps one layout (an alert
# per `      - alert:` line, its fields indented below it).
# ---------------------------------------------------------------------------------------

def rule_blocks() -> dict[str, str]:
    """alert name -> the text of its rule (comment lines dropped)."""
    lines = [ln for ln in RULES.read_text().splitlines() if not ln.lstrip().startswith("#")]
    blocks: dict[str, list[str]] = {}
    current = None
    for ln in lines:
        m = re.match(r"^      - alert: (\S+)\s*$", ln)
        if m:
            current = m.group(1)
            assert current not in blocks, f"alert {current} defined twice"
            blocks[current] = []
        elif re.match(r"^  - name:", ln):
            current = None
        elif current:
            blocks[current].append(ln)
    assert blocks, f"no alert found in {RULES}"
    return {name: "\n".join(body) for name, body in blocks.items()}


def rule_expr(block: str) -> str:
    """The PromQL of one rule (inline or a `|` block)."""
    lines = block.splitlines()
    for i, ln in enumerate(lines):
        m = re.match(r"^(\s*)expr:\s*(.*)$", ln)
        if not m:
            continue
        if m.group(2).strip() not in ("|", ">", "|-", ">-"):
            return m.group(2)
        indent = len(m.group(1))
        body = []
        for nxt in lines[i + 1:]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            body.append(nxt)
        return "\n".join(body)
    raise AssertionError(f"no expr in rule:\n{block}")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> list[dict]:
    out = []
    for p in dashboard()["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # a collapsed row holds its panels
    return out


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p.get("targets", [])]


def dashboard_variable_queries() -> list[str]:
    out = []
    for v in dashboard()["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]
            out.append(q["query"] if isinstance(q, dict) else q)
    return out


def concrete(expr: str) -> str:
    """A dashboard query as Prometheus would get it from Grafana with every broker chosen."""
    return (expr.replace("$__rate_interval", "1m").replace('"$job"', '"queen-sweeper"')
            .replace('"$instance"', '".*"'))


def names_in(text: str) -> set[str]:
    return set(METRIC.findall(text))


def label_values_in(text: str) -> set[tuple[str, str, str]]:
    """(metric, label, value) for every equality or alternation matcher on a literal value
    (the dashboard's $job / $instance variables and regexes are left out)."""
    out = set()
    for name, inside in SELECTOR.findall(text):
        for label, op, value in MATCHER.findall(inside):
            if op not in ("=", "=~") or "$" in value or label in ("job", "instance"):
                continue
            for v in value.split("|") if op == "=~" else [value]:
                assert re.fullmatch(r"[\w+.-]+", v), f"{name}{{{inside}}}: only plain alternations here"
                out.add((name, label, v))
    return out


def rules_text_without_comments() -> str:
    return "\n".join(ln for ln in RULES.read_text().splitlines() if not ln.lstrip().startswith("#"))


# ---------------------------------------------------------------------------------------
# Static checks (no database)
# ---------------------------------------------------------------------------------------

def test_rules_pass_promtool_check():
    proc = subprocess.run([tool("promtool"), "check", "rules", str(RULES)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rule_blocks())} rules found" in proc.stdout, proc.stdout


def test_every_alert_has_a_for_a_severity_and_annotations_and_is_documented():
    ops = OPERATIONS.read_text()
    section = ops.split("## Alerts and dashboard", 1)
    assert len(section) == 2, "docs/operations.md has no section 'Alerts and dashboard'"
    for name, block in rule_blocks().items():
        m = re.search(r"^\s*for:\s*(\d+)([smh])\s*$", block, re.M)
        assert m and int(m.group(1)) > 0, f"{name}: no positive for: (it would flap)"
        sev = re.search(r"^\s*severity:\s*(\S+)\s*$", block, re.M)
        assert sev and sev.group(1) in SEVERITIES, f"{name}: severity must be one of {SEVERITIES}"
        for field in ("summary", "description"):
            assert re.search(rf"^\s*{field}:\s*\S", block, re.M), f"{name}: no {field} annotation"
        assert f"`{name}`" in section[1], f"{name} is not described in docs/operations.md"


def test_every_alert_has_a_unit_test_that_fires_and_one_that_stays_silent():
    """queen-sweeper.rules.test.yml names each evaluation as `alertname: X` followed by
    `exp_alerts: []` (silent) or `exp_alerts:` and a list (fires)."""
    lines = RULE_TESTS.read_text().splitlines()
    fires: set[str] = set()
    silent: set[str] = set()
    for i, ln in enumerate(lines):
        m = re.match(r"^\s*alertname:\s*(\S+)\s*$", ln)
        if not m:
            continue
        exp = lines[i + 1].strip()
        if exp == "exp_alerts: []":
            silent.add(m.group(1))
        elif exp == "exp_alerts:" and lines[i + 2].strip().startswith("- exp_labels:"):
            fires.add(m.group(1))
        else:
            raise AssertionError(f"line {i + 2} of {RULE_TESTS.name}: expected exp_alerts after alertname")
    alerts = set(rule_blocks())
    assert not alerts - fires, f"alerts with no case where they fire: {sorted(alerts - fires)}"
    assert not alerts - silent, f"alerts with no case where they stay silent: {sorted(alerts - silent)}"
    assert not (fires | silent) - alerts, f"cases for unknown alerts: {sorted((fires | silent) - alerts)}"


def test_dashboard_is_well_formed():
    d = dashboard()
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 30
    variables = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= variables, variables
    ids = [p["id"] for p in dashboard_panels()]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    cells: dict[tuple[int, int], str] = {}
    for p in dashboard_panels():
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, (p["title"], g)
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panels {cells[(x, y)]!r} and {p['title']!r} overlap"
                cells[(x, y)] = p["title"]
        if p["type"] == "row":
            continue
        assert p.get("description"), f"panel {p['title']!r} has no description"
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            assert 'job=~"$job"' in t["expr"] and 'instance=~"$instance"' in t["expr"], (
                f"panel {p['title']!r}: every query follows the job and broker variables: {t['expr']}")


def test_dashboard_queries_pass_promtool():
    """Every dashboard query, as Grafana sends it, is valid PromQL: promtool checks them
    as recording rules."""
    exprs = [concrete(e) for e in dashboard_exprs()]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        json.dump(rules, f)  # JSON is YAML
        f.flush()
        proc = subprocess.run([tool("promtool"), "check", "rules", f.name], capture_output=True,
                              text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboard_shows_every_figure_the_rules_alert_on():
    alerted = set()
    for block in rule_blocks().values():
        alerted |= names_in(rule_expr(block))
    shown = set()
    for e in dashboard_exprs():
        shown |= names_in(e)
    assert not alerted - shown, f"alerted on but not on the dashboard: {sorted(alerted - shown)}"


# ---------------------------------------------------------------------------------------
# Against a running sweeper
# ---------------------------------------------------------------------------------------

def parse_exposition(text: str) -> tuple[set[str], set[tuple[str, str, str]]]:
    """Sample names, and (name, label, value) of every sample, of a Prometheus text."""
    names, labelled = set(), set()
    for ln in text.splitlines():
        if not ln or ln.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ", ln)
        assert m, f"not a sample line: {ln!r}"
        names.add(m.group(1))
        for label, value in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""):
            labelled.add((m.group(1), label, value))
    return names, labelled


def wait_healthy(h, timeout=60):
    wait_for(lambda: h.stats()["healthy"], timeout, 0.05, f"{h.name} healthy")


@pytest.fixture
def healthy_sweeper(sweepers, q):
    """A running, ready sweeper that has fired a few timers (its lag histogram has counts)."""
    h = sweepers(unique("mon"))
    h.sw.start()
    h.sw.wait_ready(60)
    queue = unique("monq")
    q.schedule([op_schedule(queue, f"k{i}", b"x", delay_ms=0) for i in range(10)])
    h.sw.wake(0)
    wait_for(lambda: h.stats()["fired_total"] >= 10, 60, 0.05, "10 timers fired")
    wait_healthy(h)
    yield h
    h.sw.stop()


@pytest.fixture
def broken_sweeper(sweepers, conninfo, schema):
    """A running sweeper logged in as a role with no grants at all: every call is refused
    (42501) while the database is up."""
    role = "queen_test_mon_nogrants_" + uuid.uuid4().hex[:8]
    admin = connect(conninfo)
    with admin.cursor() as cur:
        cur.execute(f'CREATE ROLE "{role}" LOGIN')
    parts = [p for p in conninfo.split() if not p.startswith("user=")]
    h = sweepers(unique("mon-broken"), conninfo=" ".join(parts + [f"user={role}"]))
    h.sw.start()
    wait_for(lambda: h.stats()["consecutive_failed_cycles"] >= 2, 60, 0.05, "two failed cycles")
    yield h
    h.sw.stop()
    h.sw.close()
    with admin.cursor() as cur:
        cur.execute(f'DROP OWNED BY "{role}"')
        cur.execute(f'DROP ROLE "{role}"')
    admin.close()


def test_every_metric_and_label_value_used_is_in_a_running_sweepers_metrics(healthy_sweeper):
    names, labelled = parse_exposition(healthy_sweeper.sw.metrics())
    used = {
        "the rules": rules_text_without_comments(),
        "the dashboard": "\n".join(dashboard_exprs() + dashboard_variable_queries()),
    }
    for where, text in used.items():
        missing = names_in(text) - names
        assert not missing, f"{where} name metrics the sweeper does not export: {sorted(missing)}"
        unknown = {t for t in label_values_in(text) if t not in labelled}
        assert not unknown, f"{where} match label values the sweeper never exports: {sorted(unknown)}"
    # The check has teeth: the rules do use selectors with label values.
    assert ("queen_sweeper_state", "state", "failed") in label_values_in(used["the rules"])


# ---------------------------------------------------------------------------------------
# A real Prometheus scraping real sweepers
# ---------------------------------------------------------------------------------------

def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class MetricsEndpoint:
    """/metrics of one sweeper over HTTP on loopback, as a host would serve it."""

    def __init__(self, sweeper):
        sw = sweeper

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the stdlib's name)
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = sw.metrics().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Prometheus:
    def __init__(self, targets: list[str], workdir: Path):
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "queen-sweeper", "static_configs": [{"targets": targets}]}],
        }
        cfg = workdir / "prometheus.yml"
        cfg.write_text(json.dumps(config))  # JSON is YAML
        self.log = open(workdir / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self.ready, 60, 0.2, "Prometheus ready")

    def ready(self) -> bool:
        assert self.proc.poll() is None, "Prometheus exited:\n" + self.log_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def api(self, path: str, **params):
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-4000:]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus_on(tmp_path):
    started = []

    def start(targets):
        p = Prometheus(targets, tmp_path)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


def test_a_real_prometheus_evaluates_the_rules_on_real_scrapes(healthy_sweeper, broken_sweeper,
                                                               prometheus_on):
    good, bad = MetricsEndpoint(healthy_sweeper.sw), MetricsEndpoint(broken_sweeper.sw)
    try:
        prom = prometheus_on([good.address, bad.address])

        def scraped():
            active = prom.api("targets")["activeTargets"]
            return len(active) == 2 and all(t["health"] == "up" for t in active)
        wait_for(scraped, 60, 0.2, "both sweepers scraped")
        # A few more scrapes, so that the rate()s have samples to work with.
        time.sleep(5)

        def evaluated():
            rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
            assert len(rules) == len(rule_blocks())
            return all(r.get("lastEvaluation", "").startswith("2") and r["health"] != "unknown"
                       for r in rules) and rules
        rules = wait_for(evaluated, 60, 0.2, "every rule evaluated")
        bad_health = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        assert not bad_health, f"rules that fail to evaluate: {bad_health}"

        def alerts_by_instance():
            out: dict[str, set[str]] = {}
            for a in prom.api("alerts")["alerts"]:
                out.setdefault(a["labels"]["instance"], set()).add(a["labels"]["alertname"])
            return out
        wait_for(lambda: alerts_by_instance().get(bad.address) == BROKEN_ALERTS, 30, 0.2,
                 f"{sorted(BROKEN_ALERTS)} pending for the broken sweeper (have {alerts_by_instance()})")
        got = alerts_by_instance()
        assert got == {bad.address: BROKEN_ALERTS}, (
            f"alerts by instance: {got}; healthy {good.address}, broken {bad.address}\n"
            f"healthy stats: {healthy_sweeper.stats()}")

        # Every dashboard query answers with data from these scrapes. A rate() needs two
        # samples of a counter that moved within its window, and the broken sweeper's errors
        # come with its backoff: each query is polled until it answers (a gate once caught
        # the error rate between two increments), and fails as before if it never does.
        for expr in dashboard_exprs():
            wait_for(lambda: prom.api("query", query=concrete(expr))["result"], 60, 0.5,
                     f"dashboard query to return something: {concrete(expr)}")
        for q in dashboard_variable_queries():
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", q)
            assert m, f"variable query {q!r}"
            values = prom.api(f"label/{m.group(2)}/values", **{"match[]": concrete(m.group(1))})
            assert values, f"variable query {q} has no values"
    finally:
        good.close()
        bad.close()
