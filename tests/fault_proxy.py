"""A fault-injecting HTTP proxy on 127.0.0.1 in front of the tests' S3 server
(tests/object_store.py): what a day-long job meets from a real object store under load, on
demand and seeded.

Clients reach it as they reach any S3-compatible store, through AWS_ENDPOINT_URL; it forwards
every request to the one upstream it was given (which must be on 127.0.0.1 too) and answers
with the upstream's answer, except where it injects a fault:

- `slowdown`: `503 SlowDown` at once; the request never reaches the store.
- `ambiguous` (writes only: PUT, POST, DELETE): the request is forwarded and takes effect, and
  the client is told `500 InternalError` -- the outcome a client cannot tell from a failure.
- `drop`: the connection is closed without an answer; the request never reaches the store.

Targeted rules may also give what a store refusing chorus would answer (never at random):

- `denied`: `403 AccessDenied`; the request never reaches the store.
- `not_implemented`: `501 NotImplemented` (a store without conditional writes).
- `unconditional`: forwarded without its If-Match / If-None-Match headers (a store that
  ignores them).

Faults come at random rates (one seeded generator: the same seed gives the same sequence of
decisions for the same sequence of requests) and from targeted rules (`Rule`: a method, a key
pattern, a fault, how many times), which go first. Every request and fault is counted.
"""

from __future__ import annotations

import http.client
import ipaddress
import random
import re
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from urllib.parse import urlsplit

SLOWDOWN, AMBIGUOUS, DROP = "slowdown", "ambiguous", "drop"
FAULTS = (SLOWDOWN, AMBIGUOUS, DROP)  # at random rates or by rule
DENIED, NOT_IMPLEMENTED, UNCONDITIONAL = "denied", "not_implemented", "unconditional"
REFUSALS = {DENIED: (403, "AccessDenied", "Access Denied"), NOT_IMPLEMENTED: (501, "NotImplemented", "Not implemented")}
_CONDITIONS = frozenset({"if-match", "if-none-match"})
WRITES = frozenset({"PUT", "POST", "DELETE"})
# not forwarded: they describe one hop (the proxy de-chunks bodies and keeps its own connections)
_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te"})
_OWN_HEADERS = frozenset({"content-length", "date", "server"})  # the proxy's answer sets these itself


@dataclass
class Rule:
    """A targeted fault: requests of `method` (None: any) whose path ("/bucket/key?query")
    matches the regular expression `key` get `fault`, `times` times (None: until removed)."""

    fault: str
    key: str
    method: Optional[str] = None
    times: Optional[int] = 1
    hits: int = 0
    _pattern: re.Pattern = field(init=False, repr=False)

    def __post_init__(self) -> None:
        known = (*FAULTS, DENIED, NOT_IMPLEMENTED, UNCONDITIONAL)
        if self.fault not in known:
            raise ValueError(f"unknown fault {self.fault!r}; one of {known}")
        self._pattern = re.compile(self.key)

    def takes(self, method: str, path: str) -> bool:
        """Whether this rule fires for the request (and counts it if so)."""
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method is not None and method != self.method:
            return False
        if not self._pattern.search(path):
            return False
        if self.fault == AMBIGUOUS and method not in WRITES:
            return False
        self.hits += 1
        return True


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def error_body(code: str, message: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message>'
        f"<RequestId>chorus-fault-proxy</RequestId></Error>"
    ).encode()


class FaultProxy:
    """The running proxy (see the module doc). `endpoint` is its URL; `rates` and `rules` may
    change while it runs."""

    def __init__(self, upstream: str, seed: int = 0, slowdown: float = 0.0, ambiguous: float = 0.0, drop: float = 0.0):
        target = urlsplit(upstream)
        if not _loopback(target.hostname or ""):
            raise ValueError(f"the fault proxy forwards only to 127.0.0.1, not {upstream}")
        self.upstream = (target.hostname, target.port or 80)
        self.rates = {SLOWDOWN: slowdown, AMBIGUOUS: ambiguous, DROP: drop}
        self.rules: list[Rule] = []
        self.requests = 0
        self.faults: Counter = Counter()  # (fault, method) -> count
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.proxy = self
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def remove(self, rule: Rule) -> None:
        with self._lock:
            self.rules.remove(rule)

    def set_rates(self, slowdown: float = 0.0, ambiguous: float = 0.0, drop: float = 0.0) -> None:
        with self._lock:
            self.rates = {SLOWDOWN: slowdown, AMBIGUOUS: ambiguous, DROP: drop}

    def counts(self) -> dict:
        """Requests seen and faults injected, by fault and by method."""
        with self._lock:
            by_fault = Counter()
            for (fault, _method), n in self.faults.items():
                by_fault[fault] += n
            return {
                "requests": self.requests,
                "faults": {f: by_fault[f] for f in (*FAULTS, *sorted(set(by_fault) - set(FAULTS)))},
                "faults_by_method": {f"{f} {m}": n for (f, m), n in sorted(self.faults.items())},
                "rules": [{"fault": r.fault, "method": r.method, "key": r.key, "hits": r.hits} for r in self.rules],
            }

    def decide(self, method: str, path: str) -> Optional[str]:
        """The fault for this request, or None to answer it truly."""
        with self._lock:
            self.requests += 1
            fault = next((r.fault for r in self.rules if r.takes(method, path)), None)
            if fault is None:
                draw = self._rng.random()
                if draw < self.rates[SLOWDOWN]:
                    fault = SLOWDOWN
                elif draw < self.rates[SLOWDOWN] + self.rates[DROP]:
                    fault = DROP
                elif method in WRITES and self._rng.random() < self.rates[AMBIGUOUS]:
                    fault = AMBIGUOUS
            if fault is not None:
                self.faults[(fault, method)] += 1
            return fault

    def forward(self, method: str, path: str, headers: dict, body: bytes) -> tuple[int, list, bytes]:
        """The upstream's answer to the request: (status, headers, body)."""
        for attempt in range(2):  # a kept-alive upstream connection may have been closed meanwhile
            connection = getattr(self._local, "connection", None)
            if connection is None:
                connection = self._local.connection = http.client.HTTPConnection(*self.upstream, timeout=60)
            try:
                connection.request(method, path, body=body, headers=headers)
                answer = connection.getresponse()
                return answer.status, answer.getheaders(), answer.read()
            except (http.client.HTTPException, OSError):
                connection.close()
                self._local.connection = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and Expect: 100-continue answered

    def log_message(self, *args) -> None:  # no line per request in the test log
        pass

    def do_GET(self) -> None:
        self._handle()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        proxy: FaultProxy = self.server.proxy
        body = self._body()
        fault = proxy.decide(self.command, self.path)
        if fault == DROP:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if fault == SLOWDOWN:
            self._answer(503, [], error_body("SlowDown", "Please reduce your request rate."))
            return
        if fault in REFUSALS:
            status, code, message = REFUSALS[fault]
            self._answer(status, [], error_body(code, message))
            return
        dropped = _HOP_HEADERS | (_CONDITIONS if fault == UNCONDITIONAL else frozenset())
        headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
        headers["Content-Length"] = str(len(body))
        status, answer_headers, data = proxy.forward(self.command, self.path, headers, body)
        if fault == AMBIGUOUS:  # it took effect; the client is told otherwise
            self._answer(500, [], error_body("InternalError", "We encountered an internal error. Please try again."))
            return
        self._answer(status, answer_headers, data)

    def _answer(self, status: int, headers: list, data: bytes) -> None:
        self.send_response(status)
        kept = [(k, v) for k, v in headers if k.lower() not in _HOP_HEADERS | _OWN_HEADERS]
        for name, value in kept:
            self.send_header(name, value)
        if self.command == "HEAD":
            length = next((v for k, v in headers if k.lower() == "content-length"), "0")
            self.send_header("Content-Length", length)
            self.end_headers()
            return
        if not any(k.lower() == "content-type" for k, _ in kept) and status >= 400:
            self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
