"""A loopback HTTP server for media-policy tests: serves files from a dict, redirects, and counts requests.

    with MediaServer("127.0.0.1", {"/a.png": data}, redirects={"/hop": "http://127.0.0.2:PORT/x"}) as server:
        server.url("/a.png"); server.requests  # the paths asked for, in order

`stream` paths send their body without a Content-Length, chunk after chunk, up to the given size: an input that
declares nothing about its size. No traffic leaves loopback.
"""

from __future__ import annotations

import http.server
import threading


class MediaServer:
    def __init__(self, host: str, files: dict[str, bytes] | None = None, *, redirects: dict[str, str] | None = None,
                 stream: dict[str, int] | None = None):
        self.files, self.redirects, self.stream = dict(files or {}), dict(redirects or {}), dict(stream or {})
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 - the name http.server calls
                server.requests.append(self.path)
                if self.path in server.redirects:
                    self.send_response(302)
                    self.send_header("Location", server.redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path in server.stream:
                    self.send_response(200)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    chunk = b"\0" * 65536
                    try:
                        for _ in range(server.stream[self.path] // len(chunk)):
                            self.wfile.write(chunk)
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # the reader stopped at its bound
                    self.close_connection = True
                elif self.path in server.files:
                    body = server.files[self.path]
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()

            def log_message(self, *args):  # quiet
                pass

        self._httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
        self._httpd.daemon_threads = True
        self.host, self.port = host, self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.root}{path}"

    def __enter__(self) -> MediaServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
