"""SteerEval tables 1-3, 5, 7, 8 on a dataset with the bundled LLM, resumable.

Every (condition, scenario) pair is one `SteerEvalEnv` episode whose figures
are appended to a JSON-lines `ResultStore` as soon as they exist; a rerun with
the same config skips what is done, and the LLM's response cache makes even a
half-finished condition cheap to redo. Conditions:

  default        LLM scoring, paragraph profile, template append
  embedding      embedding ranker, paragraph profile, template append   (Table 1)
  sentence       LLM scoring, sentence profile, template append         (Table 2)
  llm-append     LLM scoring, paragraph profile, LLM-written append     (Table 3)
  llm-rewrite    LLM scoring, paragraph profile, LLM rewrite            (Table 3)
  oracle         default with tag relevance written into item texts    (Table 7)

Tables 5 and 7 split the scenarios by tag kind (genre / trigger: trigger tags
only where a tag table was attached); Table 8 reads Rank_set from `default`.
Significance: one-tailed paired t-test of AUC_t after vs before (greater for
increase, less for decrease), alpha 0.05, as in the paper.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ctrlsim.data import load_dataset
from ctrlsim.experiments.store import ResultStore
from ctrlsim.metrics import paired_t_test
from ctrlsim.seeding import derive_rng

CONDITIONS = {
    "default": {"ranker": "llm", "profile_style": "paragraph", "intervention": "template-append", "oracle": False},
    "embedding": {"ranker": "embedding", "profile_style": "paragraph", "intervention": "template-append",
                  "oracle": False},
    "sentence": {"ranker": "llm", "profile_style": "sentence", "intervention": "template-append", "oracle": False},
    "llm-append": {"ranker": "llm", "profile_style": "paragraph", "intervention": "llm-append", "oracle": False},
    "llm-rewrite": {"ranker": "llm", "profile_style": "paragraph", "intervention": "llm-rewrite", "oracle": False},
    "oracle": {"ranker": "llm", "profile_style": "paragraph", "intervention": "template-append", "oracle": True},
}


@dataclass
class SteerEvalRunConfig:
    llm: str = "qwen2.5-0.5b"
    encoder: str = "minilm"
    dataset: str = "ml-100k"
    users: int = 2
    tags: tuple[str, ...] = ("Horror", "Romance")
    pool_size: int = 20
    history_len: int = 50
    min_ratings: int = 100
    conditions: tuple[str, ...] = tuple(CONDITIONS)
    seed: int = 0
    out: str = "results/steereval"
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("out")
        return d


def scenarios_for(ds, cfg: SteerEvalRunConfig):
    from ctrlsim.envs.steereval_env import DIRECTIONS, build_scenario, eligible_users

    users = eligible_users(ds, cfg.min_ratings)
    rng = derive_rng(cfg.seed, "steereval-users")
    chosen = [users[i] for i in rng.permutation(len(users))]
    out, skipped, used_users = [], [], 0
    for user in chosen:
        if used_users >= cfg.users:
            break
        built = [build_scenario(ds, user, tag, d, pool_size=cfg.pool_size, history_len=cfg.history_len)
                 for tag in cfg.tags for d in DIRECTIONS]
        if any(sc is None for sc in built):
            skipped.append(user)
            continue
        out.extend(built)
        used_users += 1
    return out, skipped


def run(cfg: SteerEvalRunConfig, *, show_progress: bool = True) -> dict:
    from ctrlsim.agents.steering import LLMAppend, LLMRewrite, TemplateAppend
    from ctrlsim.backends import load_llm
    from ctrlsim.envs.steereval_env import SteerEvalEnv

    out_dir = Path(cfg.out)
    store = ResultStore(out_dir / "records.jsonl", cfg.to_dict())
    ds = load_dataset(cfg.dataset)
    llm = load_llm(cfg.llm, cache=out_dir / "llm-cache.sqlite")
    scenarios, skipped = scenarios_for(ds, cfg)
    envs: dict[tuple, SteerEvalEnv] = {}
    policies = {"template-append": TemplateAppend(), "llm-append": LLMAppend(llm), "llm-rewrite": LLMRewrite(llm)}
    todo = [(c, sc) for c in cfg.conditions for sc in scenarios if f"{c}/{sc.key}" not in store]
    bar = tqdm(todo, desc="steereval scenarios", disable=not show_progress)
    for cond, sc in bar:
        spec = CONDITIONS[cond]
        env_key = (spec["ranker"], spec["profile_style"], spec["oracle"])
        if env_key not in envs:
            envs[env_key] = SteerEvalEnv(dataset=ds, llm=llm, ranker=spec["ranker"], encoder=cfg.encoder,
                                         profile_style=spec["profile_style"], oracle=spec["oracle"],
                                         tags=cfg.tags, pool_size=cfg.pool_size, history_len=cfg.history_len,
                                         min_ratings=cfg.min_ratings)
        env = envs[env_key]
        obs, info = env.reset(options={"scenario": sc})
        steered = policies[spec["intervention"]].act(obs, info)
        _, reward, _, _, figures = env.step(steered)
        store.add(f"{cond}/{sc.key}", {"condition": cond, "tag": sc.tag, "tag_kind": sc.tag_kind,
                                       "direction": sc.direction, "user": sc.user_id, "reward": reward,
                                       **figures})
        bar.set_postfix(condition=cond)
    return {"config": cfg.to_dict(), "llm": llm.identity, "skipped_users": skipped,
            "records": [r for _, r in store.records()], "tokens": llm.meter.total.to_dict()}


# ------------------------------------------------------------------- tables
def _cell(records: list[dict], direction: str) -> str:
    rows = [r for r in records if r["direction"] == direction]
    if not rows:
        return "-"
    test = paired_t_test([r["auc_after"] for r in rows], [r["auc_before"] for r in rows],
                         alternative="greater" if direction == "increase" else "less")
    star = " (*)" if test.significant() else ""
    return f"{test.mean:+.4f}{star} n={test.n}"


def _by(records, **match):
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def format_tables(result: dict) -> str:
    from tabulate import tabulate

    recs = result["records"]
    head = ["", "Incr. ΔAUC_t (↑)", "Decr. ΔAUC_t (↓)"]

    def table(title, rows):
        body = [[name, _cell(rs, "increase"), _cell(rs, "decrease")] for name, rs in rows]
        return f"{title}\n{tabulate(body, headers=head)}\n"

    parts = [
        table("Table 1. Ranking method (paragraph profile, template append)",
              [("LLM scoring", _by(recs, condition="default")), ("Embedding", _by(recs, condition="embedding"))]),
        table("Table 2. Profile generation (LLM scoring, template append)",
              [("Paragraph-length", _by(recs, condition="default")),
               ("Sentence-length", _by(recs, condition="sentence"))]),
        table("Table 3. Steering intervention",
              [("Template append", _by(recs, condition="default")), ("LLM append", _by(recs, condition="llm-append")),
               ("LLM rewrite", _by(recs, condition="llm-rewrite"))]),
    ]
    default = _by(recs, condition="default")
    kinds = sorted({r["tag_kind"] for r in default})
    parts.append(table("Table 5. Tag source",
                       [(f"{k.capitalize()} ({len({r['tag'] for r in _by(default, tag_kind=k)})})",
                         _by(default, tag_kind=k)) for k in kinds]))
    rows7 = []
    for k in kinds:
        rows7 += [(f"{k.capitalize()}-Oracle", _by(recs, condition="oracle", tag_kind=k)),
                  (k.capitalize(), _by(default, tag_kind=k))]
    rows7 += [("All-Oracle", _by(recs, condition="oracle")), ("All", default)]
    parts.append(table("Table 7. Oracle item information", rows7))
    rows8 = []
    for direction in ("increase", "decrease"):
        for rel, name in ((True, "Rel."), (False, "Irrel.")):
            rs = [r for r in _by(default, direction=direction) if r["next_item_relevant"] == rel]
            if rs:
                before = np.mean([r["rank_set_before"] for r in rs])
                delta = np.mean([r["rank_set_after"] - r["rank_set_before"] for r in rs])
                rows8.append([direction.capitalize(), name, f"{before:.2f}", f"{delta:+.2f}", len(rs)])
    parts.append("Table 8. Rank_set of the true next item within its relevance subset (lower is better)\n"
                 + tabulate(rows8, headers=["Task", "Type", "Original Rank_set", "ΔRank_set", "n"]) + "\n")
    problems = sum(1 for r in recs if r.get("edit_problems"))
    parts.append(f"LLM: {result['llm']}\nScenarios with edit problems (refusal/misreading flags): {problems} "
                 f"of {len(recs)}; skipped users (pool quotas not met): {result['skipped_users']}; "
                 f"tokens: {result['tokens']}")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ctrlsim steereval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", default="qwen2.5-0.5b")
    parser.add_argument("--users", type=int, default=2)
    parser.add_argument("--tags", default="Horror,Romance", help="comma-separated tags")
    parser.add_argument("--pool-size", type=int, default=20, help="the paper uses 100")
    parser.add_argument("--conditions", default=",".join(CONDITIONS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/steereval")
    args = parser.parse_args(argv)
    cfg = SteerEvalRunConfig(llm=args.llm, users=args.users, tags=tuple(args.tags.split(",")),
                             pool_size=args.pool_size, conditions=tuple(args.conditions.split(",")),
                             seed=args.seed, out=args.out)
    print(format_tables(run(cfg)))
    return 0
