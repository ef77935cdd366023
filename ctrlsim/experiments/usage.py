"""One token-usage shape read from any runner's record: every report and the audit add tokens up here.

Records keep the shapes they were written with (records stay byte-identical across versions), so
this module reads each of them into one `TokenUsage`:

* probe's episode: `tokens` = an int (a total, no prompt/completion split);
* ctrlbench's episode: `setup_tokens` (int) + each `probes[i].tokens` (int), with
  `setup_tokens_unknown` (int) and `tokens_unknown` ({"calls", "of"}) where servers sent no counts;
* evolve's phases and evaluation: `tokens` = `backends.meter.Usage.to_dict()` ({"prompt_tokens",
  "completion_tokens", "calls", "cached_calls", "total_tokens"[, "unknown_calls"]});
* SteerEval's scenario: `tokens` = {"prompt", "completion"[, "unknown_calls"]}; calibrate's unit of
  the SteerEval protocol keeps the same under `details.tokens`;
* PromptShift's user: each `lists[i]` has `prompt_tokens` / `completion_tokens` (null: the server
  sent none); its `tokens` ({"prompt_tokens", "completion_tokens", "calls", "cached_calls"}) is
  their sum.

A validity check's `check_usage` (ctrlbench) is the instrument's own cost and is not counted here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping


@dataclass(frozen=True)
class TokenUsage:
    """Tokens a record (or several) spent. `prompt`/`completion` are None where a record keeps only
    a total; `unknown_calls` counts calls whose server sent no counts (then `total` is a lower
    bound); `calls` is None where the record does not say."""

    total: int = 0
    prompt: int | None = 0
    completion: int | None = 0
    unknown_calls: int = 0
    calls: int | None = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        def both(a, b):
            return None if a is None or b is None else a + b

        return TokenUsage(self.total + other.total, both(self.prompt, other.prompt),
                          both(self.completion, other.completion), self.unknown_calls + other.unknown_calls,
                          both(self.calls, other.calls))


def _split(prompt: Any, completion: Any, **about: Any) -> TokenUsage:
    prompt, completion = int(prompt or 0), int(completion or 0)
    return TokenUsage(prompt + completion, prompt, completion, **about)


def record_tokens(record: Mapping[str, Any]) -> TokenUsage:
    """The tokens one record spent, whichever runner wrote it (see the module docstring)."""
    if "setup_tokens" in record and "probes" in record:  # ctrlbench episode
        unknown = int(record.get("setup_tokens_unknown", 0) or 0) + \
            int((record.get("tokens_unknown") or {}).get("calls", 0))
        total = int(record["setup_tokens"] or 0) + sum(int(p.get("tokens") or 0) for p in record["probes"])
        return TokenUsage(total, None, None, unknown, None)
    if isinstance(record.get("lists"), list):  # PromptShift user: one call per list
        lists = record["lists"]
        unknown = sum(1 for d in lists if None in (d.get("prompt_tokens"), d.get("completion_tokens")))
        return _split(sum(d.get("prompt_tokens") or 0 for d in lists),
                      sum(d.get("completion_tokens") or 0 for d in lists),
                      unknown_calls=unknown, calls=len(lists))
    tokens = record.get("tokens")
    if tokens is None:
        tokens = (record.get("details") or {}).get("tokens")  # a calibrate unit
    if tokens is None or isinstance(tokens, bool):
        return TokenUsage()
    if isinstance(tokens, (int, float)):  # probe: a total only
        return TokenUsage(int(tokens), None, None, 0, None)
    if "prompt_tokens" in tokens or "total_tokens" in tokens:  # backends.meter.Usage.to_dict()
        prompt, completion = tokens.get("prompt_tokens"), tokens.get("completion_tokens")
        total = tokens.get("total_tokens", int(prompt or 0) + int(completion or 0))
        return TokenUsage(int(total), None if prompt is None else int(prompt),
                          None if completion is None else int(completion),
                          int(tokens.get("unknown_calls", 0)), tokens.get("calls"))
    return _split(tokens.get("prompt"), tokens.get("completion"),  # SteerEval
                  unknown_calls=int(tokens.get("unknown_calls", 0)), calls=None)


def total_tokens(records: Iterable[Mapping[str, Any]]) -> TokenUsage:
    """The tokens of several records, added up."""
    out = TokenUsage()
    for record in records:
        out = out + record_tokens(record)
    return out
