"""Chat throughput for a population step: the probes' real decision batch, parallel vs one by one.

One batch of probe decisions (default 26, the population size) as `LLMPopulationPolicy` sends
it: template personas of ml-100k users see their first slate of the popularity box (target War,
3 items), each conversation is the policy's own `[system, user]` pair (`conversation`), and the
call carries the policy's own options (`DecisionSettings`: greedy, `max_tokens=48`, the round's
seed) and reply schema (`agents.replies.decision_schema`: `{"like": [positions], "search": ...}`).
Measured side by side in one run:
  parallel   - `llm.chat` with llama.cpp parallel sequences (n_parallel > 1):
               shared system prefix evaluated once, every conversation its own
               sequence, one llama_batch per decode step;
  one-by-one - the same call with n_parallel=1: each conversation decoded alone
               from a fresh context (llama-cpp-python's create_completion).
Prints decisions/s (wall clock and CPU time; the machine is shared), the ratio, how many replies
are identical, how many the probes' parser (`parse_decision`) accepts, and the load average
before and after. `--free` also times the same batch without the schema.

    python benchmarks/chat_throughput.py --model qwen2.5-0.5b --batch 26
"""
from __future__ import annotations

import argparse
import os
import time

from ctrlsim.agents import DecisionSettings, LLMPopulationPolicy
from ctrlsim.agents.profiles import ProfileGenerator
from ctrlsim.agents.replies import decision_schema, parse_decision
from ctrlsim.envs import PopulationEnv
from ctrlsim.envs.roster import user_order
from tabulate import tabulate

from ctrlsim.backends import load_llm
from ctrlsim.data import load_dataset
from ctrlsim.errors import LLMOutputError
from ctrlsim.seeding import derive_seed

TARGET = "War"


def decision_batch(dataset, k: int, seed: int, settings: DecisionSettings):
    """The K conversations of a population step's first round, the slate size and the round number."""
    gen = ProfileGenerator(dataset, None)
    personas = [gen.template_persona(u, gen.seed_items(u, seed)) for u in user_order(dataset)[:k]]
    env = PopulationEnv("popularity", dataset=dataset, n_agents=k, target=TARGET, budget=5)
    _, infos = env.reset(seed=seed, options={"roster": [p.to_probe_spec() for p in personas]})
    policy = LLMPopulationPolicy(None, dataset, dict(zip(env.agents, personas)), target=[TARGET],
                                 settings=settings, seed=seed)
    slate_size, budget = env.engine.slate_size, env.engine.budget
    convs = [policy.conversation(a, infos[a], slate_size, budget) for a in env.agents]
    shown = [len(infos[a]["slate_item_ids"]) for a in env.agents]
    return convs, shown, slate_size, int(infos[env.agents[0]]["round"])


def usable(text: str, n_shown: int) -> bool:
    try:
        parse_decision(text, n_shown)
    except LLMOutputError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--batch", type=int, default=26, help="probes deciding in the step")
    parser.add_argument("--max-tokens", type=int, default=DecisionSettings().max_tokens)
    parser.add_argument("--parallel", type=int, default=16, help="sequences decoded together")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--free", action="store_true", help="also time the batch without the JSON schema")
    args = parser.parse_args()

    settings = DecisionSettings(max_tokens=args.max_tokens)
    dataset = load_dataset("ml-100k")
    convs, shown, slate_size, round_no = decision_batch(dataset, args.batch, args.seed, settings)
    llm = load_llm(args.model, n_parallel=args.parallel)  # no response cache: every reply is generated
    llm.chat(convs[:1], max_tokens=2)  # warm-up (loads the model)
    options = {"max_tokens": settings.max_tokens, "temperature": settings.temperature,
               "seed": derive_seed(args.seed, "decision-round", round_no)}  # as LLMPopulationPolicy._chat

    def timed(n_parallel: int, schema):
        llm.n_parallel = n_parallel
        llm.reset_kv()
        wall, cpu = time.perf_counter(), time.process_time()
        replies = llm.chat(convs, **options, json_schema=schema)
        return replies, time.perf_counter() - wall, time.process_time() - cpu

    load_before = os.getloadavg()
    rows, ratios = [], []
    variants = [("JSON schema", decision_schema(slate_size))] + ([("free text", None)] if args.free else [])
    for label, schema in variants:
        par, t_par, c_par = timed(args.parallel, schema)
        seq, t_seq, c_seq = timed(1, schema)
        n = len(convs)
        same = sum(a.text == b.text for a, b in zip(par, seq))
        for path, replies, t, c in [(f"{args.parallel} parallel sequences", par, t_par, c_par),
                                    ("one by one", seq, t_seq, c_seq)]:
            rows.append([f"{label}: {path}", n / t, n / c, sum(r.prompt_tokens for r in replies),
                         sum(r.completion_tokens for r in replies),
                         f"{sum(usable(r.text, s) for r, s in zip(replies, shown))}/{n}"])
        ratios.append(f"{label}: parallel/one-by-one {t_seq / t_par:.2f}x wall, {c_seq / c_par:.2f}x CPU; "
                      f"identical replies {same}/{n}")
    load_after = os.getloadavg()
    print(f"model={args.model} runtime={llm.identity['runtime']} threads={llm.identity.get('threads')} "
          f"gpu_layers={llm.identity.get('gpu_layers')} "
          f"batch={args.batch} slate={slate_size} max_tokens={settings.max_tokens}")
    print(tabulate(rows, headers=["path", "decisions/s (wall)", "decisions/s (CPU)", "prompt tokens",
                                  "reply tokens", "usable decisions"], floatfmt=".2f"))
    print()
    print("\n".join(ratios))
    print("load average (1, 5, 15 min): before " + ", ".join(f"{v:.2f}" for v in load_before)
          + "; after " + ", ".join(f"{v:.2f}" for v in load_after))


if __name__ == "__main__":
    main()
