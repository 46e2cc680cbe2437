"""A local HTTP server for tests that stand in for a metadata server (train/stop.py's maintenance watcher)."""

import http.server
import threading


def serve(respond):
    """A server on a free loopback port, answering every GET with respond(handler) -> (status, body bytes);
    the caller shuts it down."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = respond(self)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
