"""A TCP proxy between a sweeper and PostgreSQL that can lose one answer on purpose.

Armed with a marker (bytes of a statement's text, e.g. b"log_timers_claim_v2"), the proxy
forwards a connection's traffic as usual until the client sends a message holding the
marker. From then on it keeps the server's bytes for that connection to itself, and as
soon as they hold the COMMIT's CommandComplete (the pinned transaction of the pool ends
with COMMIT), it closes both sockets without forwarding any of them: the transaction
committed on the server, and the client never hears of it. That is exactly the answer a
failover, a bouncer restart or a network cut takes with it. The proxy disarms itself after
one cut, so the sweeper reconnects through it normally.
"""
from __future__ import annotations

import select
import socket
import threading
import time

COMMIT_COMPLETE = b"C\x00\x00\x00\x0bCOMMIT\x00"


class CutProxy:
    def __init__(self, host: str, port: int, refuse_after_cut: bool = False):
        """refuse_after_cut: once the cut is made, the proxy stops listening, so every new
        connection is refused, as a dead server's would be (the failover test: the sweeper
        must go to the next host; libpq moves on from a refused connection, not from one
        closed during its startup)."""
        self.target = (host, port)
        self.refuse_after_cut = refuse_after_cut
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.marker: bytes | None = None
        self.cut_at: float | None = None  # time.time() of the cut
        self.lock = threading.Lock()
        self.closing = False
        self.threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    def arm(self, marker: bytes):
        with self.lock:
            self.marker = marker
            self.cut_at = None

    def _accept(self):
        while not self.closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            t = threading.Thread(target=self._pump, args=(client, server), daemon=True)
            t.start()
            self.threads.append(t)

    def _pump(self, client: socket.socket, server: socket.socket):
        holding = False
        held = b""
        try:
            while not self.closing:
                r, _, _ = select.select([client, server], [], [], 0.2)
                for s in r:
                    data = s.recv(65536)
                    if not data:
                        return
                    if s is client:
                        with self.lock:
                            if self.marker is not None and self.marker in data:
                                self.marker = None  # one cut, then disarmed
                                holding = True
                        server.sendall(data)
                    elif holding:
                        held += data
                        if COMMIT_COMPLETE in held:
                            with self.lock:
                                self.cut_at = time.time()
                            if self.refuse_after_cut:
                                self._stop_listening()
                            return  # committed on the server; the client never hears of it
                    else:
                        client.sendall(data)
        except OSError:
            return
        finally:
            for s in (client, server):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def _stop_listening(self):
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.listener.close()
        except OSError:
            pass

    def close(self):
        self.closing = True
        self._stop_listening()
        for t in self.threads:  # each pump looks at `closing` every 0.2 s
            t.join(2)
