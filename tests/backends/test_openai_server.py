"""The OpenAI-compatible runtime: concurrency and caching against real llama.cpp servers, faults
against a scripted HTTP server that answers with exactly the failure under test."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from llama_servers import free_port, start_server, wait_ready

from ctrlsim.backends.bundled import bundled_llm_path
from ctrlsim.backends.cache import ResponseCache
from ctrlsim.backends.openai_compat import OpenAICompatLLM, parse_base_urls
from ctrlsim.errors import (
    BackendUnavailableError,
    ConfigError,
    ModelError,
    ModelNotFoundError,
    PromptTooLongError,
    ServerResponseError,
    is_probe_failure,
)

pytest.importorskip("openai")

HELLO = [[{"role": "user", "content": "Say hello."}]]
GOOD_REPLY = {"choices": [{"message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 5, "completion_tokens": 1}}


# ------------------------------------------------------------------- a scripted, misbehaving server

class ScriptedServer:
    """Answers POST /v1/chat/completions with the next scripted action; records every request."""

    def __init__(self, script):
        self.script, self.requests = list(script), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send(200, json.dumps({"data": [{"id": "scripted-model"}]}))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                action = outer.script.pop(0) if outer.script else ("ok",)
                kind = action[0]
                if kind == "ok":
                    self._send(200, json.dumps(GOOD_REPLY))
                elif kind == "status":  # ("status", code[, headers[, body]])
                    error = action[3] if len(action) > 3 else {"error": "scripted"}
                    self._send(action[1], json.dumps(error), headers=action[2:] and action[2])
                elif kind == "raw":
                    self._send(200, action[1])
                elif kind == "drop":  # close the connection without any answer
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif kind == "llama-cpp-schema":  # answers every request the way llama-cpp-python's
                    outer.script.insert(0, action)  # server does: OpenAI's json_schema form is rejected
                    if body.get("response_format", {}).get("type") == "json_schema":
                        message = ("1 validation error: response_format type: "
                                   "Input should be 'text' or 'json_object'")
                        self._send(500, json.dumps({"error": {"message": message}}))
                    else:
                        self._send(200, json.dumps(GOOD_REPLY))
                elif kind == "sleep":
                    time.sleep(action[1])
                    self._send(200, json.dumps(GOOD_REPLY))

            def _send(self, status, text, headers=None):
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def scripted_llm(server, **options):
    options = {"retries": 2, "backoff": 0.01, "timeout": 5.0, **options}
    return OpenAICompatLLM(server.url, model="scripted-model", **options)


@pytest.mark.parametrize("failure", [("status", 503), ("status", 429, {"Retry-After": "0"}), ("drop",),
                                     ("status", 502)])
def test_transient_failures_are_retried(failure):
    with ScriptedServer([failure, failure]) as server:
        reply = scripted_llm(server).chat(HELLO)[0]
    assert reply.text == "hello" and len(server.requests) == 3


def test_persistent_5xx_makes_the_backend_unavailable_naming_the_server():
    with ScriptedServer([("status", 500)] * 3) as server:
        where = r"127\.0\.0\.1:\d+/v1/chat/completions"
        with pytest.raises(BackendUnavailableError, match=where + ": HTTP 500 after 3 attempts") as err:
            scripted_llm(server).chat(HELLO)
    assert len(server.requests) == 3
    assert isinstance(err.value, ModelError) and not is_probe_failure(err.value)


def test_client_errors_are_not_retried():
    with ScriptedServer([("status", 400)]) as server:
        with pytest.raises(ModelError, match="HTTP 400") as err:
            scripted_llm(server).chat(HELLO)
    assert len(server.requests) == 1
    assert type(err.value) is ModelError and not is_probe_failure(err.value)  # fails the unit at once


@pytest.mark.parametrize("message", [
    "This model's maximum context length is 4096 tokens. However, you requested 9000 tokens.",  # vLLM
    "the request exceeds the available context size, try increasing it",  # llama.cpp server
])
def test_a_prompt_beyond_the_context_is_the_probes_failure(message):
    with ScriptedServer([("status", 400, None, {"error": {"message": message}})]) as server:
        with pytest.raises(PromptTooLongError, match="HTTP 400") as err:
            scripted_llm(server).chat(HELLO)
    assert len(server.requests) == 1 and is_probe_failure(err.value) and isinstance(err.value, ConfigError)


def test_timeout_per_request():
    with ScriptedServer([("sleep", 2.0)]) as server:
        with pytest.raises(BackendUnavailableError,
                           match=r"cannot reach .* \(timed out after 1 attempt, "
                                 r"each with a 0\.3 s deadline for the whole request\)"):
            scripted_llm(server, timeout=0.3, retries=0).chat(HELLO)


def test_dropped_connections_after_the_retries_make_the_backend_unavailable():
    with ScriptedServer([("drop",)] * 3) as server:
        with pytest.raises(BackendUnavailableError,
                           match=r"cannot reach .* \(connection failed after 3 attempts\)"):
            scripted_llm(server).chat(HELLO)
    assert len(server.requests) == 3


@pytest.mark.parametrize("body, problem", [
    ("<html>busy</html>", "invalid JSON"),
    (json.dumps({"id": "x", "object": "chat.completion"}), "no 'choices'"),
    (json.dumps({"choices": []}), "no 'choices'"),
    (json.dumps([1, 2]), "not an object"),
])
def test_malformed_replies_are_typed_errors(body, problem):
    with ScriptedServer([("raw", body)]) as server:
        with pytest.raises(ServerResponseError, match=problem):
            scripted_llm(server).chat(HELLO)
    assert len(server.requests) == 1  # a malformed body is not a transient fault


def test_request_body_carries_the_generation_parameters_and_schema():
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    with ScriptedServer([]) as server:
        llm = scripted_llm(server)
        llm.chat(HELLO, max_tokens=7, temperature=0.5, seed=3, stop=["\n"], json_schema=schema)
    body = server.requests[0]
    assert (body["model"], body["max_tokens"], body["temperature"], body["seed"], body["stop"]) == \
        ("scripted-model", 7, 0.5, 3, ["\n"])
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "reply", "schema": schema, "strict": True}}


def test_schema_falls_back_to_the_llama_cpp_form_once_for_a_concurrent_batch():
    schema = {"type": "object", "properties": {"title": {"type": "string"}}}
    with ScriptedServer([("llama-cpp-schema",)]) as server:
        llm = scripted_llm(server, max_concurrency=3)
        replies = llm.chat(HELLO * 3, json_schema=schema)
        llm.chat([[{"role": "user", "content": "Again."}]], json_schema=schema)
    assert [r.text for r in replies] == ["hello"] * 3
    kinds = [r["response_format"]["type"] for r in server.requests]
    # At most one rejected request per conversation in flight (no retries of a validation error),
    # then the json_object form for the rest, including later calls.
    assert 1 <= kinds.count("json_schema") <= 3 and kinds.count("json_object") == 4
    assert server.requests[-1]["response_format"] == {"type": "json_object", "schema": schema}


def test_model_is_read_from_the_server_when_not_given():
    with ScriptedServer([]) as server:
        llm = OpenAICompatLLM(server.url)
    assert llm.model == "scripted-model" and llm.identity["base_url"] == server.url


def test_unreachable_server_makes_the_backend_unavailable():
    with pytest.raises(BackendUnavailableError, match="cannot reach http://127.0.0.1"):
        OpenAICompatLLM(f"http://127.0.0.1:{free_port()}/v1", retries=1, backoff=0.01)


def test_a_server_with_no_models_is_a_model_not_found():
    with ScriptedServer([]) as server:
        handler = server.server.RequestHandlerClass
        handler.do_GET = lambda self: self._send(200, json.dumps({"data": []}))  # this server's class only
        with pytest.raises(ModelNotFoundError, match="serves no models"):
            OpenAICompatLLM(server.url)


def test_a_server_without_logprobs_cannot_rate_and_that_is_the_servers_failure():
    with ScriptedServer([]) as server:  # GOOD_REPLY has no logprobs
        with pytest.raises(ServerResponseError, match="returned no logprobs") as err:
            scripted_llm(server).rate([[{"role": "user", "content": "Rate Heat (1995) from 0 to 5."}]])
    assert not is_probe_failure(err.value)


@pytest.mark.parametrize("urls, message", [("", "no server URL"), ("ftp://x/v1", "must start with http"),
                                           ("http://a/v1,http://a/v1/", "more than once")])
def test_bad_urls(urls, message):
    with pytest.raises(ConfigError, match=message):
        parse_base_urls(urls)


def test_bad_options():
    with pytest.raises(ConfigError, match="max_concurrency"):
        OpenAICompatLLM("http://127.0.0.1:9/v1", model="m", max_concurrency=0)


# ------------------------------------------------------------------ real llama.cpp servers

@pytest.fixture(scope="module")
def two_slots(tmp_path_factory):
    """Two parallel slots serving smollm2-135m: llama-cpp-python's server answers one request at a
    time, so each slot is its own `python -m llama_cpp.server` process, given as two replicas."""
    pytest.importorskip("llama_cpp.server", exc_type=ImportError)
    try:
        model = bundled_llm_path("smollm2-135m")
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    folder = tmp_path_factory.mktemp("servers")
    servers = [start_server(model, folder / f"server{i}.log") for i in range(2)]
    try:
        for i, (proc, _, url) in enumerate(servers):
            wait_ready(proc, url, folder / f"server{i}.log", time.time() + 120)
        yield [url for _, _, url in servers]
    finally:
        for proc, log, _ in servers:
            proc.terminate()
            proc.wait(timeout=10)
            log.close()


class TimedLLM(OpenAICompatLLM):
    """Records when each request was in flight and which replica it went to."""

    def __init__(self, *args, **kwargs):
        self.spans: list[tuple[float, float]] = []
        self.replicas_used: list[str] = []
        super().__init__(*args, **kwargs)

    def _acquire(self):
        replica = super()._acquire()
        self.replicas_used.append(replica.url)
        return replica

    def _chat_completion(self, body):
        start = time.perf_counter()
        try:
            return super()._chat_completion(body)
        finally:
            self.spans.append((start, time.perf_counter()))


def _overlaps(spans) -> bool:
    spans = sorted(spans)
    return any(later_start < earlier_end for (_, earlier_end), (later_start, _) in zip(spans, spans[1:]))


BATCH = [[{"role": "user", "content": f"Name one film about {topic}."}]
         for topic in ("trains", "the sea", "chess", "winter")]


@pytest.mark.llm
def test_batch_is_answered_concurrently_by_two_slots(two_slots):
    both = ",".join(two_slots)
    serial = TimedLLM(both, max_concurrency=1)
    started = time.perf_counter()
    serial_replies = serial.chat(BATCH, max_tokens=12)
    serial_seconds = time.perf_counter() - started
    parallel = TimedLLM(both, max_concurrency=2)
    started = time.perf_counter()
    parallel_replies = parallel.chat(BATCH, max_tokens=12)
    parallel_seconds = time.perf_counter() - started
    print(f"\n4 conversations: {serial_seconds:.2f} s one at a time, {parallel_seconds:.2f} s two at a time "
          f"(x{serial_seconds / parallel_seconds:.2f})")
    assert not _overlaps(serial.spans)
    assert _overlaps(parallel.spans)  # requests were in flight at the same time ...
    assert set(parallel.replicas_used) == set(two_slots)  # ... on both slots
    # Greedy decoding: the same replies, in the batch's order, however they were sent.
    assert [r.text for r in parallel_replies] == [r.text for r in serial_replies]
    assert all(r.completion_tokens > 0 for r in parallel_replies)


@pytest.mark.llm
def test_response_cache_replays_bit_identically(two_slots, tmp_path):
    cache_path = tmp_path / "responses.sqlite"
    first = TimedLLM(two_slots[0], max_concurrency=2, cache=ResponseCache(cache_path))
    replies = first.chat(BATCH, max_tokens=12)
    ratings = first.rate([[{"role": "user", "content": f"Rate the film {t} from 0 to 5."}]
                          for t in ("Heat (1995)", "Fargo (1996)")])
    assert not any(r.cached for r in replies) and len(first.spans) == 6
    again = TimedLLM(two_slots[0], max_concurrency=2, cache=ResponseCache(cache_path))
    replayed = again.chat(BATCH, max_tokens=12)
    replayed_ratings = again.rate([[{"role": "user", "content": f"Rate the film {t} from 0 to 5."}]
                                   for t in ("Heat (1995)", "Fargo (1996)")])
    assert again.spans == []  # nothing went to the server
    assert all(r.cached for r in replayed)
    assert [(r.text, r.prompt_tokens, r.completion_tokens, r.finish_reason) for r in replayed] == \
        [(r.text, r.prompt_tokens, r.completion_tokens, r.finish_reason) for r in replies]
    assert np.array_equal(replayed_ratings, ratings)  # the same float64 bits
    assert again.meter.total.prompt_tokens == first.meter.total.prompt_tokens


@pytest.mark.llm
def test_json_schema_reaches_llama_cpp_server(two_slots):
    llm = OpenAICompatLLM(two_slots[1])
    schema = {"type": "object", "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
              "required": ["title", "year"]}
    reply = llm.chat([[{"role": "user", "content": "Name a film and its year."}]], max_tokens=48,
                     json_schema=schema)[0]
    data = json.loads(reply.text)
    assert isinstance(data["title"], str) and isinstance(data["year"], int)


@pytest.mark.llm
def test_a_served_model_told_to_say_yes_puts_more_mass_on_yes_than_when_told_no(two_slots):
    llm = OpenAICompatLLM(two_slots[1])
    reading = llm.choose([[{"role": "user", "content": question}]
                          for question in ("Say yes.", "Say no.")])
    assert reading.probabilities[0, 0] > reading.probabilities[1, 0]
    np.testing.assert_allclose(reading.probabilities.sum(axis=1), 1.0)


# ------------------------------------------------------- the vLLM path, up to the client (no GPU here)

VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def vllm_rating_reply(top: dict[str, float]) -> str:
    """A vLLM /chat/completions reply with logprobs, as `vllm serve` sends it."""
    first = max(top, key=top.get)
    entries = [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in top.items()]
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "model": VLLM_MODEL,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": first},
                                    "logprobs": {"content": [{"token": first, "logprob": top[first],
                                                              "top_logprobs": entries}]},
                                    "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 31, "completion_tokens": 1, "total_tokens": 32}})


def test_vllm_spec_reaches_the_server_and_digit_ratings_come_from_logprobs():
    from ctrlsim.backends import load_llm

    top = {"4": -0.1, "3": -2.4, " 5": -3.0, "The": -4.0}  # " 5" counts as 5; "The" is ignored
    with ScriptedServer([("raw", vllm_rating_reply(top))]) as server:
        llm = load_llm(f"{server.url}#{VLLM_MODEL}")
        rating = llm.rate([[{"role": "user", "content": "Rate Heat (1995) from 0 to 5."}]])[0]
    body = server.requests[0]
    sent = (body["model"], body["logprobs"], body["top_logprobs"], body["max_tokens"])
    assert sent == (VLLM_MODEL, True, 20, 1)
    assert body["messages"][-1]["content"] == \
        "Rate Heat (1995) from 0 to 5.\nAnswer with a single digit from 0 to 5 and nothing else."
    weights = {3: np.exp(-2.4), 4: np.exp(-0.1), 5: np.exp(-3.0)}
    assert rating == pytest.approx(sum(d * w for d, w in weights.items()) / sum(weights.values()))
    assert llm.identity == {"runtime": "openai-compatible", "model": VLLM_MODEL, "base_url": server.url}
    assert llm.meter.total.prompt_tokens == 31


def test_answer_probabilities_come_from_the_first_tokens_logprobs_with_spellings_summed():
    from ctrlsim.backends import load_llm

    top = {"Yes": -0.3, " yes": -2.0, "no": -1.5, "The": -4.0}  # "The" is neither answer
    with ScriptedServer([("raw", vllm_rating_reply(top))]) as server:
        llm = load_llm(f"{server.url}#{VLLM_MODEL}")
        reading = llm.choose([[{"role": "user", "content": "Is Heat (1995) a crime film?"}]])
    body = server.requests[0]
    assert (body["logprobs"], body["top_logprobs"], body["max_tokens"]) == (True, 20, 1)
    assert body["messages"][-1]["content"] == \
        "Is Heat (1995) a crime film?\nAnswer with one word, yes or no, and nothing else."
    yes, no = np.exp(-0.3) + np.exp(-2.0), np.exp(-1.5)
    np.testing.assert_allclose(reading.probabilities, [[yes / (yes + no), no / (yes + no)]])
    assert reading.prompt_tokens == [31]


def test_replica_spec_spreads_a_batch_over_the_replicas():
    from ctrlsim.backends import load_llm

    with ScriptedServer([]) as first, ScriptedServer([]) as second:
        llm = load_llm(f"{first.url},{second.url}#{VLLM_MODEL}")
        replies = llm.chat([[{"role": "user", "content": f"Say {i}."}] for i in range(6)])
    assert [r.text for r in replies] == ["hello"] * 6
    assert len(first.requests) + len(second.requests) == 6 and first.requests and second.requests
    assert llm.base_url == f"{first.url},{second.url}"


def _reply(**changes) -> str:
    reply = json.loads(json.dumps(GOOD_REPLY))
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = reply
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    return json.dumps(reply)


@pytest.mark.parametrize("body, problem", [
    (_reply(usage__prompt_tokens=-2000010), "usage.prompt_tokens must be a non-negative integer"),
    (_reply(usage__completion_tokens=1.5), "usage.completion_tokens must be a non-negative integer"),
    (_reply(usage="lots"), "'usage' is not an object"),
    (_reply(choices__0__message__content=["hello"]), "content is not a string"),
])
def test_server_values_are_validated(body, problem):
    """Issue 20, point 3: negative or fractional token counts and a non-string reply are typed errors
    naming the field (Table 7 once reported Tokens -2,000,010)."""
    with ScriptedServer([("raw", body)]) as server:
        with pytest.raises(ServerResponseError, match=problem):
            scripted_llm(server).chat(HELLO)


@pytest.mark.parametrize("entries, problem", [
    ([{"token": "4", "logprob": float("nan")}], r"top_logprobs\[0\]"),
    ([{"token": "4"}], r"top_logprobs\[0\]"),
    ([{"logprob": -0.1}], r"top_logprobs\[0\]"),
    ("4", "is not a list"),
])
def test_malformed_logprobs_are_typed_errors_not_a_keyerror_or_a_nan_rating(entries, problem):
    reply = json.loads(vllm_rating_reply({"4": -0.1}))
    reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"] = entries
    text = json.dumps(reply)  # Python's json writes NaN as a bare NaN, as a careless server might
    with ScriptedServer([("raw", text)]) as server:
        with pytest.raises(ServerResponseError, match=problem):
            scripted_llm(server).rate(HELLO)
