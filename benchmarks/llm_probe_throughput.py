"""LLM probe decisions over an episode: batched population steps vs. a naive per-probe loop.

K persona probes (template personas of ml-100k users) play R rounds against the popularity box
(target War). Every variant runs in the same process with the same model, each from an empty KV
cache, no response cache:

  memory, reuse off   `LLMPopulationPolicy.act`, one `chat` call per round for all K probes, the
                      paper-like prompt (persona + last M rounds summarised + slate), and the KV
                      cache emptied before every call: within a call the shared system text is
                      evaluated once (what ctrlsim did before prefix reuse across calls);
  memory, reuse on    the same prompts, the KV cache kept between calls (the persona and the system
                      text are reused; the memory summary changes every round, so the rest is new);
  append, reuse on    `conversation="append"`: each probe's conversation grows by a turn a round,
                      so a round evaluates only its new turn;
  naive loop          one `chat` call per probe and round, from an empty KV cache, the probe's own
                      text first (nothing shared), answered in free text: the same information as
                      the first variant's prompts, round by round along its trajectory.

Prints, per variant, decisions/s, prompt tokens per decision (what the prompts hold), tokens
evaluated per decision (what llama.cpp actually ran: `evaluated_tokens`), and unusable replies;
then the evaluated-token ratio to the first variant and, last, the speed-up of the append
variant over the naive loop (`speed-up: <ratio>x`). The machine load is printed (compare
ratios, not absolute speeds, on a shared machine).

    python benchmarks/llm_probe_throughput.py --llm qwen2.5-0.5b --agents 16 --rounds 8
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any

from ctrlsim.agents import DecisionSettings, LLMPopulationPolicy, prompts
from ctrlsim.agents.profiles import ProfileGenerator
from ctrlsim.agents.replies import parse_free_numbers
from ctrlsim.envs import PopulationEnv
from ctrlsim.envs.roster import user_order
from tabulate import tabulate

from ctrlsim.backends import load_llm
from ctrlsim.data import load_dataset


def episode(llm: Any, dataset, k: int, rounds: int, seed: int, *, conversation: str, reuse: bool,
            naive_probes: int | None = None) -> dict:
    """Play one episode with batched steps; also returns each round's naive prompts (memory mode)."""
    gen = ProfileGenerator(dataset, None)
    personas = [gen.template_persona(u, gen.seed_items(u, seed)) for u in user_order(dataset)[:k]]
    env = PopulationEnv("popularity", dataset=dataset, n_agents=k, target="War", budget=rounds)
    obs, infos = env.reset(seed=seed, options={"roster": [p.to_probe_spec() for p in personas]})
    agents = dict(zip(env.agents, personas))
    policy = LLMPopulationPolicy(llm, dataset, agents, target=["War"], seed=seed,
                                 settings=DecisionSettings(temperature=0.0, conversation=conversation))
    llm.kv_reuse = reuse
    llm.reset_kv()
    task_text = policy.system_text(env.engine.slate_size).rsplit("Reply with one JSON", 1)[0]
    naive_prompts, seconds, cpu_seconds, evaluated, first_actions = [], 0.0, 0.0, 0, {}
    for round_ in range(rounds):
        live = list(env.agents)
        if not live:
            break
        naive_prompts += [(prompts.NAIVE_DECISION.format(
            probe_text=policy.user_text(policy.probes[a], infos[a], env.engine.budget), task_text=task_text,
            **policy.nouns), len(infos[a]["slate_item_ids"])) for a in live[:naive_probes]]
        before, started, cpu = llm.evaluated_tokens, time.perf_counter(), time.process_time()
        actions, _ = policy.act({a: obs[a] for a in live}, {a: infos[a] for a in live},
                                slate_size=env.engine.slate_size, budget=env.engine.budget)
        seconds += time.perf_counter() - started
        cpu_seconds += time.process_time() - cpu
        evaluated += llm.evaluated_tokens - before
        if round_ == 0:  # every variant's first prompts are the same (compared across models)
            first_actions = {a: repr(actions[a]) for a in live}
        obs, _, _, _, infos = env.step(actions)
    stats = [policy.probe_stats(a) for a in agents]
    decisions = sum(s["decisions"] for s in stats)
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "decisions": decisions, "evaluated": evaluated,
            "prompt_tokens": policy.meter.total.prompt_tokens,
            "unusable": f"{sum(s['parse_failures'] for s in stats)} parse failures", "naive": naive_prompts,
            "first_actions": first_actions}


def naive(llm, prompt_list: list[tuple[str, int]]) -> dict:
    seconds, cpu_seconds, evaluated, prompt_tokens, empty = 0.0, 0.0, 0, 0, 0
    for text, shown in prompt_list:
        llm.reset_kv()
        before, started, cpu = llm.evaluated_tokens, time.perf_counter(), time.process_time()
        reply = llm.chat([[{"role": "user", "content": text}]], max_tokens=64, temperature=0.0)[0]
        seconds += time.perf_counter() - started
        cpu_seconds += time.process_time() - cpu
        evaluated += llm.evaluated_tokens - before
        prompt_tokens += reply.prompt_tokens
        empty += not parse_free_numbers(reply.text, shown).likes
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "decisions": len(prompt_list),
            "evaluated": evaluated,
            "prompt_tokens": prompt_tokens, "unusable": f"{empty} replies with no number"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", default="qwen2.5-0.5b")
    parser.add_argument("--agents", type=int, default=16, help="K probes in the population")
    parser.add_argument("--rounds", type=int, default=8, help="R rounds of the episode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--naive-probes", type=int, default=None,
                        help="time the naive loop on the first N probes of every round only (its cost per "
                             "decision is an average over those; default: every probe)")
    parser.add_argument("--skip-memory-reuse", action="store_true",
                        help="leave out the 'memory, reuse on' variant (it shows the reuse alone)")
    args = parser.parse_args()
    dataset = load_dataset("ml-100k")
    llm = load_llm(args.llm)  # no response cache: every reply is generated
    llm.chat([[{"role": "user", "content": "Say OK."}]], max_tokens=2)  # load the weights outside the timing
    load_before = os.getloadavg()[0]
    results = {}
    variants = [("memory, reuse off", "memory", False), ("memory, reuse on", "memory", True),
                ("append, reuse on", "append", True)]
    for name, conversation, reuse in variants:
        if args.skip_memory_reuse and name == "memory, reuse on":
            continue
        r = results[name] = episode(llm, dataset, args.agents, args.rounds, args.seed,
                                    conversation=conversation, reuse=reuse, naive_probes=args.naive_probes)
        print(f"{name}: {r['decisions']} decisions, {r['seconds']:.0f} s wall, {r['cpu_seconds']:.0f} s CPU, "
              f"{r['prompt_tokens'] / r['decisions']:.0f} prompt / {r['evaluated'] / r['decisions']:.0f} "
              f"evaluated tokens per decision, {r['unusable']}; load {os.getloadavg()[0]:.2f}", flush=True)
    llm.kv_reuse = True
    results["naive loop (fresh context, free text)"] = naive(llm, results["memory, reuse off"]["naive"])
    rows = [[name, r["decisions"], f"{r['decisions'] / r['seconds']:.2f}", f"{r['seconds']:.0f}",
             f"{r['cpu_seconds']:.0f}",
             f"{r['prompt_tokens'] / r['decisions']:.0f}", f"{r['evaluated'] / r['decisions']:.0f}",
             r["unusable"]] for name, r in results.items()]
    print(tabulate(rows, headers=["variant", "decisions", "decisions/s", "wall s", "CPU s",
                                  "prompt tokens/decision", "evaluated tokens/decision", "unusable"]))
    per = {name: r["evaluated"] / r["decisions"] for name, r in results.items()}
    print(f"\nevaluated tokens per decision, append + reuse / memory without reuse: "
          f"{per['append, reuse on'] / per['memory, reuse off']:.2f}")
    if "memory, reuse on" in per:
        ratio = per["memory, reuse on"] / per["memory, reuse off"]
        print(f"memory + reuse / memory without reuse: {ratio:.2f}")
    # CPU seconds per decision: the steadier figure on a shared machine (one llama.cpp thread).
    per_decision = {name: r["cpu_seconds"] / r["decisions"] for name, r in results.items()}
    naive_s = per_decision["naive loop (fresh context, free text)"]
    wall = {name: r["seconds"] / r["decisions"] for name, r in results.items()}
    print(f"wall-time ratio naive / append + reuse: "
          f"{wall['naive loop (fresh context, free text)'] / wall['append, reuse on']:.2f}x")
    print(f"naive / memory without reuse: {naive_s / per_decision['memory, reuse off']:.2f}x "
          f"(K={args.agents}, R={args.rounds}, {args.llm}, runtime {llm.identity.get('runtime')}, threads "
          f"{llm.identity.get('threads')}; load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after)")
    print("speed-up below: CPU time per decision, naive loop / append + reuse")
    print(f"speed-up: {naive_s / per_decision['append, reuse on']:.2f}x")


if __name__ == "__main__":
    main()
