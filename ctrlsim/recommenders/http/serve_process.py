"""`ctrlsim serve BOX` in a child process, for rehearsals, tests and benchmarks: `with ServedBox("dial:1")
as served: make_recommender(served.url, dataset)`. It picks a free port on 127.0.0.1, waits until
`/health` answers, and stops the server with SIGINT (as Ctrl-C would) when the block ends.

`ServedApp(app)` serves an app built in this process (`serve.make_app`: a box of your own, or
`contract="1"` for a service that predates version 2) on a free port of 127.0.0.1, in a thread."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from ctrlsim.errors import BackendUnavailableError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServedBox:
    """A served black box in a child process (see the module docstring)."""

    def __init__(self, box: str, *flags: str, env: dict[str, str] | None = None, timeout: float = 300.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable,
            "-m",
            "ctrlsim.experiments.cli",
            "serve",
            box,
            "--port",
            str(self.port),
            *flags,
        ]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        try:
            self._wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self, timeout: float) -> None:
        import httpx2

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BackendUnavailableError(
                    f"ctrlsim serve exited with {self.process.returncode}: "
                    f"{(self.process.stderr.read() if self.process.stderr else '')[-2000:]}"
                )
            try:
                if httpx2.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            time.sleep(0.1)
        raise BackendUnavailableError(f"ctrlsim serve at {self.url} did not answer /health in {timeout:g} s")

    def stop(self) -> int:
        """Stop the server (SIGINT, then SIGKILL after 20 s); its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return self.process.returncode

    def __enter__(self) -> "ServedBox":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class ServedApp:
    """An app of `serve.make_app` served by uvicorn in a thread of this process, on a free port of
    127.0.0.1, until `stop()` or the end of the `with` block (see the module docstring)."""

    def __init__(self, app, timeout: float = 60.0):
        import uvicorn

        from ctrlsim.recommenders.http.serve import listen, url_of

        self.sock = listen("127.0.0.1", 0)
        self.url = url_of(self.sock, "127.0.0.1")
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise BackendUnavailableError(f"the app at {self.url} did not start in {timeout:g} s")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.sock.close()

    def __enter__(self) -> "ServedApp":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
