"""Any OpenAI-compatible HTTP server: vLLM serve, llama.cpp server, hosted APIs.

Chat templates are applied by the server, so a rating prompt cannot end inside
the assistant turn; instead the last user message asks for a single digit and
the digit distribution is read from the first token's `top_logprobs`. Servers
that return no log-probs make `rate` raise; use `rate_by_generation` there.
The API key is read from the environment (never from source).
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import numpy as np

from ctrlsim.backends.llm import RATING_DIGITS, LLM, Completion, Conversation, DigitScores, GenerationParams
from ctrlsim.errors import LLMOutputError, ModelError

DIGIT_INSTRUCTION = "Answer with a single digit from 0 to 5 and nothing else."


class OpenAICompatLLM(LLM):
    runtime = "openai-compatible"
    supports_json_schema = True  # sent as OpenAI's response_format json_schema; the server enforces it

    def __init__(self, base_url: str, *, model: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 timeout: float = 120.0, top_logprobs: int = 20, **kwargs):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.top_logprobs = top_logprobs
        self._api_key = os.environ.get(api_key_env, "")
        if model is None:
            models = self._request("GET", "/models")["data"]
            if not models:
                raise ModelError(f"{self.base_url} serves no models")
            model = models[0]["id"]
        self.model = model
        super().__init__(model, **kwargs)

    @property
    def identity(self) -> dict:
        return {**super().identity, "base_url": self.base_url}

    def cache_identity(self) -> str:
        return f"{self.runtime}:{self.base_url}:{self.model}"

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self._api_key}"} if self._api_key else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise ModelError(f"{self.base_url}{path}: HTTP {exc.code}: {exc.read()[:300]!r}") from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise ModelError(f"cannot reach {self.base_url}{path}: {exc}") from exc

    def _generate(self, conversations: list[Conversation], params: GenerationParams) -> list[Completion]:
        out = []
        for conv in conversations:
            body = {"model": self.model, "messages": conv, "max_tokens": params.max_tokens,
                    "temperature": params.temperature, "top_p": params.top_p}
            if params.seed is not None:
                body["seed"] = params.seed
            if params.stop:
                body["stop"] = list(params.stop)
            if params.json_schema is not None:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "reply", "schema": params.schema, "strict": True}}
            res = self._request("POST", "/chat/completions", body)
            choice, usage = res["choices"][0], res.get("usage") or {}
            out.append(Completion(choice["message"].get("content") or "", int(usage.get("prompt_tokens", 0)),
                                  int(usage.get("completion_tokens", 0)), choice.get("finish_reason") or "stop"))
        return out

    def _digit_logprobs(self, conversations: list[Conversation], prefix: str) -> list[DigitScores]:
        out = []
        for conv in conversations:
            conv = [dict(m) for m in conv]
            conv[-1]["content"] = f"{conv[-1]['content']}\n{DIGIT_INSTRUCTION}"
            body = {"model": self.model, "messages": conv, "max_tokens": 1, "temperature": 0.0,
                    "logprobs": True, "top_logprobs": self.top_logprobs}
            res = self._request("POST", "/chat/completions", body)
            choice = res["choices"][0]
            content = (choice.get("logprobs") or {}).get("content")
            if not content:
                raise LLMOutputError(f"{self.base_url} returned no logprobs, so digit rating is impossible "
                                     "(use rate_by_generation)", json.dumps(choice)[:200])
            digit = np.full(len(RATING_DIGITS), -np.inf)
            for entry in content[0].get("top_logprobs", []):
                token = entry["token"].strip()
                if token in RATING_DIGITS:
                    k = RATING_DIGITS.index(token)
                    digit[k] = np.logaddexp(digit[k], entry["logprob"])
            out.append(DigitScores(digit, int((res.get("usage") or {}).get("prompt_tokens", 0))))
        return out
