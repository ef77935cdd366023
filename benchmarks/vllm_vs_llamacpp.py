"""A population step of LLM probes on llama.cpp against vLLM: the same model, the same prompts.

The K persona probes, the popularity box (target War) and the batched decision steps
(`LLMPopulationPolicy.act`: one `chat` call per round for all K conversations, replies held to
the decision JSON schema, greedy) are `episode` of `benchmarks/llm_probe_throughput.py`,
imported from it; `--rounds 1` (the default) is one population step. Each `--llm` spec runs it
in this process, one runtime after the other, each loaded and warmed up outside the timing and
started from an empty KV / prefix cache:

  qwen2.5-0.5b              llama.cpp on the bundled GGUF
  vllm:qwen2.5-0.5b         vLLM in-process, on the same GGUF converted once to a Hugging Face folder
  http://127.0.0.1:8000/v1  any OpenAI-compatible server (`vllm serve` of that folder)

Same prompts: every runtime renders the probes' conversations with the GGUF's own chat template
and tokenizer, so the prompt tokens per decision must agree (the table shows them). `evaluated`
is the prompt tokens the runtime says it actually ran (the shared prefixes it reused are not
counted): llama.cpp's and vLLM's in-process counters; a server reports none here. `--reuse off`
empties the cache before every call (within a call shared prefixes are still reused). No
response cache.

vLLM needs its own venv (docs/scale-out.md, "vLLM on a CPU"); run this script there to have all
three runtimes side by side. A spec that cannot load here is reported as not run, with the reason.

    python benchmarks/vllm_vs_llamacpp.py --llm qwen2.5-0.5b --llm vllm:qwen2.5-0.5b --agents 16
"""
from __future__ import annotations

import argparse
import os
import time

from llm_probe_throughput import episode  # the probes, the box and the batched steps: same prompts
from tabulate import tabulate

from ctrlsim.backends import load_llm
from ctrlsim.data import load_dataset
from ctrlsim.errors import MissingDependencyError, ModelError


def runtime_label(llm) -> str:
    ident = llm.identity
    threads = f"{ident['threads']} thread(s)" if "threads" in ident else None
    extra = ident.get("device") or threads or ident.get("base_url")
    return f"{ident['runtime']} ({extra})" if extra else ident["runtime"]


def without_kv_of_its_own(llm) -> bool:
    """A served LLM has no KV cache here to reset or count: give it the no-op hooks `episode` calls."""
    if hasattr(llm, "reset_kv"):
        return False
    llm.reset_kv, llm.kv_reuse, llm.evaluated_tokens = (lambda: None), True, 0
    return True


def measure(spec: str, dataset, args) -> list:
    """One row of the table: `spec`'s episode (one population step by default)."""
    started = time.perf_counter()
    try:
        llm = load_llm(spec)
        llm.chat([[{"role": "user", "content": "Say OK."}]], max_tokens=2)  # load outside the timing
    except (MissingDependencyError, ModelError) as exc:
        return [spec, "not run", "", "", "", "", "", f"{type(exc).__name__}: {str(exc)[:120]}"]
    load_seconds = time.perf_counter() - started
    served = without_kv_of_its_own(llm)
    load_before, before = os.getloadavg()[0], llm.meter.total
    r = episode(llm, dataset, args.agents, args.rounds, args.seed, conversation=args.conversation,
                reuse=args.reuse == "on")
    llm.close()
    decisions = r["decisions"]
    after = llm.meter.total
    known = after.completion_tokens is not None and before.completion_tokens is not None
    generated = after.completion_tokens - before.completion_tokens if known else None
    return [spec, runtime_label(llm), decisions, f"{decisions / r['seconds']:.2f}", f"{r['seconds']:.1f}",
            f"{r['prompt_tokens'] / decisions:.0f} + {generated / decisions:.0f}" if generated is not None
            else f"{r['prompt_tokens'] / decisions:.0f} + ?",
            "not reported" if served else f"{r['evaluated'] / decisions:.0f}",
            f"{r['unusable']}; load {load_before:.1f} -> {os.getloadavg()[0]:.1f}; "
            f"loaded in {load_seconds:.0f} s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", action="append", help="an LLM spec; repeat for each runtime "
                        "(default: qwen2.5-0.5b and vllm:qwen2.5-0.5b)")
    parser.add_argument("--agents", type=int, default=16, help="K probes in the population")
    parser.add_argument("--rounds", type=int, default=1, help="population steps (1: one step)")
    parser.add_argument("--conversation", choices=("memory", "append"), default="memory",
                        help="the probes' decision prompts (see docs/ctrlbench.md)")
    parser.add_argument("--reuse", choices=("on", "off"), default="on",
                        help="keep the KV / prefix cache between calls")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    specs = args.llm or ["qwen2.5-0.5b", "vllm:qwen2.5-0.5b"]
    dataset = load_dataset("ml-100k")
    rows = [measure(spec, dataset, args) for spec in specs]
    print(tabulate(rows, headers=["spec", "runtime", "decisions", "decisions/s", "seconds",
                                  "prompt + generated tokens/decision", "evaluated/decision", "notes"]))
    threads = os.environ.get("CTRLSIM_THREADS", "unset")
    print(f"\nK={args.agents}, {args.rounds} round(s), {args.conversation} prompts, reuse {args.reuse}, "
          f"seed {args.seed}; CTRLSIM_THREADS={threads}; {os.cpu_count()} CPUs; load average "
          f"{os.getloadavg()[0]:.2f} at the end (the machine may be shared)")


if __name__ == "__main__":
    main()
