"""An HTTP proxy on loopback in front of a real OpenAI-compatible server, for the client's failure tests.

The first requests get the faults listed, one each, in order; every later request is forwarded unchanged:

- ``503``: HTTP 503 with a JSON error (an overloaded server);
- ``garbage``: HTTP 200 whose body is not JSON;
- ``not-a-completion``: HTTP 200 with JSON that has no ``choices``;
- ``cut``: headers promising a body, half of it, then the connection closed (a server dying mid-response).

``refuse`` names request fields answered with OpenAI's own HTTP 400 ("Unrecognized request argument supplied")
whenever a request carries one of them. ``upstream=None`` answers 502 to what it would forward.

    with FaultProxy(server.url, faults=["503"]) as proxy:
        load_llm(..., base_url=proxy.url)
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _reply(self, status: int, body: bytes, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)

    def _forward(self, method: str, body: bytes | None) -> None:
        proxy = self.server.proxy
        if proxy.upstream is None:
            return self._reply(502, b'{"error": {"message": "no upstream"}}')
        req = urllib.request.Request(proxy.upstream + self.path.removeprefix("/v1"), data=body, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                self._reply(resp.status, resp.read())
        except urllib.error.HTTPError as e:
            self._reply(e.code, e.read())

    def do_GET(self):
        self._forward("GET", None)

    def do_POST(self):
        proxy = self.server.proxy
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        payload = json.loads(body or b"{}")
        with proxy.lock:
            proxy.requests.append(payload)
            fault = proxy.faults.pop(0) if proxy.faults else None
        refused = [k for k in proxy.refuse if k in payload]
        if refused:
            return self._reply(400, json.dumps({"error": {"message": f"Unrecognized request argument supplied: "
                                                                     f"{refused[0]}"}}).encode())
        if fault == "503":
            return self._reply(503, b'{"error": {"message": "overloaded"}}')
        if fault == "garbage":
            return self._reply(200, b"<html>502 Bad Gateway</html>")
        if fault == "not-a-completion":
            return self._reply(200, b'{"object": "error", "message": "model is loading"}')
        if fault == "cut":
            whole = b'{"choices": [{"text": "' + b"x" * 200 + b'"}]}'
            self._reply(200, whole[:40], length=len(whole))
            self.wfile.flush()
            self.close_connection = True
            return None
        self._forward("POST", body)


class FaultProxy:
    def __init__(self, upstream: str | None, faults=(), refuse=()):
        self.upstream = upstream.rstrip("/") if upstream else None
        self.faults, self.refuse = list(faults), tuple(refuse)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.proxy = self
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
