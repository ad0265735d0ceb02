"""An HTTP proxy in front of a real `mlflow server` that starts refusing every request (403 with an HTML page, as an
auth proxy whose session expired does; or another status) from the first request whose path holds a given fragment; it
counts what it refused. A helper module, not a conftest (see server_processes)."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REFUSAL_PAGE = b"<html><head><title>403 Forbidden</title></head>\n<body><h1>403 Forbidden</h1></body></html>\n"
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "server", "date"}


class RefusingProxy(ThreadingHTTPServer):
    def __init__(self, upstream: str, refuse_from: str, status: int) -> None:
        self.upstream, self.refuse_from, self.status = upstream, refuse_from, status
        self.refusing = False
        self.refused: list[str] = []  # "METHOD path" of each request refused, in order
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: RefusingProxy

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.refusing = self.server.refusing or self.server.refuse_from in self.path
        if self.server.refusing:
            self.server.refused.append(f"{self.command} {self.path}")
            self._answer(self.server.status, {"Content-Type": "text/html"}, REFUSAL_PAGE)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
        request = urllib.request.Request(self.server.upstream + self.path, data=body or None, method=self.command,
                                         headers=headers)  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                self._answer(response.status, dict(response.headers), response.read())
        except urllib.error.HTTPError as exc:
            self._answer(exc.code, dict(exc.headers), exc.read())

    def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() not in _HOP_HEADERS:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        pass


@contextmanager
def refusing_proxy(upstream: str, refuse_from: str, status: int = 403) -> Iterator[RefusingProxy]:
    """A RefusingProxy to `upstream`, answering `status` once refusing, serving in a thread while the block runs."""
    proxy = RefusingProxy(upstream, refuse_from, status)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join(timeout=10)
