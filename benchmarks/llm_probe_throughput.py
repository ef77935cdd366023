"""LLM probe decisions per second: one batched population step vs. a naive per-probe loop.

K persona probes (template personas of ml-100k users) see their first slate of the popularity
box. Both variants decide for the same K probes in the same process with the same model:

  batched  `LLMPopulationPolicy.act`: ONE `chat` call for all K conversations, the shared system
           text first (llama.cpp decodes them as parallel sequences over one shared prefix),
           replies held to the decision JSON schema, greedy.
  naive    one `chat` call per probe with the same information, but the probe's own text first
           (nothing shared between probes), answered in free text and parsed for numbers
           (`parse_free_numbers`).

No response cache. Prints decisions/s for both, the ratio, tokens per decision and the machine
load (other jobs share the CPU; compare the ratio, not absolute speeds).

    python benchmarks/llm_probe_throughput.py --llm qwen2.5-0.5b --agents 16
"""
from __future__ import annotations

import argparse
import os
import time

from ctrlsim.agents import DecisionSettings, LLMPopulationPolicy, prompts
from ctrlsim.agents.profiles import ProfileGenerator
from ctrlsim.agents.replies import parse_free_numbers
from ctrlsim.envs import PopulationEnv
from ctrlsim.envs.roster import user_order
from tabulate import tabulate

from ctrlsim.backends import load_llm
from ctrlsim.data import load_dataset


def first_step(dataset, k: int, seed: int):
    gen = ProfileGenerator(dataset, None)
    personas = [gen.template_persona(u, gen.seed_items(u, seed)) for u in user_order(dataset)[:k]]
    env = PopulationEnv("popularity", dataset=dataset, n_agents=k, target="War", budget=5)
    obs, infos = env.reset(seed=seed, options={"roster": [p.to_probe_spec() for p in personas]})
    return env, dict(zip(env.agents, personas)), obs, infos


def batched(llm, dataset, env, agents, obs, infos, seed) -> tuple[float, int, int]:
    policy = LLMPopulationPolicy(llm, dataset, agents, target=["War"], seed=seed,
                                 settings=DecisionSettings(temperature=0.0))
    started = time.perf_counter()
    policy.act(obs, infos, slate_size=env.engine.slate_size, budget=env.engine.budget)
    seconds = time.perf_counter() - started
    failures = sum(policy.probe_stats(a)["parse_failures"] for a in agents)
    return seconds, policy.meter.total.total_tokens, failures


def naive(llm, dataset, env, agents, infos) -> tuple[float, int, int]:
    policy = LLMPopulationPolicy(llm, dataset, agents, target=["War"])  # only to build the same texts
    nouns = prompts.domain_nouns(dataset.name)
    task_text = policy.system_text(env.engine.slate_size).rsplit("Reply with one JSON", 1)[0]
    tokens, empty = 0, 0
    started = time.perf_counter()
    for agent in agents:
        text = prompts.NAIVE_DECISION.format(
            probe_text=policy.user_text(policy.probes[agent], infos[agent], env.engine.budget),
            task_text=task_text, **nouns)
        reply = llm.chat([[{"role": "user", "content": text}]], max_tokens=64, temperature=0.0)[0]
        tokens += reply.prompt_tokens + reply.completion_tokens
        empty += not parse_free_numbers(reply.text, len(infos[agent]["slate_item_ids"])).likes
    return time.perf_counter() - started, tokens, empty


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", default="qwen2.5-0.5b")
    parser.add_argument("--agents", type=int, default=16, help="K probes in the population step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dataset = load_dataset("ml-100k")
    llm = load_llm(args.llm)  # no response cache: every reply is generated
    env, agents, obs, infos = first_step(dataset, args.agents, args.seed)
    llm.chat([[{"role": "user", "content": "Say OK."}]], max_tokens=2)  # load the weights outside the timing
    load_before = os.getloadavg()[0]
    t_naive, tok_naive, empty = naive(llm, dataset, env, agents, infos)
    t_batch, tok_batch, failures = batched(llm, dataset, env, agents, obs, infos, args.seed)
    k = len(agents)
    rows = [["batched (one chat call, JSON schema)", f"{k / t_batch:.2f}", f"{t_batch:.1f}",
             f"{tok_batch / k:.0f}", f"{failures} parse failures"],
            ["naive loop (fresh context, free text)", f"{k / t_naive:.2f}", f"{t_naive:.1f}",
             f"{tok_naive / k:.0f}", f"{empty} replies with no number"]]
    print(tabulate(rows, headers=["variant", "decisions/s", "seconds", "tokens/decision", "unusable"]))
    print(f"\nspeed-up batched / naive: {t_naive / t_batch:.2f}x  (K={k}, {args.llm}, "
          f"runtime {llm.identity.get('runtime')}, threads {llm.identity.get('threads')}; load average "
          f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after)")


if __name__ == "__main__":
    main()
