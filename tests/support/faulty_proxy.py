"""A loopback HTTP proxy that injects object-store faults between a client (s3fs) and a real server.

    with FaultyProxy("http://127.0.0.1:5000", fault_rate=0.3, seed=1) as proxy:
        RunStore("s3://bucket/run", endpoint.storage_options(proxy.endpoint_url))

For each request, with probability `fault_rate` (and only where `applies(method, path)` is true) one of
`kinds` happens instead of a clean relay:
    "503"          answer 503 SlowDown without forwarding (the store did nothing)
    "drop_before"  close the connection without forwarding (the store did nothing, the client sees a reset)
    "drop_after"   forward, let the store apply the request, then close without answering (the client
                   cannot know it succeeded: the case that makes create-only retries interesting)
Every request is logged as (method, path with query, outcome). Stdlib only: http.server + http.client.

`hold(applies)` makes matching requests wait (unanswered, the client blocked in its call) until `release()`:
a test can keep a run in a state it cannot skip past (e.g. a job's checkpoint upload in flight) and act then;
`held` lists the paths waiting.
"""

from __future__ import annotations

import http.client
import random
import socket
import threading
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is not None:
            return self.rfile.read(int(length))
        if "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
            return b""
        raw = bytearray()  # forward the chunked body verbatim (it may be signed as sent)
        while True:
            line = self.rfile.readline()
            raw += line
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    trailer = self.rfile.readline()
                    raw += trailer
                    if trailer in (b"\r\n", b"\n", b""):
                        return bytes(raw)
            raw += self.rfile.read(size + 2)

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        upstream = http.client.HTTPConnection(self.server.upstream_host, self.server.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "proxy-connection")}
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for key, value in headers.items():
                upstream.putheader(key, value)
            upstream.endheaders(body if body else None)
            response = upstream.getresponse()
            data = response.read()
            return response.status, response.reason, response.getheaders(), data
        finally:
            upstream.close()

    def _relay(self) -> None:
        body = self._read_body()
        self.server.wait_if_held(self.command, self.path)
        outcome = self.server.decide(self.command, self.path)
        if outcome == "503":
            self.send_response(503, "Slow Down")
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(SLOW_DOWN)))
            self.end_headers()
            self.wfile.write(SLOW_DOWN)
            return
        if outcome == "drop_before":
            self._drop()
            return
        status, reason, headers, data = self._forward(body)
        if outcome == "drop_after":
            self._drop()
            return
        self.send_response(status, reason)
        for key, value in headers:
            if key.lower() not in _HOP_HEADERS:
                self.send_header(key, value)
        if self.command == "HEAD":
            self.send_header("Content-Length", dict((k.lower(), v) for k, v in headers).get("content-length", "0"))
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD" and data:
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, decide, wait_if_held):
        split = urllib.parse.urlsplit(upstream)
        self.upstream_host, self.upstream_port = split.hostname, split.port or 80
        self.decide = decide
        self.wait_if_held = wait_if_held
        super().__init__(("127.0.0.1", 0), _Handler)


class FaultyProxy:
    """The proxy; `endpoint_url` is where clients connect, `log` and `counts` what happened."""

    def __init__(self, upstream: str, *, fault_rate: float = 0.0, kinds=("503", "drop_before", "drop_after"),
                 seed: int = 0, applies=None):
        if not 0.0 <= fault_rate <= 1.0:
            raise ValueError(f"fault_rate={fault_rate} must be in [0, 1]")
        self.fault_rate = fault_rate
        self.kinds = tuple(kinds)
        self.applies = applies or (lambda method, path: True)
        self.log: list[tuple[str, str, str]] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._holds = None  # (applies, released event) while `hold` is in force
        self._held: list[str] = []
        self._server = _Server(upstream, self._decide, self._wait_if_held)
        self._thread = threading.Thread(target=self._server.serve_forever, name="faulty-proxy", daemon=True)
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def _decide(self, method: str, path: str) -> str:
        with self._lock:
            outcome = "ok"
            if self.applies(method, path) and self._rng.random() < self.fault_rate:
                outcome = self._rng.choice(self.kinds)
            self.log.append((method, path, outcome))
            return outcome

    def hold(self, applies) -> None:
        """From now on, requests with `applies(method, path)` wait until `release()`."""
        with self._lock:
            self._holds = (applies, threading.Event())

    def release(self) -> None:
        """Let every held request (and all later ones) through."""
        with self._lock:
            holds, self._holds = self._holds, None
        if holds is not None:
            holds[1].set()

    @property
    def held(self) -> list[str]:
        """Paths of the requests waiting now."""
        with self._lock:
            return list(self._held)

    def _wait_if_held(self, method: str, path: str) -> None:
        with self._lock:
            holds = self._holds
            if holds is None or not holds[0](method, path):
                return
            self._held.append(path)
        try:
            holds[1].wait(timeout=300)  # bounded: a test that never releases still ends
        finally:
            with self._lock:
                self._held.remove(path)

    @property
    def counts(self) -> Counter:
        with self._lock:
            return Counter(outcome for _, _, outcome in self.log)

    def start(self) -> "FaultyProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> "FaultyProxy":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
