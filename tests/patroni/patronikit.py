"""A Patroni-managed PostgreSQL 15 cluster on loopback, for tests: one etcd, two (or more)
Patroni nodes, optionally an HAProxy routed by Patroni's REST health check (GET /primary).

Everything lives in one temporary folder and runs on free loopback ports:

    DIR/etcd/            etcd's data, etcd.log
    DIR/nodeK/           node K: patroni.yml, patroni.log, data/ (PGDATA), the socket
    DIR/haproxy.cfg      HAProxy's configuration, haproxy.log
    DIR/state.json       ports and process ids (what `cluster stop DIR` kills)

PostgreSQL and Patroni run as the postgres user (initdb and postgres refuse root); etcd
and HAProxy run as that user too, so nothing of the cluster is left owned by root.

Timings (the DCS's dynamic configuration, set at bootstrap): ttl 10, loop_wait 2,
retry_timeout 4 (Patroni's rule ttl >= loop_wait + 2 * retry_timeout holds), and
primary_start_timeout 0: a primary whose PostgreSQL crashed is failed over at once instead of
being restarted in place for up to 300 s (Patroni's default). synchronous_mode is on: the
replica Patroni names in synchronous_standby_names has every commit the primary acknowledged,
and only it may be promoted. The asynchronous test turns it off at run time (set_synchronous).

At bootstrap the schema is applied on the leader as the superuser (psql -f sql/*.sql, in
order, as an operator does), and two LOGIN roles are made: queen_ha_sweeper (member of
queen_sweeper only) and queen_ha_broker (member of queen_broker only). Authentication is
trust on loopback: the roles have no password.

Used by tests/patroni/test_patroni.py (in-process) and tests/patroni/cluster (by hand).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PG_BIN = Path("/usr/lib/postgresql/15/bin")
SCOPE = "queen-ha"
SWEEPER_ROLE = "queen_ha_sweeper"
BROKER_ROLE = "queen_ha_broker"

TTL = 10
LOOP_WAIT = 2
RETRY_TIMEOUT = 4


def free_port(taken=()):
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port not in taken:
            return port


def _pg_user():
    return pwd.getpwnam("postgres")


def _chown_tree(path):
    if os.getuid() != 0:
        return
    pw = _pg_user()
    for dirpath, dirnames, filenames in os.walk(path):
        os.chown(dirpath, pw.pw_uid, pw.pw_gid)
        for f in filenames:
            try:
                os.chown(os.path.join(dirpath, f), pw.pw_uid, pw.pw_gid)
            except FileNotFoundError:
                pass


def _as_postgres():
    """Popen keywords that run the child as the postgres user, in a session of its own."""
    kw = {"start_new_session": True}
    if os.getuid() == 0:
        pw = _pg_user()
        kw.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    return kw


def _child_env(home):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "QUEEN_"))}
    env.update(HOME=str(home), LC_ALL="C.UTF-8", LANG="C.UTF-8", PATH="/usr/bin:/bin:/usr/sbin:/sbin")
    return env


def _alive(pid):
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (ours, not reaped yet) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


def _children(pid):
    try:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    except OSError:
        return []
    return [int(x) for x in out.split()]


def _postmaster_pid(data_dir):
    try:
        with open(Path(data_dir) / "postmaster.pid") as f:
            return int(f.readline().strip())
    except (OSError, ValueError):
        return None


def http_json(url, method="GET", body=None, timeout=2.0):
    """(status, parsed JSON or None); status 0 when nothing answered."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    except (urllib.error.URLError, OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, None


class Node:
    def __init__(self, cluster, index, pg_port, rest_port):
        self.cluster = cluster
        self.index = index
        self.name = f"node{index}"
        self.pg_port = pg_port
        self.rest_port = rest_port
        self.dir = cluster.dir / self.name
        self.data_dir = self.dir / "data"
        self.config = self.dir / "patroni.yml"
        self.log = self.dir / "patroni.log"
        self.proc = None
        self.pid = None  # patroni's pid (also when started by another process: state.json)

    def __repr__(self):
        return f"{self.name}(pg {self.pg_port}, rest {self.rest_port})"

    @property
    def address(self):
        return f"127.0.0.1:{self.pg_port}"

    def rest(self, path, method="GET", body=None, timeout=2.0):
        return http_json(f"http://127.0.0.1:{self.rest_port}{path}", method, body, timeout)

    def conninfo(self, user="postgres", **extra):
        ci = f"host=127.0.0.1 port={self.pg_port} user={user} dbname=postgres connect_timeout=2"
        for k, v in extra.items():
            ci += f" {k}={v}"
        return ci

    def postmaster_pid(self):
        return _postmaster_pid(self.data_dir)

    def patroni_alive(self):
        return _alive(self.pid)

    def write_config(self):
        c = self.cluster
        self.dir.mkdir(parents=True, exist_ok=True)
        # JSON is YAML: Patroni reads this file with its YAML loader.
        cfg = {
            "scope": SCOPE,
            "namespace": c.namespace,
            "name": self.name,
            "log": {"level": "INFO", "format": "%(asctime)s %(levelname)s: %(message)s"},
            "restapi": {"listen": f"127.0.0.1:{self.rest_port}", "connect_address": f"127.0.0.1:{self.rest_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{c.etcd_port}"], "protocol": "http"},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    "primary_start_timeout": 0,
                    # Large enough that a replica behind by a few fires may still be promoted
                    # (the asynchronous test); synchronous mode makes it moot otherwise.
                    "maximum_lag_on_failover": 64 * 1024 * 1024,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "remove_data_directory_on_rewind_failure": True,
                        "remove_data_directory_on_diverged_timelines": True,
                        "parameters": {
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "wal_log_hints": "on",
                            "max_connections": 200,
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "128MB",
                            "synchronous_commit": "on",
                            # The machine does not crash in these tests, only processes do: the
                            # page cache survives a SIGKILL, so fsync buys nothing here.
                            "fsync": "off",
                            "log_min_messages": "warning",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}],
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_port}",
                "connect_address": f"127.0.0.1:{self.pg_port}",
                "data_dir": str(self.data_dir),
                "bin_dir": str(PG_BIN),
                "pgpass": str(self.dir / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                    "rewind": {"username": "postgres", "password": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(self.dir)},
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }
        self.config.write_text(json.dumps(cfg, indent=2) + "\n")

    def start_patroni(self):
        assert not self.patroni_alive(), f"{self.name}: patroni already runs ({self.pid})"
        _chown_tree(self.dir)
        logf = open(self.log, "ab")
        try:
            self.proc = subprocess.Popen(["/usr/bin/patroni", str(self.config)], stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=str(self.dir), env=_child_env(self.dir),
                                         **_as_postgres())
        finally:
            logf.close()
        self.pid = self.proc.pid
        self.cluster.save_state()

    def stop_patroni(self, timeout=60.0):
        """SIGTERM to Patroni: it stops its PostgreSQL (fast) and, if it led, lets the leader key
        go. Waits for Patroni and its PostgreSQL to be gone; the seconds it took."""
        t0 = time.monotonic()
        if self.patroni_alive():
            os.kill(self.pid, signal.SIGTERM)
        if not _wait_gone([self.pid], timeout):
            raise AssertionError(f"{self.name}: patroni did not stop within {timeout}s")
        if self.proc is not None:
            self.proc.wait(5)
        pm = self.postmaster_pid()
        if pm and not _wait_gone([pm], 10):
            raise AssertionError(f"{self.name}: postmaster {pm} still runs after patroni stopped")
        return time.monotonic() - t0

    def kill_postmaster(self):
        """SIGKILL to the postmaster and every one of its children at once (a crash: nothing
        flushed or said goodbye). Patroni on this node lives on. The pids killed."""
        pid = self.postmaster_pid()
        assert pid and _alive(pid), f"{self.name}: no postmaster to kill"
        victims = [pid] + _children(pid)
        for p in victims:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _wait_gone([pid], 10)
        return victims

    def force_down(self):
        """Teardown: SIGKILL Patroni's whole process group, then anything left of PostgreSQL."""
        if self.pid:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if self.patroni_alive():
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        pm = self.postmaster_pid()
        if pm and _alive(pm):
            victims = [pm] + _children(pm)
            for p in victims:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _wait_gone(victims, 10)
        if self.proc is not None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass


class Cluster:
    def __init__(self, directory, nodes=2, haproxy=True):
        self.dir = Path(directory)
        self.namespace = "/queen-test/"
        self.etcd_port = 0
        self.etcd_peer_port = 0
        self.haproxy_port = 0
        self.with_haproxy = haproxy
        self.etcd_pid = None
        self.haproxy_pid = None
        self._procs = []
        self.nodes: list[Node] = []
        self.n = nodes

    # -- state (for tests/patroni/cluster stop) -------------------------------------------

    def save_state(self):
        state = {"etcd_port": self.etcd_port, "etcd_peer_port": self.etcd_peer_port, "etcd_pid": self.etcd_pid,
                 "haproxy_port": self.haproxy_port, "haproxy_pid": self.haproxy_pid,
                 "nodes": [{"pg_port": n.pg_port, "rest_port": n.rest_port, "pid": n.pid} for n in self.nodes]}
        (self.dir / "state.json").write_text(json.dumps(state) + "\n")

    @classmethod
    def load(cls, directory):
        c = cls(directory)
        state = json.loads((Path(directory) / "state.json").read_text())
        c.etcd_port, c.etcd_peer_port, c.etcd_pid = state["etcd_port"], state["etcd_peer_port"], state["etcd_pid"]
        c.haproxy_port, c.haproxy_pid = state["haproxy_port"], state["haproxy_pid"]
        c.with_haproxy = bool(c.haproxy_port)
        c.nodes = []
        for i, s in enumerate(state["nodes"]):
            n = Node(c, i, s["pg_port"], s["rest_port"])
            n.pid = s["pid"]
            c.nodes.append(n)
        c.n = len(c.nodes)
        return c

    # -- start and stop -------------------------------------------------------------------

    def start(self, timeout=180.0):
        """Starts everything and waits for a healthy cluster (a leader, every replica streaming
        and one of them synchronous), then applies the schema. Tears down on any failure."""
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout):
        for b in ("initdb", "postgres", "pg_ctl", "pg_rewind", "pg_basebackup", "psql"):
            if not (PG_BIN / b).exists():
                raise RuntimeError(f"PostgreSQL 15 binary missing: {PG_BIN / b}")
        for b in ("/usr/bin/patroni", "/usr/bin/patronictl", "/usr/bin/etcd"):
            if not Path(b).exists():
                raise RuntimeError(f"missing: {b}")
        if self.with_haproxy and not Path("/usr/sbin/haproxy").exists():
            raise RuntimeError("missing: /usr/sbin/haproxy")
        self.dir.mkdir(parents=True, exist_ok=True)
        taken = set()

        def port():
            p = free_port(taken)
            taken.add(p)
            return p

        self.etcd_port, self.etcd_peer_port = port(), port()
        self.nodes = [Node(self, i, port(), port()) for i in range(self.n)]
        if self.with_haproxy:
            self.haproxy_port = port()
        for n in self.nodes:
            n.write_config()
        _chown_tree(self.dir)
        self._start_etcd()
        self.save_state()
        deadline = time.monotonic() + timeout
        # The first node bootstraps (initdb) alone; the others clone it once it leads.
        self.nodes[0].start_patroni()
        self._wait(lambda: self.nodes[0].rest("/primary")[0] == 200, deadline, "node0 to bootstrap and lead")
        for n in self.nodes[1:]:
            n.start_patroni()
        self.wait_healthy(deadline - time.monotonic())
        if self.with_haproxy:
            self._start_haproxy()
        self.save_state()
        self._bootstrap_schema()

    def _start_etcd(self):
        d = self.dir / "etcd"
        d.mkdir(parents=True, exist_ok=True)
        _chown_tree(d)
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        logf = open(d / "etcd.log", "ab")
        try:
            p = subprocess.Popen(["/usr/bin/etcd", "--name", "etcd0", "--data-dir", str(d / "data"),
                                  "--listen-client-urls", client, "--advertise-client-urls", client,
                                  "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                  "--initial-cluster", f"etcd0={peer}", "--initial-cluster-state", "new",
                                  "--initial-cluster-token", f"queen-{os.getpid()}"],
                                 stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(d),
                                 env=_child_env(d), **_as_postgres())
        finally:
            logf.close()
        self._procs.append(p)
        self.etcd_pid = p.pid
        self._wait(lambda: http_json(f"{client}/health")[0] == 200, time.monotonic() + 30, "etcd to answer /health")

    def _start_haproxy(self):
        lines = [
            "global",
            "    maxconn 1000",
            "    log stderr format raw local0 info",
            "defaults",
            "    log global",
            "    mode tcp",
            "    option log-health-checks",
            "    timeout connect 2s",
            "    timeout client 30m",
            "    timeout server 30m",
            "    timeout check 2s",
            "listen primary",
            f"    bind 127.0.0.1:{self.haproxy_port}",
            "    option httpchk GET /primary",
            "    http-check expect status 200",
            # A check every 500 ms, down after 3 failed ones, up after 1: a new primary is
            # routed to within about a second of Patroni saying so. Sessions to a server marked
            # down are cut, so no client stays on a demoted primary.
            "    default-server inter 500ms fall 3 rise 1 on-marked-down shutdown-sessions",
        ]
        for n in self.nodes:
            lines.append(f"    server {n.name} 127.0.0.1:{n.pg_port} check port {n.rest_port}")
        cfg = self.dir / "haproxy.cfg"
        cfg.write_text("\n".join(lines) + "\n")
        _chown_tree(self.dir)
        logf = open(self.dir / "haproxy.log", "ab")
        try:
            p = subprocess.Popen(["/usr/sbin/haproxy", "-db", "-f", str(cfg)], stdout=logf, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, cwd=str(self.dir), env=_child_env(self.dir),
                                 **_as_postgres())
        finally:
            logf.close()
        self._procs.append(p)
        self.haproxy_pid = p.pid
        self._wait(lambda: self._haproxy_answers(), time.monotonic() + 30, "HAProxy to route to the primary")

    def _haproxy_answers(self):
        try:
            out = subprocess.run([str(PG_BIN / "psql"), "-X", "-qAt", "-h", "127.0.0.1", "-p", str(self.haproxy_port),
                                  "-U", "postgres", "-d", "postgres", "-c", "SELECT pg_is_in_recovery()"],
                                 capture_output=True, text=True, timeout=5, env=_child_env(self.dir)).stdout.strip()
        except subprocess.TimeoutExpired:
            return False
        return out == "f"

    def stop(self):
        """Everything down, however it was left: Patroni asked first (it stops PostgreSQL),
        then whatever remains SIGKILLed; the folder stays (the caller removes it)."""
        alive = [n for n in self.nodes if n.patroni_alive()]
        for n in alive:
            try:
                os.kill(n.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        _wait_gone([n.pid for n in alive], 30)
        for n in self.nodes:
            n.force_down()
        for pid in (self.haproxy_pid, self.etcd_pid):
            if pid and _alive(pid):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        _wait_gone([p for p in (self.haproxy_pid, self.etcd_pid) if p], 10)
        for pid in (self.haproxy_pid, self.etcd_pid):
            if pid and _alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for p in self._procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        left = [p for p in [self.etcd_pid, self.haproxy_pid] + [n.pid for n in self.nodes]
                + [n.postmaster_pid() for n in self.nodes] if p and _alive(p)]
        return left

    # -- looking at it --------------------------------------------------------------------

    @staticmethod
    def _wait(pred, deadline, what, interval=0.1):
        while True:
            try:
                if pred():
                    return
            except Exception:  # noqa: BLE001 - a starting component may answer anything
                pass
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(interval)

    def leader(self):
        """The node whose Patroni answers 200 on GET /primary (it leads and its PostgreSQL
        is a primary), or None."""
        for n in self.nodes:
            if n.patroni_alive() and n.rest("/primary", timeout=1.0)[0] == 200:
                return n
        return None

    def replicas(self, leader=None):
        leader = leader or self.leader()
        return [n for n in self.nodes if n is not leader]

    def node_by_name(self, name):
        return next(n for n in self.nodes if n.name == name)

    def members(self):
        """GET /cluster from any Patroni that answers: {name: member dict}."""
        for n in self.nodes:
            if not n.patroni_alive():
                continue
            status, body = n.rest("/cluster", timeout=1.0)
            if status == 200 and body:
                return {m["name"]: m for m in body.get("members", [])}
        return {}

    def replication(self, leader):
        """pg_stat_replication on the leader: [(application_name, state, sync_state)]."""
        import psycopg2
        c = psycopg2.connect(leader.conninfo())
        try:
            c.autocommit = True
            with c.cursor() as cur:
                cur.execute("SELECT application_name, state, sync_state FROM pg_stat_replication")
                return cur.fetchall()
        finally:
            c.close()

    def healthy(self, sync=True):
        """A leader, every other node's Patroni running with PostgreSQL streaming from it, and
        (sync) one of them the synchronous standby; no switchover or failover pending."""
        leader = self.leader()
        if leader is None:
            return False
        others = [n for n in self.nodes if n is not leader]
        if any(not n.patroni_alive() for n in others):
            return False
        rows = self.replication(leader)
        streaming = {r[0] for r in rows if r[1] == "streaming"}
        if any(n.name not in streaming for n in others):
            return False
        if sync and not any(r[2] == "sync" for r in rows):
            return False
        if not sync and any(r[2] == "sync" for r in rows):
            return False
        members = self.members()
        if not all(members.get(n.name, {}).get("state") == "running" for n in self.nodes):
            return False
        # The DCS's /sync key (GET /cluster shows it as the role sync_standby) is what Patroni
        # promotes by, not pg_stat_replication: it names the standby one loop after
        # synchronous_standby_names does. Stop the leader in between and no one may take over
        # (seen: the replica waits "not the healthiest node" until the old leader returns).
        roles = {members[n.name].get("role") for n in others}
        return ("sync_standby" in roles) == sync

    def wait_healthy(self, timeout=120.0, sync=True):
        t0 = time.monotonic()
        try:
            self._wait(lambda: self.healthy(sync), t0 + timeout, "a healthy cluster", interval=0.25)
        except AssertionError:
            raise AssertionError(f"no healthy cluster within {timeout:.0f}s: members {self.members()}\n"
                                 + self.tail_logs())
        return time.monotonic() - t0

    def tail_logs(self, lines=25):
        out = []
        for n in self.nodes:
            try:
                text = n.log.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                text = []
            out.append(f"--- {n.name} patroni.log (last {len(text)} lines)\n" + "\n".join(text))
        return "\n".join(out)

    # -- actions --------------------------------------------------------------------------

    def patronictl(self, *args, timeout=60):
        cfg = next(n.config for n in self.nodes)
        r = subprocess.run(["/usr/bin/patronictl", "-c", str(cfg), *args], capture_output=True, text=True,
                           timeout=timeout, env=_child_env(self.dir))
        if r.returncode != 0:
            raise AssertionError(f"patronictl {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def switchover(self, candidate=None):
        args = ["switchover", "--force"]
        if candidate is not None:
            args += ["--candidate", candidate.name]
        return self.patronictl(*args)

    def set_synchronous(self, on, timeout=60.0):
        self.patronictl("edit-config", "--force", "-s", f"synchronous_mode={'true' if on else 'false'}")
        return self.wait_healthy(timeout, sync=on)

    # -- bootstrap ------------------------------------------------------------------------

    def psql(self, node, sql=None, file=None, user="postgres"):
        args = [str(PG_BIN / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(node.pg_port),
                "-U", user, "-d", "postgres"]
        if sql is not None:
            args += ["-c", sql]
        if file is not None:
            args += ["-c", "SET client_min_messages = warning", "-f", "-"]
        stdin = open(file, "rb") if file is not None else subprocess.DEVNULL
        try:
            r = subprocess.run(args, stdin=stdin, capture_output=True, text=True, timeout=120, env=_child_env(self.dir))
        finally:
            if file is not None:
                stdin.close()
        if r.returncode != 0:
            raise AssertionError(f"psql on {node.name} failed: {r.stderr}")
        return r.stdout

    def _bootstrap_schema(self):
        leader = self.leader()
        assert leader is not None, "no leader to apply the schema on"
        for f in sorted((ROOT / "sql").glob("[0-9][0-9][0-9]_*.sql")):
            self.psql(leader, file=f)
        self.psql(leader, sql=f"CREATE ROLE {SWEEPER_ROLE} LOGIN IN ROLE queen_sweeper; "
                              f"CREATE ROLE {BROKER_ROLE} LOGIN IN ROLE queen_broker; "
                              "CREATE TABLE public.ha_write_probe (id int PRIMARY KEY, at timestamptz); "
                              "INSERT INTO public.ha_write_probe VALUES (1, now())")

    # -- what clients use -----------------------------------------------------------------

    def conninfo(self, user="postgres", **extra):
        """The operator's way: every host named, the writable one asked for."""
        hosts = ",".join("127.0.0.1" for _ in self.nodes)
        ports = ",".join(str(n.pg_port) for n in self.nodes)
        ci = f"host={hosts} port={ports} user={user} dbname=postgres target_session_attrs=read-write"
        for k, v in extra.items():
            ci += f" {k}={v}"
        return ci

    def haproxy_conninfo(self, user="postgres", **extra):
        ci = f"host=127.0.0.1 port={self.haproxy_port} user={user} dbname=postgres"
        for k, v in extra.items():
            ci += f" {k}={v}"
        return ci

    def exports(self):
        lines = [f"export QUEEN_HA_DIR='{self.dir}'",
                 f"export QUEEN_HA_CONNINFO='{self.conninfo()}'",
                 f"export QUEEN_HA_SWEEPER_CONNINFO='{self.conninfo(SWEEPER_ROLE)}'",
                 f"export QUEEN_HA_BROKER_CONNINFO='{self.conninfo(BROKER_ROLE)}'",
                 f"export QUEEN_HA_ETCD='127.0.0.1:{self.etcd_port}'",
                 f"export QUEEN_HA_PATRONICTL='patronictl -c {self.nodes[0].config}'"]
        if self.haproxy_port:
            lines.append(f"export QUEEN_HA_HAPROXY_CONNINFO='{self.haproxy_conninfo(SWEEPER_ROLE)}'")
        for n in self.nodes:
            lines.append(f"export QUEEN_HA_{n.name.upper()}_PORT={n.pg_port} QUEEN_HA_{n.name.upper()}_REST={n.rest_port}")
        return "\n".join(lines)


def remove_dir(path):
    shutil.rmtree(path, ignore_errors=True)
