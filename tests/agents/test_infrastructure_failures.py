"""Failure semantics of an episode: an infrastructure failure (an LLM server that stops, refuses,
drops connections or answers malformed bodies) propagates out of `play_population`, so the
runner fails the unit; only a probe's own deterministic failure (an unparseable reply, a prompt
beyond the context, a bad action) is a skipped round or a dropped probe inside a finished trace.

The LLM is a real HTTP server on 127.0.0.1 (stdlib `http.server` in a thread) speaking enough of
the OpenAI chat-completions API for `load_llm("http://127.0.0.1:<port>/v1#model")`. Its answer to
each request is decided by the probe (the persona's name in the prompt) and the round, so the
counts below do not depend on the order in which concurrent requests arrive.
"""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from ctrlsim.agents import Population, play_population
from ctrlsim.agents.persona import Persona
from ctrlsim.agents.profiles import ProfileGenerator
from ctrlsim.envs import PopulationEnv, TargetDiscovery

from ctrlsim.backends import TokenMeter, load_llm
from ctrlsim.errors import (
    PROBE_FAILURES,
    AgentFailure,
    BackendUnavailableError,
    BudgetExceededError,
    ConfigError,
    CtrlsimError,
    InvalidAction,
    LLMOutputError,
    ModelError,
    PromptTooLongError,
    ServerResponseError,
    UnknownItemError,
    is_probe_failure,
)

pytest.importorskip("openai")
pytestmark = pytest.mark.timeout(120)

MODEL = "fake-model"
# Fast, bounded request loops: 2 attempts per request, 10 ms backoff, 5 s per request.
FAST = {"retries": 1, "backoff": 0.01, "timeout": 5.0}
LIKE_FIRST = '{"like": [1], "search": ""}'
GARBAGE = "I would pick the first one, I think!"  # prose: no JSON object
TOO_LONG = ("status", 400, {"error": {"message": "This model's maximum context length is 4096 tokens. "
                                      "However, you requested 9000 tokens.", "type": "BadRequestError",
                                      "code": 400}})


def completion(content: str) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}


def probe_and_round(body: dict) -> tuple[str, int]:
    """("User 2", 1) from the user message of a decision prompt."""
    text = body["messages"][-1]["content"]
    name = re.search(r"Your persona: (.+?)\. ", text).group(1)
    return name, int(re.search(r"Round (\d+) of", text).group(1))


class FakeServer:
    """An OpenAI-compatible chat server on 127.0.0.1 whose answers come from `route(body)`.

    `route` returns ("ok", content), ("status", code, json body), ("raw", text) or ("drop",)
    (close the connection without an answer). `answer_limit`: after that many chat requests
    were answered, every further one is dropped (a server crashing mid-run). `requests` counts
    every chat request that reached the server, `answered` those that got an HTTP answer.
    """

    def __init__(self, route=lambda body: ("ok", LIKE_FIRST), answer_limit: int | None = None):
        self.route, self.answer_limit = route, answer_limit
        self.requests, self.answered, self.bodies = 0, 0, []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send(200, json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.requests += 1
                    outer.bodies.append(body)
                    crashed = outer.answer_limit is not None and outer.answered >= outer.answer_limit
                    action = ("drop",) if crashed else outer.route(body)
                    if action[0] != "drop":
                        outer.answered += 1
                if action[0] == "ok":
                    self._send(200, json.dumps(completion(action[1])))
                elif action[0] == "status":
                    self._send(action[1], json.dumps(action[2]))
                elif action[0] == "raw":
                    self._send(200, action[1])
                else:  # drop: close the connection without any answer
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)

            def _send(self, status, text):
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.running = False

    def llm(self, **options):
        return load_llm(f"{self.url}#{MODEL}", **{**FAST, **options})

    def stop(self) -> None:
        """Shut the server down: from now on connections to its port are refused."""
        if self.running:
            self.running = False
            self.server.shutdown()
            self.server.server_close()

    def __enter__(self):
        self.thread.start()
        self.running = True
        return self

    def __exit__(self, *exc):
        self.stop()


@pytest.fixture(scope="module")
def personas(ml100k):
    gen = ProfileGenerator(ml100k, None)
    return tuple(gen.template_persona(u, gen.seed_items(u, 0)) for u in ("1", "2", "3"))


def population_env(pop_rec, budget=3, n_agents=3):
    meter = TokenMeter()
    return PopulationEnv(pop_rec, n_agents=n_agents, target="War", budget=budget, token_meter=meter), meter


def play(env, meter, personas, llm, on_round=None):
    return play_population(env, Population(tuple(personas)), seed=0, target=("War",), llm=llm, meter=meter,
                           on_round=on_round)


# ------------------------------------------------------------------ the definition itself

def test_probe_failures_name_only_the_probes_own_deterministic_failures():
    assert set(PROBE_FAILURES) == {LLMOutputError, BudgetExceededError, InvalidAction, AgentFailure}
    assert is_probe_failure(LLMOutputError("no JSON object in the reply", "hi"))
    assert is_probe_failure(PromptTooLongError("prompt of 5000 tokens does not fit the context of 4096"))
    assert isinstance(PromptTooLongError("x"), ConfigError)  # still a ConfigError for up-front checks
    for infrastructure in (BackendUnavailableError("cannot reach http://127.0.0.1:9/v1"),
                           ServerResponseError("invalid JSON"), ModelError("cannot load"),
                           ConfigError("bad option"), UnknownItemError(["x"]), RuntimeError("a bug"),
                           MemoryError()):
        assert not is_probe_failure(infrastructure), infrastructure
    assert issubclass(BackendUnavailableError, ModelError) and not issubclass(ServerResponseError,
                                                                              LLMOutputError)


# ------------------------------------------------------------------ infrastructure: the unit fails

def test_a_server_stopped_mid_episode_fails_the_episode(ml100k, pop_rec, personas):
    rounds_done = []

    with FakeServer() as server:
        def stop_after_first_round(round_no, trace):
            rounds_done.append(round_no)
            server.stop()

        env, meter = population_env(pop_rec)
        started = time.perf_counter()
        with pytest.raises(BackendUnavailableError) as err:
            play(env, meter, personas, server.llm(), on_round=stop_after_first_round)
    assert time.perf_counter() - started < 30
    # Round 1: one answered request per probe; round 2 found the port closed (refused, never served).
    assert rounds_done == [1] and server.requests == server.answered == 3
    assert re.search(rf"cannot reach http://127\.0\.0\.1:{server.port}/v1/chat/completions "
                     r"\(connection failed after 2 attempts\)", str(err.value))
    assert env.failures == {}  # no probe was dropped: the step raised instead
    assert env.agents == ["probe_0", "probe_1", "probe_2"]


def test_a_server_that_crashes_inside_a_batch_fails_the_step_not_the_unanswered_probes(ml100k, pop_rec,
                                                                                       personas):
    with FakeServer(answer_limit=4) as server:
        env, meter = population_env(pop_rec)
        with pytest.raises(BackendUnavailableError, match=r"connection failed after 2 attempts"):
            # One request at a time, so the count is exact: round 1 answers 3 probes; round 2
            # answers probe 0, then probe 1's request is dropped twice (2 attempts) and the step raises.
            play(env, meter, personas, server.llm(max_concurrency=1))
    assert (server.answered, server.requests) == (4, 6)
    assert env.failures == {}
    # No per-probe retry after the failed batch: the two dropped requests are both probe 1's round 2.
    assert [probe_and_round(b) for b in server.bodies[4:]] == [("User 2", 2), ("User 2", 2)]


def test_persistent_5xx_fails_the_episode_after_the_retries(ml100k, pop_rec, personas):
    def route(body):
        name, round_no = probe_and_round(body)
        return ("status", 503, {"error": "overloaded"}) if round_no == 2 else ("ok", LIKE_FIRST)

    with FakeServer(route) as server:
        env, meter = population_env(pop_rec)
        with pytest.raises(BackendUnavailableError, match=r"/v1/chat/completions: HTTP 503 after 2 attempts"):
            play(env, meter, personas, server.llm(max_concurrency=1))
    assert server.requests == 3 + 2  # round 1, then probe 0's round 2 twice
    assert env.failures == {}


def test_a_malformed_server_reply_fails_the_episode(ml100k, pop_rec, personas):
    def route(body):
        name, _ = probe_and_round(body)
        return ("raw", "<html>502 Bad Gateway</html>") if name == "User 2" else ("ok", LIKE_FIRST)

    with FakeServer(route) as server:
        env, meter = population_env(pop_rec)
        with pytest.raises(ServerResponseError, match="invalid JSON"):
            play(env, meter, personas, server.llm(max_concurrency=1))
    assert server.requests == 2  # probe 0, then probe 1's malformed answer: not retried, not a drop
    assert env.failures == {}


def test_an_unreachable_server_fails_fast():
    started = time.perf_counter()
    llm = load_llm("http://127.0.0.1:9/v1#m", **FAST)  # the model is named: nothing is sent yet
    refused = r"cannot reach http://127\.0\.0\.1:9/v1/chat/completions \(connection failed after 2 attempts\)"
    with pytest.raises(BackendUnavailableError, match=refused):
        llm.chat([[{"role": "user", "content": "hello"}]])
    with pytest.raises(BackendUnavailableError, match=r"cannot reach http://127\.0\.0\.1:9/v1/models"):
        load_llm("http://127.0.0.1:9/v1", **FAST)  # no model named: the first call asks for one
    assert time.perf_counter() - started < 10


def test_an_unreachable_server_fails_the_episode(ml100k, pop_rec, personas):
    env, meter = population_env(pop_rec)
    with pytest.raises(BackendUnavailableError, match=r"127\.0\.0\.1:9/v1"):
        play(env, meter, personas, load_llm("http://127.0.0.1:9/v1#m", **FAST))
    assert env.failures == {} and meter.total.total_tokens == 0


def test_an_error_of_the_black_box_side_inside_a_step_propagates(ml100k, pop_rec):
    class BrokenTask(TargetDiscovery):
        def step_reward(self, record, new_likes, slate):
            raise UnknownItemError(["no-such-item"])  # a CtrlsimError, but not the probe's failure

    env = PopulationEnv(pop_rec, n_agents=2, task=BrokenTask(ml100k, target="War"), budget=2)
    env.reset(seed=0)
    like_first = {"likes": np.array([1, 0, 0], dtype=np.int8), "query": ""}
    with pytest.raises(UnknownItemError):
        env.step({"probe_0": like_first, "probe_1": like_first})
    assert env.failures == {}


# ------------------------------------------------------------- the probe's own failures: a finished trace

def test_unparseable_replies_are_skipped_rounds_counted_in_the_trace(ml100k, pop_rec, personas):
    def route(body):
        name, round_no = probe_and_round(body)
        if name == "User 1" or (name == "User 2" and round_no == 2):
            return ("ok", GARBAGE)
        return ("ok", LIKE_FIRST)

    with FakeServer(route) as server:
        env, meter = population_env(pop_rec)
        trace = play(env, meter, personas, server.llm())
    assert server.requests == server.answered == 9  # 3 probes x 3 rounds, nothing retried
    first, second, third = trace.probes
    assert [p.dropped for p in trace.probes] == [None, None, None] and env.failures == {}
    # By hand: User 1 answers prose every round, User 2 in round 2 only, User 3 never.
    counts = [(p.stats["decisions"], p.stats["parse_failures"]) for p in trace.probes]
    assert counts == [(3, 3), (3, 1), (3, 0)]
    assert [[len(r) for r in p.likes_per_round] for p in trace.probes] == [[0, 0, 0], [1, 0, 1], [1, 1, 1]]
    assert len(first.stats["failure_examples"]) == 3
    assert first.stats["failure_examples"][0].startswith("no JSON object in the reply; reply was: "
                                                         "'I would pick the first one")
    assert second.stats["failure_examples"] == [first.stats["failure_examples"][0]]
    # Every reply is metered (5 prompt + 1 completion tokens), parsed or not.
    assert [p.tokens_per_round for p in trace.probes] == [[6, 12, 18]] * 3
    assert third.likes_per_round[0] == [str(ml100k.item_ids[env.probes["probe_2"].record.slates[0][0]])]


def test_a_prompt_beyond_the_context_drops_only_that_probe(ml100k, pop_rec, personas):
    huge = Persona.from_dict({**personas[1].to_dict(), "bio": "noir " * 50})

    def route(body):
        return TOO_LONG if "noir noir" in body["messages"][-1]["content"] else ("ok", LIKE_FIRST)

    with FakeServer(route) as server:
        env, meter = population_env(pop_rec)
        trace = play(env, meter, (personas[0], huge, personas[2]), server.llm(max_concurrency=1))
    ok, dropped, ok2 = trace.probes
    # Round 1: the batch stops at probe 1's HTTP 400 (not retried), then each probe is asked alone
    # (3 requests); rounds 2 and 3 ask the two probes left.
    assert server.requests == 2 + 3 + 2 + 2
    assert dropped.dropped is not None and dropped.dropped.startswith("LLM call failed: PromptTooLongError: ")
    assert "maximum context length" in dropped.dropped and dropped.dropped_round == 1
    assert env.failures == {"probe_1": dropped.dropped}
    assert ok.dropped is None and ok2.dropped is None
    assert [p.stats["decisions"] for p in trace.probes] == [3, 0, 3]


def test_the_probe_failure_tuple_is_what_the_catch_sites_absorb(ml100k, pop_rec):
    """A policy's own failure reported with env.drop, and a bad action, drop one probe; the env goes on."""
    env = PopulationEnv(pop_rec, n_agents=3, target="War", budget=2)
    env.reset(seed=0)
    env.drop("probe_0", f"{AgentFailure.__name__}: gave up")
    like_first = {"likes": np.array([1, 0, 0], dtype=np.int8), "query": ""}
    _, _, terms, _, infos = env.step({"probe_1": {"likes": [2, 0, 0]}, "probe_2": like_first})
    assert terms == {"probe_0": True, "probe_1": True, "probe_2": False}
    assert infos["probe_1"]["failure"].startswith("InvalidAction: 'likes' must hold 0 or 1")
    assert isinstance(InvalidAction("x"), CtrlsimError) and env.agents == ["probe_2"]
