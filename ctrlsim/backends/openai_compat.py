"""Any OpenAI-compatible HTTP server: vLLM serve, llama.cpp server, hosted APIs (on the `openai` client).

Spec: ``http://host:8000/v1#model`` (``#model`` optional: the server's first model is used).
Several replicas of one model: ``http://a:8000/v1,http://b:8000/v1#model``; each request goes
to the replica with the fewest requests in flight.

* **Concurrency.** The conversations of one `chat` / `rate` batch go out together, at most
  `max_concurrency` requests at a time; the server batches them (vLLM's continuous
  batching, llama.cpp's parallel slots, or one replica each). Replies come back in the
  batch's order, so metering and the response cache work as for any runtime.
* **Faults.** Timeouts (`timeout` seconds for the whole request: connect, send and the whole
  reply, however slowly a server trickles it), refused or dropped connections, HTTP
  408, 409, 429 and 5xx are retried `retries` times with exponential backoff from `backoff`
  seconds (a server's `Retry-After` is honoured), each retry on the least busy replica; after
  that a `BackendUnavailableError` names the server and the cause. Other HTTP errors (400,
  401, 404, ...) raise a `ModelError` at once, except a prompt beyond the model's context
  (HTTP 400 saying so), which is that probe's `PromptTooLongError`. A reply that is not JSON,
  has no `choices`, or no logprobs where they were asked for is a `ServerResponseError`.
  None of these is an `LLMOutputError`: they fail the unit, never a single probe (see
  `ctrlsim.errors`).
* **Ctrl-C** during a batch cancels its requests in flight at once (`http_deadline`): the pool
  is shut down without waiting and the httpx clients are closed (fresh ones serve later calls).
* **Token counts** a reply does not carry (no `usage`) are None, unknown, never a made-up 0.
* **Ratings.** Chat templates are applied by the server, so a rating prompt cannot end
  inside the assistant turn; instead the last user message asks for a single digit and the
  digit distribution is read from the first token's `top_logprobs`. `choose` does the same with
  an instruction to answer with one of its words (the question decision heads). Servers that
  return no log-probs make both raise a `ServerResponseError`; use `rate_by_generation` there, and
  the json decision head.
* **Constrained decoding.** ``chat(json_schema=...)`` is sent as OpenAI's
  ``response_format={"type": "json_schema", ...}`` (vLLM, OpenAI). llama-cpp-python's server
  knows only ``{"type": "json_object", "schema": ...}``; when a server rejects the first
  form, the second is used from then on (``schema_style="json_object"`` skips that probe).

The API key is read from the environment variable `api_key_env` (never from source).
"""
from __future__ import annotations

import itertools
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from ctrlsim.backends.llm import LLM, RATING_DIGITS, Completion, Conversation, DigitScores, GenerationParams
from ctrlsim.errors import (
    BackendUnavailableError,
    ConfigError,
    MissingDependencyError,
    ModelError,
    ModelNotFoundError,
    PromptTooLongError,
    ServerResponseError,
)

DIGIT_INSTRUCTION = "Answer with a single digit from 0 to 5 and nothing else."
ANSWER_INSTRUCTION = "Answer with one word, {}, and nothing else."
RETRY_STATUSES = frozenset({408, 409, 429})  # and every 5xx
SCHEMA_STYLES = ("json_schema", "json_object")  # OpenAI / vLLM form, llama-cpp-python server form
SNIPPET = 300  # characters of a bad body quoted in an error
# How servers say a prompt is beyond the model's context in an HTTP 400: OpenAI's error code,
# vLLM's message, llama.cpp server's error type and message.
CONTEXT_LENGTH_MARKERS = ("context_length_exceeded", "maximum context length", "exceed_context_size",
                          "exceeds the available context size")

T = TypeVar("T")
R = TypeVar("R")


def import_openai():
    """The `openai` client module, or a MissingDependencyError naming the `serve` extra."""
    try:
        import openai
    except ImportError as exc:
        raise MissingDependencyError("openai", "serve", "OpenAI-compatible model servers") from exc
    return openai


def parse_base_urls(base_url: str | Sequence[str]) -> list[str]:
    """One or more server URLs (a comma-separated string or a list), without trailing slashes."""
    parts = base_url.split(",") if isinstance(base_url, str) else list(base_url)
    urls = [p.strip().rstrip("/") for p in parts if p and p.strip()]
    if not urls:
        raise ConfigError(f"no server URL in {base_url!r}")
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        shown = ", ".join(map(repr, bad))
        raise ConfigError(f"server URL(s) must start with http:// or https://; got {shown}")
    if len(set(urls)) != len(urls):
        raise ConfigError(f"server URL given more than once in {base_url!r}")
    return urls


def retryable_status(status: int) -> bool:
    return status in RETRY_STATUSES or status >= 500


@dataclass
class _Replica:
    url: str
    client: Any  # openai.OpenAI
    in_flight: int = 0


class OpenAICompatLLM(LLM):
    runtime = "openai-compatible"
    supports_json_schema = True

    def __init__(self, base_url: str | Sequence[str], *, model: str | None = None,
                 api_key_env: str = "OPENAI_API_KEY", timeout: float = 120.0, top_logprobs: int = 20,
                 max_concurrency: int = 8, retries: int = 4, backoff: float = 0.25, max_backoff: float = 30.0,
                 schema_style: str = "json_schema", **kwargs):
        urls = parse_base_urls(base_url)
        for name, value, low in (("max_concurrency", max_concurrency, 1), ("retries", retries, 0),
                                 ("top_logprobs", top_logprobs, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        for name, seconds in (("timeout", timeout), ("backoff", backoff), ("max_backoff", max_backoff)):
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {seconds!r}")
        import_openai()  # the missing `serve` extra is named before anything else is built
        self.timeout = float(timeout)
        self.top_logprobs = top_logprobs
        self.max_concurrency = max_concurrency
        self.retries = retries
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        # A server without authentication ignores the key; the client insists on having one.
        api_key = os.environ.get(api_key_env) or "no-key"
        from ctrlsim.backends.http_deadline import RequestScope

        self._api_key = api_key
        self._scope = RequestScope()  # each request's deadline and cancel event, per thread
        self._replicas = [_Replica(url, self._client(url)) for url in urls]
        self._lock = threading.Lock()
        self._turn = itertools.count()
        if schema_style not in SCHEMA_STYLES:
            raise ConfigError(f"schema_style must be one of {', '.join(SCHEMA_STYLES)}; got {schema_style!r}")
        self._schema_style = schema_style
        if model is None:
            model = self._first_model()
        self.model = model
        super().__init__(model, **kwargs)

    # ----------------------------------------------------------- identity
    @property
    def base_url(self) -> str:
        """The server URL(s) as identities and messages show them: credentials cut out."""
        from ctrlsim.redact import redact_secrets

        return redact_secrets(",".join(r.url for r in self._replicas))

    @property
    def identity(self) -> dict:
        return {**super().identity, "base_url": self.base_url}

    def cache_identity(self) -> str:
        return f"{self.runtime}:{self.base_url}:{self.model}"

    def close(self) -> None:
        for replica in self._replicas:
            replica.client.close()

    def _client(self, url: str):
        """An `openai.OpenAI` client for `url` whose requests end by their deadline (`timeout`)."""
        from ctrlsim.backends.http_deadline import DeadlineHttpClient

        openai = import_openai()
        # The client's own retries are off: ours spread retries over replicas and end in a ModelError.
        return openai.OpenAI(base_url=url, api_key=self._api_key, timeout=self.timeout, max_retries=0,
                             http_client=DeadlineHttpClient(self._scope, timeout=self.timeout))

    def _renew_clients(self) -> None:
        """Close every client (their sockets with them) and give each replica a fresh one."""
        for replica in self._replicas:
            old, replica.client = replica.client, self._client(replica.url)
            old.close()

    # ----------------------------------------------------------- transport
    def _acquire(self) -> _Replica:
        with self._lock:
            start, n = next(self._turn), len(self._replicas)
            replica = min((self._replicas[(start + i) % n] for i in range(n)), key=lambda r: r.in_flight)
            replica.in_flight += 1
            return replica

    def _release(self, replica: _Replica) -> None:
        with self._lock:
            replica.in_flight -= 1

    def _delay(self, attempt: int, error: Exception | None) -> float:
        delay = self.backoff * 2 ** (attempt - 1)
        response = getattr(error, "response", None)
        retry_after = response.headers.get("retry-after") if response is not None else None
        if retry_after:
            try:
                delay = max(delay, float(retry_after))
            except ValueError:
                pass  # an HTTP date: keep our own backoff
        return min(delay, self.max_backoff)

    def _call(self, path: str, send: Callable[[Any], Any]) -> dict:
        """`send(client)` on the least busy replica, retried on transient faults; the reply's JSON."""
        from ctrlsim.redact import redact_secrets

        openai = import_openai()
        error: Exception | None = None
        url = redact_secrets(self._replicas[0].url)  # what messages name: credentials cut out
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self._delay(attempt, error))
            if self._scope.cancelled:
                raise ModelError(f"{self.base_url}{path}: request cancelled")
            replica = self._acquire()
            url = redact_secrets(replica.url)
            try:
                with self._scope.bounded(self.timeout):
                    raw = send(replica.client)
                return self._parse_json(raw.text, url + path)
            except openai.APIStatusError as exc:
                if not retryable_status(exc.status_code) or _is_request_validation_error(exc):
                    message = f"{url}{path}: HTTP {exc.status_code}: {_body_text(exc)[:SNIPPET]!r}"
                    if exc.status_code == 400 and _is_context_length_error(exc):
                        raise PromptTooLongError(message) from exc
                    raise ModelError(message) from exc
                error = exc
            except openai.APIConnectionError as exc:  # refused, dropped, timed out
                error = exc
            finally:
                self._release(replica)
        # Out of retries: the server is unavailable, which fails the unit (never one probe).
        tries = f"after {self.retries + 1} attempt{'s' if self.retries else ''}"
        if isinstance(error, openai.APIStatusError):
            raise BackendUnavailableError(f"{url}{path}: HTTP {error.status_code} {tries}: "
                                          f"{_body_text(error)[:SNIPPET]!r}") from error
        kind = (f"timed out {tries}, each with a {self.timeout:g} s deadline for the whole request"
                if isinstance(error, openai.APITimeoutError) else f"connection failed {tries}")
        raise BackendUnavailableError(f"cannot reach {url}{path} ({kind}): {error}") from error

    def _sleep(self, seconds: float) -> None:
        """A retry's backoff; a cancelled batch's worker thread wakes at once."""
        if self._scope.cancel is None:
            time.sleep(seconds)
        else:
            self._scope.cancel.wait(seconds)

    @staticmethod
    def _parse_json(text: str, where: str) -> dict:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ServerResponseError(f"{where} answered with invalid JSON ({exc.msg}): "
                                      f"{text[:SNIPPET]!r}") from None
        if not isinstance(data, dict):
            raise ServerResponseError(f"{where} answered with JSON that is not an object: {text[:SNIPPET]!r}")
        return data

    def _first_model(self) -> str:
        data = self._call("/models", lambda client: client.models.with_raw_response.list())
        models = data.get("data")
        if not isinstance(models, list):
            raise ServerResponseError(f"{self.base_url}/models: reply has no 'data' list: "
                                      f"{json.dumps(data)[:SNIPPET]!r}")
        if not models or not isinstance(models[0], dict) or "id" not in models[0]:
            raise ModelNotFoundError(f"{self.base_url} serves no models")
        return models[0]["id"]

    def _chat_completion(self, body: dict) -> tuple[dict, dict]:
        """POST /chat/completions; the first choice and the usage, checked for shape."""
        data = self._call("/chat/completions",
                          lambda client: client.chat.completions.with_raw_response.create(**body))
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict) \
                or not isinstance(choices[0].get("message"), dict):
            raise ServerResponseError(f"{self.base_url}/chat/completions: reply has no 'choices' with a "
                                      f"message: {json.dumps(data)[:SNIPPET]!r}")
        where = f"{self.base_url}/chat/completions"
        content = choices[0]["message"].get("content")
        if content is not None and not isinstance(content, str):
            raise ServerResponseError(f"{where}: message content is not a string: {content!r:.{SNIPPET}}")
        return choices[0], _checked_usage(data.get("usage"), where)

    def _concurrently(self, fn: Callable[[T], R], items: list[T]) -> list[R]:
        """`[fn(x) for x in items]`, at most `max_concurrency` at a time; the first error cancels the
        requests not yet sent, and an interrupt (Ctrl-C) those in flight too, closing the clients."""
        from ctrlsim.backends.http_deadline import concurrent_map

        return concurrent_map(fn, items, self.max_concurrency, self._scope, on_interrupt=self._renew_clients)

    # ------------------------------------------------------------- runtime
    @staticmethod
    def _response_format(schema: dict, style: str) -> dict:
        if style == "json_object":
            return {"type": "json_object", "schema": schema}
        return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}

    def _generate(self, conversations: list[Conversation], params: GenerationParams) -> list[Completion]:
        return self._generate_each(conversations, [params] * len(conversations))

    def _generate_each(self, conversations: list[Conversation],
                       params: list[GenerationParams]) -> list[Completion]:
        """Every conversation is a request of its own with its own params (seed included), so a
        batch with one seed per conversation still goes out together, `max_concurrency` at a time."""
        def one(job: tuple[Conversation, GenerationParams]) -> Completion:
            conv, p = job
            body: dict = {"model": self.model, "messages": conv, "max_tokens": p.max_tokens,
                          "temperature": p.temperature, "top_p": p.top_p}
            if p.seed is not None:
                body["seed"] = p.seed
            if p.stop:
                body["stop"] = list(p.stop)
            schema = p.schema
            if schema is not None:
                style = self._schema_style
                body["response_format"] = self._response_format(schema, style)
                try:
                    choice, usage = self._chat_completion(body)
                except ModelError as exc:
                    if not (style == "json_schema" and _rejects_json_schema_form(exc)):
                        raise
                    self._schema_style = "json_object"  # llama-cpp-python's server form, from now on
                    body["response_format"] = self._response_format(schema, "json_object")
                    choice, usage = self._chat_completion(body)
            else:
                choice, usage = self._chat_completion(body)
            # A count the server did not send stays None (unknown), never 0.
            return Completion(choice["message"].get("content") or "", usage.get("prompt_tokens"),
                              usage.get("completion_tokens"), choice.get("finish_reason") or "stop")

        return self._concurrently(one, list(zip(conversations, params)))

    def _digit_logprobs(self, conversations: list[Conversation], prefix: str) -> list[DigitScores]:
        return self._first_token_scores(conversations, DIGIT_INSTRUCTION, RATING_DIGITS,
                                        "digit rating is impossible (use rate_by_generation)")

    def _choice_logprobs(self, conversations: list[Conversation], prefix: str,
                         choices: tuple[str, ...]) -> list[DigitScores]:
        """Each answer's log-prob from the first reply token's `top_logprobs`, its spellings ("Yes",
        " yes", ...) summed; an answer outside the server's top list has no mass (-inf)."""
        return self._first_token_scores(conversations, ANSWER_INSTRUCTION.format(" or ".join(choices)),
                                        choices, "answer probabilities cannot be read (use --decision json)")

    def _first_token_scores(self, conversations: list[Conversation], instruction: str,
                            labels: Sequence[str], unreadable: str) -> list[DigitScores]:
        """Log-probs of `labels` at the first reply token. The server applies the chat template, so a
        prompt cannot end inside the assistant turn: the last user message ends with `instruction`."""
        wanted = [label.strip().lower() for label in labels]

        def one(conv: Conversation) -> DigitScores:
            conv = [dict(m) for m in conv]
            conv[-1]["content"] = f"{conv[-1]['content']}\n{instruction}"
            body = {"model": self.model, "messages": conv, "max_tokens": 1, "temperature": 0.0,
                    "logprobs": True, "top_logprobs": self.top_logprobs}
            choice, usage = self._chat_completion(body)
            content = (choice.get("logprobs") or {}).get("content")
            if not content:
                raise ServerResponseError(f"{self.base_url} returned no logprobs, so {unreadable}: "
                                          f"{json.dumps(choice)[:200]!r}")
            scores = np.full(len(wanted), -np.inf)
            for entry in _checked_top_logprobs(content, self.base_url):
                token = entry["token"].strip().lower()
                if token in wanted:
                    k = wanted.index(token)
                    scores[k] = np.logaddexp(scores[k], entry["logprob"])
            return DigitScores(scores, usage.get("prompt_tokens"))  # None when the server sent no count

        return self._concurrently(one, conversations)


def _checked_usage(usage: Any, where: str) -> dict:
    """The reply's token counts: non-negative integers, or a `ServerResponseError` naming the field.

    A count the reply does not carry (no `usage`, or no `prompt_tokens` / `completion_tokens` in it)
    is left out: servers that send none exist, and what they did not send is unknown, not 0 (the
    meter counts such a call in `Usage.unknown_calls` and the tables show its tokens as unknown)."""
    if usage is None:
        return {}
    if not isinstance(usage, dict):
        raise ServerResponseError(f"{where}: 'usage' is not an object: {usage!r:.{SNIPPET}}")
    counts = {}
    for name in ("prompt_tokens", "completion_tokens"):
        value = usage.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ServerResponseError(f"{where}: usage.{name} must be a non-negative integer, got {value!r}")
        counts[name] = value
    return counts


def _checked_top_logprobs(content: Any, where: str) -> list[dict]:
    """The first token's `top_logprobs`: a list of {token: str, logprob: finite number}, checked."""
    first = content[0] if isinstance(content, list) and content else None
    entries = first.get("top_logprobs") if isinstance(first, dict) else None
    if not isinstance(entries, list):
        raise ServerResponseError(f"{where}: logprobs.content[0].top_logprobs is not a list: {first!r:.200}")
    for n, entry in enumerate(entries):
        logprob = entry.get("logprob") if isinstance(entry, dict) else None
        number = isinstance(logprob, (int, float)) and not isinstance(logprob, bool)
        # -inf is a probability of 0; NaN and +inf are no probability at all
        ok = isinstance(entry, dict) and isinstance(entry.get("token"), str) and number \
            and (math.isfinite(float(logprob)) or logprob == -math.inf)  # type: ignore[arg-type]
        if not ok:
            raise ServerResponseError(f"{where}: top_logprobs[{n}] is not a token with a finite logprob: "
                                      f"{entry!r:.200}")
    return entries


def _is_request_validation_error(error) -> bool:
    """A 5xx that reports the request as invalid (llama-cpp-python's server does this): not transient."""
    return "validation error" in _body_text(error)[:SNIPPET]


def _is_context_length_error(error) -> bool:
    """An HTTP 400 that says the prompt is beyond the model's context (the probe's prompt, not the server)."""
    text = _body_text(error).lower()
    return any(marker in text for marker in CONTEXT_LENGTH_MARKERS)


def _rejects_json_schema_form(exc: ModelError) -> bool:
    # llama-cpp-python's server answers OpenAI's json_schema form with a validation error (HTTP 500)
    # saying response_format's type should be 'text' or 'json_object'.
    text = str(exc)
    return "response_format" in text and "json_object" in text


def _body_text(error) -> str:
    response = getattr(error, "response", None)
    try:
        return response.text if response is not None else str(error)
    except Exception:  # noqa: BLE001 - a streamed body that cannot be read: fall back to the message
        return str(error)
