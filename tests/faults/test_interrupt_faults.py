"""Interruptions and what servers leave out (issue 20, points 3 and 4): a deadline for the whole HTTP
request, a clean Ctrl-C (exit 130, one line, a rerun resumes), and token counts a server did not
send shown as unknown, never as 0.

Every server here is a plain socket or `http.server` thread on 127.0.0.1 that misbehaves in exactly
the way under test; nothing leaves the machine.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

import pytest

from ctrlsim.errors import BackendUnavailableError

pytest.importorskip("openai")

HELLO = [[{"role": "user", "content": "Say hello."}]]
REPLY = {"choices": [{"message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 5, "completion_tokens": 1}}


class RawServer:
    """A one-behaviour HTTP server on a raw socket: `trickle="body"` sends the headers at once and the
    body one byte every `interval` s; `trickle="headers"` sends the status line and headers that way
    too; `trickle="hang"` reads the request and never answers. It counts requests and notes when a
    client closes its connection (the end of a request that was really aborted)."""

    def __init__(self, trickle: str, interval: float = 0.5, body: bytes | None = None):
        self.trickle, self.interval = trickle, interval
        self.body = body if body is not None else json.dumps(REPLY).encode()
        self.requests, self.closed = 0, 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self._threads: list[threading.Thread] = []

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:  # the 0.1 s accept timeout, or the socket closed by __exit__
                continue
            thread = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _read_request(self, conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(rest) < length:
            rest += conn.recv(65536)
        with self._lock:
            self.requests += 1
        return True

    def _send_slowly(self, conn: socket.socket, data: bytes) -> bool:
        """One byte per interval; False once the client has gone (it aborted the request)."""
        for byte in data:
            if self._stop.wait(self.interval):
                return False
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return False
        return True

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(60)
        try:
            if not self._read_request(conn):
                return
            head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(self.body)).encode() + b"\r\n\r\n")
            if self.trickle == "hang":
                while not self._stop.is_set():  # wait for the client to give up
                    conn.settimeout(0.1)
                    try:
                        if conn.recv(1) == b"":
                            break
                    except socket.timeout:
                        continue
                return
            if self.trickle == "headers":
                if not self._send_slowly(conn, head):
                    return
            else:
                conn.sendall(head)
            self._send_slowly(conn, self.body)
        except OSError:
            pass
        finally:
            with self._lock:
                self.closed += 1
            conn.close()

    def __enter__(self) -> "RawServer":
        thread = threading.Thread(target=self._serve, daemon=True)
        self._threads.append(thread)
        thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.sock.close()
        for thread in self._threads:
            thread.join(timeout=5)


def llm_for(server, **options):
    from ctrlsim.backends.openai_compat import OpenAICompatLLM

    return OpenAICompatLLM(server.url, model="fake-model", **options)


# ------------------------------------------------------------------ 1. a deadline for the whole request

@pytest.mark.parametrize("trickle", ["body", "headers"])
def test_a_trickling_server_times_out_at_the_deadline_on_every_attempt(trickle):
    """One byte every 0.5 s is inside the 1 s per-read timeout forever: the reply (~150 bytes) would
    take over a minute. With a 1 s deadline per request and 2 attempts, the call ends after about
    2 x 1 s + the 0.05 s backoff, and the error names the URL, the attempts and the deadline."""
    timeout, retries, backoff = 1.0, 1, 0.05
    with RawServer(trickle, interval=0.5) as server:
        trickle_seconds = len(server.body) * server.interval
        llm = llm_for(server, timeout=timeout, retries=retries, backoff=backoff)
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError) as err:
            llm.chat(HELLO)
        elapsed = time.monotonic() - started
        assert server.requests == retries + 1
    budget = (retries + 1) * timeout + backoff
    assert budget - 0.1 <= elapsed <= budget + 1.5, elapsed  # each attempt ran to its deadline, no longer
    assert elapsed < trickle_seconds / 10
    message = str(err.value)
    assert f"cannot reach {server.url}/chat/completions" in message
    assert "timed out after 2 attempts, each with a 1 s deadline for the whole request" in message


def test_the_deadline_error_names_the_url_without_its_credentials():
    with RawServer("body", interval=0.5) as server:
        url = server.url.replace("http://", "http://alice:s3cret@")
        from ctrlsim.backends.openai_compat import OpenAICompatLLM

        llm = OpenAICompatLLM(url, model="fake-model", timeout=0.5, retries=0)
        with pytest.raises(BackendUnavailableError) as err:
            llm.chat(HELLO)
    assert "s3cret" not in str(err.value) and "alice" not in str(err.value)
    assert "http://***@127.0.0.1" in str(err.value) and "0.5 s deadline" in str(err.value)


def test_a_server_that_answers_in_time_is_unaffected_by_the_deadline():
    with RawServer("body", interval=0.005) as server:  # ~150 bytes in under a second
        reply = llm_for(server, timeout=5.0, retries=0).chat(HELLO)[0]
    assert (reply.text, reply.prompt_tokens, reply.completion_tokens) == ("hello", 5, 1)


# ------------------------------------------------------------------ 2. an interrupt cancels what is in flight

class Interrupted(BaseException):
    """What the test's SIGINT handler raises: not an Exception, as KeyboardInterrupt is not."""


def test_an_interrupt_cancels_the_requests_in_flight_at_once():
    """A batch of 3 against a server that never answers, with a 30 s timeout and 4 retries: before,
    the pool waited for every in-flight request (minutes). A SIGINT after 0.5 s ends the call within
    a second, the pool's threads are gone, and the server sees every connection closed."""
    def interrupt(*_):
        raise Interrupted()

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        with RawServer("hang") as server:
            llm = llm_for(server, timeout=30.0, retries=4, max_concurrency=3)
            # kill(), not raise(): a process-directed signal reaches the main thread, where Ctrl-C lands
            timer = threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGINT))
            started = time.monotonic()
            timer.start()
            with pytest.raises(Interrupted):
                llm.chat(HELLO * 3)
            elapsed = time.monotonic() - started
            assert server.requests == 3
            wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("ctrlsim-openai")])
            wait_until(lambda: server.closed == 3)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert elapsed < 1.5, elapsed


def wait_until(condition, seconds: float = 2.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.02)


# ------------------------------------------------------------------ 2. Ctrl-C on a whole run (the CLI)

class FakeOpenAI:
    """An OpenAI-compatible server (`http.server`): `mode` "hang" holds every chat request until the
    client goes away, "answer" replies with REPLY, "no-usage" with REPLY less its `usage`."""

    def __init__(self, mode: str):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.mode, self.posts, self.in_flight = mode, 0, 0
        self.release = threading.Event()
        outer, lock = self, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send({"data": [{"id": "fake-model"}]})

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    outer.posts += 1
                    outer.in_flight += 1
                try:
                    if outer.mode == "hang":
                        outer.release.wait(60)
                        return
                    reply = dict(REPLY)
                    if outer.mode == "no-usage":
                        del reply["usage"]
                    self._send(reply)
                finally:
                    with lock:
                        outer.in_flight -= 1

            def _send(self, obj):
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "FakeOpenAI":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


# Python leaves SIGINT ignored in a child whose parent ignored it (a background job): the launcher
# gives the child the default Ctrl-C behaviour, as a terminal would, then runs the `ctrlsim` entry point.
LAUNCH = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
          "from ctrlsim.experiments.cli import main; sys.exit(main(sys.argv[1:]))")
RANDOM_KEY, LLM_KEY = "random|popularity|War|seed=0", "base-small|popularity|War|seed=0"


def ctrlbench_command(url: str, out) -> list[str]:
    """The smallest ctrlbench run with LLM probes: `random` (no LLM) first, then three `base-small`
    probes whose personas are written in one concurrent batch of requests to `url`; the JSON decision
    head, since the fake server only generates."""
    return [sys.executable, "-c", LAUNCH, "ctrlbench", "--methods", "random,base-small", "--recommenders",
            "popularity", "--targets", "War", "--agents", "3,3", "--rounds", "1", "--seeds", "0",
            "--llm", f"{url}#fake-model", "--decision", "json", "--out", str(out)]


def run_env(tmp_path) -> dict:
    return {**os.environ, "CTRLSIM_THREADS": "1", "CTRLSIM_CACHE": str(tmp_path / "cache")}


def record_keys(out) -> list[str]:
    path = out / "records.jsonl"
    if not path.exists():
        return []
    keys = []
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        try:
            keys.append(json.loads(line)["key"])
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return keys


def stderr_lines(text: str) -> list[str]:
    """Printed lines, progress-bar redraws (carriage returns) split apart, blanks dropped."""
    return [part.strip() for line in text.split("\n") for part in line.split("\r") if part.strip()]


def test_ctrl_c_during_a_run_exits_130_with_one_line_and_the_rerun_resumes(tmp_path):
    """SIGINT while three persona requests hang (the client's timeout is 120 s with 4 retries): the
    run stops within a few seconds, exits 130, prints one line naming the stored count and the folder
    and no traceback; the stored `random` record stays, and the same command then finishes only the
    LLM unit, the first record's line untouched."""
    pytest.importorskip("recbole")  # ml-100k comes from the recbole wheel
    import subprocess

    out, env = tmp_path / "run", run_env(tmp_path)
    with FakeOpenAI("hang") as server:
        with open(tmp_path / "stderr.txt", "w") as err, open(tmp_path / "stdout.txt", "w") as log:
            proc = subprocess.Popen(ctrlbench_command(server.url, out), env=env, stdout=log, stderr=err)
        try:
            deadline = time.monotonic() + 180
            while not (record_keys(out) == [RANDOM_KEY] and server.in_flight >= 2):
                assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
                assert time.monotonic() < deadline, "no request in flight within 3 minutes"
                time.sleep(0.05)
            stored = (out / "records.jsonl").read_bytes()
            started = time.monotonic()
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=30)
            elapsed = time.monotonic() - started
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stderr = (tmp_path / "stderr.txt").read_text()
        assert code == 130, stderr[-3000:]
        assert elapsed < 5.0, elapsed
        assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]
        expected = (f"ctrlsim: interrupted: 1 finished ctrlbench unit(s) are stored in {out}; "
                    "rerun the same command to resume")
        lines = stderr_lines(stderr)
        assert [line for line in lines if "interrupted" in line] == [expected]
        assert lines[-1] == expected
        assert record_keys(out) == [RANDOM_KEY] and (out / "records.jsonl").read_bytes() == stored

        server.mode = "answer"  # the same server (the same --llm), now answering
        server.release.set()
        rerun = subprocess.run(ctrlbench_command(server.url, out), env=env, capture_output=True, text=True,
                               timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert record_keys(out) == [RANDOM_KEY, LLM_KEY]  # random not recomputed, the LLM unit once
    assert (out / "records.jsonl").read_bytes().startswith(stored)


# ------------------------------------------------------------------ 3. token counts a server did not send

def _chat_once(server, cache=None):
    from ctrlsim.backends.openai_compat import OpenAICompatLLM

    llm = OpenAICompatLLM(server.url, model="fake-model", retries=0, timeout=5.0, cache=cache)
    reply = llm.chat(HELLO)[0]
    return reply, llm.meter.total


@pytest.mark.parametrize("usage", [None, {"prompt_tokens": 5}, {"completion_tokens": 1}, {}])
def test_a_reply_without_token_counts_is_a_call_with_unknown_tokens_not_zero(usage):
    body = dict(REPLY, usage=usage) if usage is not None else {k: v for k, v in REPLY.items() if k != "usage"}
    with RawServer("body", interval=0.0, body=json.dumps(body).encode()) as server:
        reply, total = _chat_once(server)
    assert reply.text == "hello"
    assert (reply.prompt_tokens, reply.completion_tokens) == ((usage or {}).get("prompt_tokens"),
                                                              (usage or {}).get("completion_tokens"))
    assert (total.calls, total.unknown_calls, total.known) == (1, 1, False)
    # What was reported still counts (a lower bound); nothing is invented for what was not.
    assert (total.prompt_tokens, total.completion_tokens) == ((usage or {}).get("prompt_tokens", 0),
                                                              (usage or {}).get("completion_tokens", 0))
    assert total.to_dict()["unknown_calls"] == 1


def test_a_reply_with_usage_gives_the_exact_counts_and_the_old_record_layout():
    with RawServer("body", interval=0.0) as server:
        reply, total = _chat_once(server)
    assert (reply.prompt_tokens, reply.completion_tokens) == (5, 1)
    assert total.to_dict() == {"prompt_tokens": 5, "completion_tokens": 1, "calls": 1, "cached_calls": 0,
                               "total_tokens": 6}  # no unknown_calls key: ordinary records keep their bytes
    assert list(total.to_dict()) == ["prompt_tokens", "completion_tokens", "calls", "cached_calls",
                                     "total_tokens"]


def test_a_cached_reply_of_a_call_without_counts_replays_the_unknown_status(tmp_path):
    from ctrlsim.backends.cache import ResponseCache

    body = json.dumps({k: v for k, v in REPLY.items() if k != "usage"}).encode()
    with RawServer("body", interval=0.0, body=body) as server:
        first, _ = _chat_once(server, ResponseCache(tmp_path / "responses.sqlite"))
        again, total = _chat_once(server, ResponseCache(tmp_path / "responses.sqlite"))
        assert server.requests == 1  # the second call came from the cache
    assert first.prompt_tokens is None and again.prompt_tokens is None and again.cached
    assert (total.calls, total.cached_calls, total.unknown_calls, total.total_tokens) == (1, 1, 1, 0)


def test_a_rating_without_usage_is_a_call_with_unknown_tokens():
    from ctrlsim.backends.openai_compat import OpenAICompatLLM

    top = [{"token": "4", "logprob": -0.1}, {"token": "3", "logprob": -2.4}]
    body = {"choices": [{"message": {"role": "assistant", "content": "4"}, "finish_reason": "length",
                         "logprobs": {"content": [{"token": "4", "logprob": -0.1, "top_logprobs": top}]}}]}
    with RawServer("body", interval=0.0, body=json.dumps(body).encode()) as server:
        llm = OpenAICompatLLM(server.url, model="fake-model", retries=0, timeout=5.0)
        rating = llm.rate(HELLO)[0]
    p4, p3 = 2.718281828 ** -0.1, 2.718281828 ** -2.4
    assert rating == pytest.approx((4 * p4 + 3 * p3) / (p4 + p3), rel=1e-6)
    assert (llm.meter.total.calls, llm.meter.total.unknown_calls) == (1, 1)


def test_unknown_token_figures_read_as_unknown_never_as_a_number():
    from ctrlsim.backends.meter import unknown_tokens

    assert unknown_tokens(3, 40) == "unknown (3 of 40 calls without counts)"
    assert unknown_tokens(1) == "unknown (1 call without counts)"
    assert unknown_tokens(3, at_least=True) == "unknown (≥3 calls without counts)"
    assert unknown_tokens(2, 9, known=1234) == "≥1,234 + unknown (2 of 9 calls without counts)"


def test_evolve_phase_and_calibrate_cost_tables_mark_unknown_token_totals():
    from ctrlsim.experiments.calibrate.report import cost_table
    from ctrlsim.experiments.evolve.report import _phase_tokens

    known = [{"tokens": {"total_tokens": 100, "calls": 4}}, {"tokens": {"total_tokens": 20, "calls": 1}}]
    assert _phase_tokens(known) == 120
    assert _phase_tokens(known + [{"tokens": {"total_tokens": 7, "calls": 3, "unknown_calls": 2}}]) == \
        "≥127 + unknown (2 of 8 calls without counts)"
    records = {f"u{n}": {"method": "llm-rewrite", "lambda": 0.0, "box": "dial", "timing": {"seconds": 1.0},
                         "details": {"scenarios": 2, "tokens": {"prompt": 10, "completion": 2, **extra}}}
               for n, extra in enumerate([{}, {"unknown_calls": 1}])}
    table = cost_table(None, records).markdown()
    assert "≥20 + unknown (1 call without counts)" in table  # prompt tokens 10 + 10: a lower bound
    assert "≥4 + unknown (1 call without counts)" in table
    assert "| 20 " not in table  # the prompt-token sum is never shown as a bare, measured-looking number
    known_only = cost_table(None, {"u0": records["u0"]}).markdown()
    assert "unknown" not in known_only and "| 10 " in known_only


class CountingServer(FakeOpenAI):
    """FakeOpenAI that tells persona (setup) requests from the probes' decisions by their system prompt."""

    def __init__(self, mode: str):
        super().__init__(mode)
        self.setup_posts = 0
        handler, outer = self.server.RequestHandlerClass, self
        answer = handler.do_POST

        def do_post(self):
            length = int(self.headers["Content-Length"])
            raw = self.rfile.read(length)
            if "user profile expert" in json.loads(raw)["messages"][0]["content"]:
                outer.setup_posts += 1
            import io

            self.rfile = io.BytesIO(raw)
            answer(self)

        handler.do_POST = do_post


@pytest.mark.parametrize("mode", ["no-usage", "answer"])
def test_table7_shows_tokens_a_server_did_not_send_as_unknown(mode, tmp_path):
    """The same tiny ctrlbench run against a server that sends `usage` (5 + 1 per call) and one that
    sends none: with counts, Table 7's Tokens and Setup cells are computed from the server's own
    request tally; without, they say unknown, with the number of calls."""
    pytest.importorskip("recbole")
    import subprocess

    from ctrlsim.experiments.tables import markdown_tables

    out = tmp_path / "run"
    with CountingServer(mode) as server:
        done = subprocess.run(ctrlbench_command(server.url, out), env=run_env(tmp_path), capture_output=True,
                              text=True, timeout=300)
        posts, setup = server.posts, server.setup_posts
    assert done.returncode == 0, done.stderr[-3000:]
    table = markdown_tables(done.stdout)["Table 7: all methods at t = 1, per black box"]
    row = table[table["Method"].str.startswith("Base-Small")].iloc[0]  # marked †: "hello" likes nothing
    text = (out / "records.jsonl").read_text(encoding="utf-8")
    lines = [json.loads(line) for line in text.splitlines()[1:]]
    record = next(line["record"] for line in lines if line["key"].startswith("base-small"))
    checks = record["validity"]["check_usage"]["calls"]  # the validity checks' calls are reported apart
    decisions, k = posts - setup - checks, 3
    assert checks > 0
    assert decisions > 0 and setup > 0
    if mode == "answer":
        assert row["Tokens"] == f"{round(6 * decisions / k)} ± n/a"
        assert row["Setup tokens/probe"] == f"{round(6 * setup / k)} ± n/a"
    else:
        assert row["Tokens"] == f"unknown ({decisions} of {decisions} calls without counts)"
        # at least one call per persona (here each took a retry too: a "hello" is no persona)
        assert row["Setup tokens/probe"] == f"unknown (≥{k} calls without counts)" and setup >= k
    random_row = table[table["Method"].str.startswith("Random")].iloc[0]
    assert random_row["Tokens"] == "0 (no LLM)"
