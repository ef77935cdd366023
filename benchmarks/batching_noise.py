"""Batching noise: how far a rating moves with the runtime profile, the batch and the KV state.

llama.cpp's CPU kernels give slightly different logits for one token depending on how the tokens
around it were grouped into a batch, whether its prefix came from the KV cache, and which attention
kernel ran. This script measures that noise on fixed prompts, so the tests that compare two paths
(batched against sequential, reuse on against off, one profile against another) can take their
tolerances from a measured figure instead of from whatever made them pass.

Reference: every prompt rated alone, from an empty KV cache, on the sequential path of the `exact`
profile (`<model>@exact@n_parallel=1`). Then, per model, the largest and the 90th-percentile
absolute difference of the 0-5 expected rating against the reference, and between pairs of the
default (`fast`) profile's own paths:

  exact, one batch          `@exact`: the prompts in one call, 16 parallel sequences, unified cache
  fast, alone               the default profile, each prompt alone from an empty cache
  fast, one batch (cold)    the default profile, the prompts in one call from an empty cache
  fast, one batch (warm)    the same call again: every prompt's prefix now comes from the KV cache
  fast: batch vs alone      within the default profile (what the batched-vs-sequential tests see)
  fast: warm vs cold        within the default profile (what the reuse-on-vs-off tests see)

and, for greedy replies to short prompts with a clear answer, how many equal the reference.

    python benchmarks/batching_noise.py --llms smollm2-135m,qwen2.5-0.5b
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from tabulate import tabulate

from ctrlsim.backends import load_llm

PROFILES = ("Someone who loves hard science fiction, space operas and films about artificial "
            "intelligence, and avoids romantic comedies.",
            "Someone who loves romantic comedies and feel-good musicals, and finds science fiction dull.")
ITEMS = ("Blade Runner (1982), Sci-Fi", "2001: A Space Odyssey (1968), Sci-Fi", "Alien (1979), Sci-Fi|Horror",
         "The Matrix (1999), Sci-Fi|Action", "Solaris (1972), Sci-Fi|Drama", "Gattaca (1997), Sci-Fi|Drama",
         "Notting Hill (1999), Comedy|Romance", "Sleepless in Seattle (1993), Comedy|Romance",
         "When Harry Met Sally... (1989), Comedy|Romance", "Pretty Woman (1990), Comedy|Romance",
         "The Sound of Music (1965), Musical", "Grease (1978), Musical|Romance")
CLEAR = [f"Count from 1 to {n}, separated by commas. Output only the numbers." for n in range(2, 10)] + \
    ["What is the capital of France? Answer with one word.", "What is 2 + 3? Answer with one number.",
     "Spell the word cat backwards. Output only the letters.", "Name the colour of the sky on a clear day. "
     "One word."]


def rating_prompts() -> list:
    return [[{"role": "system", "content": f"You rate films for this viewer. Viewer: {profile}"},
             {"role": "user", "content": f"Film: {item}. How much will the viewer like it, 0 to 5? "
                                         "Answer with one digit."}]
            for profile in PROFILES for item in ITEMS]


def alone(llm, prompts) -> np.ndarray:
    out = []
    for p in prompts:
        llm.reset_kv()
        out.append(llm.rate([p])[0])
    return np.array(out)


def batch(llm, prompts, warm: bool = False) -> np.ndarray:
    llm.reset_kv()
    first = np.asarray(llm.rate(prompts))
    return np.asarray(llm.rate(prompts)) if warm else first


def greedy(llm, one_by_one: bool) -> list[str]:
    convs = [[{"role": "user", "content": c}] for c in CLEAR]
    if one_by_one:
        out = []
        for conv in convs:
            llm.reset_kv()
            out.append(llm.chat([conv], max_tokens=24, temperature=0.0)[0].text)
        return out
    llm.reset_kv()
    return [r.text for r in llm.chat(convs, max_tokens=24, temperature=0.0)]


def spread(a: np.ndarray, b: np.ndarray) -> tuple[str, str]:
    d = np.abs(np.asarray(a) - np.asarray(b))
    return f"{d.max():.3f}", f"{np.quantile(d, 0.9):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llms", default="smollm2-135m,qwen2.5-0.5b")
    args = parser.parse_args()
    prompts = rating_prompts()
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    rows, replies = [], []
    for model in [m.strip() for m in args.llms.split(",") if m.strip()]:
        reference_llm = load_llm(f"{model}@exact@n_parallel=1")
        reference = alone(reference_llm, prompts)
        reference_text = greedy(reference_llm, one_by_one=True)
        reference_llm.close()
        exact = load_llm(f"{model}@exact")
        exact_batch = batch(exact, prompts)
        exact_text = greedy(exact, one_by_one=False)
        exact.close()
        fast = load_llm(model)  # the default profile
        fast_alone, fast_cold = alone(fast, prompts), batch(fast, prompts)
        fast_warm = batch(fast, prompts, warm=True)
        fast_text = greedy(fast, one_by_one=False)
        fast.close()
        for name, values, base in (("exact, one batch", exact_batch, reference),
                                   ("fast, alone", fast_alone, reference),
                                   ("fast, one batch (cold)", fast_cold, reference),
                                   ("fast, one batch (warm)", fast_warm, reference),
                                   ("fast: batch vs alone", fast_cold, fast_alone),
                                   ("fast: warm vs cold", fast_warm, fast_cold)):
            rows.append([model, name, *spread(values, base)])
        replies.append([model, f"{sum(a == b for a, b in zip(exact_text, reference_text))} of {len(CLEAR)}",
                        f"{sum(a == b for a, b in zip(fast_text, reference_text))} of {len(CLEAR)}"])
        gap = reference[:len(ITEMS)][:6].mean() - reference[:len(ITEMS)][6:].mean()
        print(f"{model}: {len(prompts)} ratings; the sci-fi fan's sci-fi minus romance gap {gap:+.2f} "
              f"(a nearly flat digit distribution makes noise look larger)", flush=True)
    print(tabulate(rows, headers=["model", f"against (n={len(prompts)} ratings)", "largest |difference|",
                                  "90th percentile"]))
    print()
    print(tabulate(replies, headers=["model", "greedy replies equal: exact batch vs alone",
                                     "fast batch vs exact alone"]))
    print(f"\n{time.perf_counter() - started:.0f} s; load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; threads {os.environ.get('CTRLSIM_THREADS', 'all')}")


if __name__ == "__main__":
    main()
