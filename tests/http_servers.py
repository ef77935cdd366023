"""Recommender services for the HTTP black-box tests: a real `ctrlsim serve` process, and a small
stateless service of our own that misbehaves on purpose (`FaultyService`)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ctrlsim.recommenders.http.serve_process import ServedBox, free_port  # noqa: F401 - re-exported for tests


class FaultyService:
    """A stateless recommender service (popularity order from an in-process box) whose faults are
    switched on by attributes: `down`, `delay` (seconds), `throttle` (429s to send before answering,
    with `retry_after`), `break_with` ("malformed", "unknown", "duplicate", "short", "not-json"),
    `shift` (answers rotate by one more item each request: a service that changes its answers).
    `requests` counts the /recommend requests it answered; `authorization` keeps the last header."""

    def __init__(self, dataset, box: str = "popularity"):
        from ctrlsim.recommenders import make_recommender

        self.box = make_recommender(box, dataset)
        self.down = False
        self.delay = 0.0
        self.throttle = 0
        self.retry_after = "0.05"
        self.break_with: str | None = None
        self.shift = False
        self.requests = 0
        self.throttled = 0
        self.authorization: str | None = None
        self._lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body, headers: dict | None = None) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"status": "ok", "modes": ["stateless"], "box": {}, "items": 0})

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                service.authorization = self.headers.get("Authorization")
                if service.down:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if service.delay:
                    time.sleep(service.delay)
                with service._lock:
                    if service.throttle > 0:
                        service.throttle -= 1
                        service.throttled += 1
                        self._send(429, {"detail": "slow down"}, {"Retry-After": service.retry_after})
                        return
                    service.requests += 1
                    turn = service.requests
                self._send(200, service.answer(body, turn))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, body: dict, turn: int):
        from ctrlsim.recommenders import UserState

        if self.break_with == "not-json":
            return b"<html>oops</html>"
        if self.break_with == "malformed":
            return {"lists": [{"items": [1, 2, 3]}]}
        states = [UserState(history=tuple(s["history"]), shown=tuple(s["shown"])) for s in body["states"]]
        self.box.mask_shown, self.box.exclude_history = body["mask_shown"], body["exclude_history"]
        k = body["k"]
        slates = self.box.recommend(states, k + (turn if self.shift else 0))
        lists = []
        for slate in slates:
            items = slate.item_ids[turn : turn + k] if self.shift else slate.item_ids
            if self.break_with == "unknown":
                items = ["no-such-item", *items[1:]]
            elif self.break_with == "duplicate":
                items = [items[0], *items[:-1]]
            elif self.break_with == "short":
                items = items[:-1]
            lists.append({"items": items})
        return {"lists": lists}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_folder_text(folder: Path) -> str:
    """Every file of a run folder as text (binary files decoded leniently), for secret checks."""
    return "\n".join(
        p.read_bytes().decode("utf-8", "replace") for p in sorted(Path(folder).rglob("*")) if p.is_file()
    )


def ctrlbench_curves(folder: Path) -> dict:
    """A ctrlbench run folder's curves by (method, seed), to compare two runs record for record."""
    rows = [json.loads(line) for line in (Path(folder) / "records.jsonl").read_text().splitlines()[1:]]
    return {(r["record"]["method"], r["record"]["seed"]): r["record"]["curves"] for r in rows}
