"""PromptShift Tables 4, 5 and 6 (Gan & Dong, section 5) on a dataset with bundled LLMs, resumable.

Per LLM and sampled user, every identity-cue scenario is one `PromptShiftEnv`
episode: the env generates L^0, the three paraphrase controls and the cued
list, and the four rerankers B0-B3 reorder the cued pool. Results go to a
JSON-lines `ResultStore` as soon as they exist:

  "<llm>/<user>/controls"     the history-only and paraphrase lists (+ Paraphrase Drift)
  "<llm>/<user>/<scenario>"   the cued list, its slice, and the metrics of B0-B3

A rerun with the same config skips finished keys and refills the env's list
cache from the stored lists, so nothing already generated is generated again.
Tables are computed from the stored lists at the end (with the paper's
reranking parameters, or with parameters chosen on the validation split when
`select_on_validation` is set).

Layouts: Table 4 (Paraphrase Drift, Cue Drift, Delta d, SliceShift per
dataset-model), Table 5 (B0 vs B3 per dataset-model), Table 6 (B0-B3, macro
means over dataset-model settings). Cue Drift, SliceShift and Tables 5/6 are
means over the scenarios of per-scenario user means. The paper reports no
significance tests; we add one-tailed paired t-tests for its claims
(Delta d > 0, SliceShift > 0, and B1-B3 against B0 per metric).

Users: up to `n_users` eligible users, sampled once with the config's seed and
stratified by the gender-age slice (one per stratum first, the rest
proportionally), so every sampled user runs every scenario.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

import numpy as np
from tabulate import tabulate
from tqdm import tqdm

from ctrlsim.agents.rerankers import PAPER_PARAMS, PARAM_GRID, VARIANTS, RerankParams, make_reranker, select_params
from ctrlsim.backends import LLM
from ctrlsim.data import load_dataset
from ctrlsim.data.splits import SCENARIOS
from ctrlsim.envs.promptshift_env import PromptShiftData, PromptShiftEnv
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.store import ResultStore
from ctrlsim.metrics import paired_t_test
from ctrlsim.recommenders.llm_lists import GeneratedList
from ctrlsim.seeding import derive_rng

DEFAULT_RUN_LLM = "qwen2.5-0.5b"
VARIANT_LABELS = {"B0": "Original", "B1": "All-user-fixed", "B2": "Slice-fixed", "B3": "PromptShift"}
DATASET_LABELS = {"ml-100k": "MovieLens 100K", "ml-1m": "MovieLens 1M"}


@dataclass
class PromptShiftRunConfig:
    """Everything that determines the results (stored with them), plus `out` and `llm_cache`.

    `params` are B3's reranking parameters (the paper's by default);
    `select_on_validation` replaces them by the best point of
    `agents.rerankers.PARAM_GRID` on the validation split when the tables are
    computed (the stored lists are the same either way).
    """

    llms: tuple[str, ...] = (DEFAULT_RUN_LLM,)
    dataset: str = "ml-100k"
    n_users: int = 8
    seed: int = 0
    scenarios: tuple[str, ...] = SCENARIOS
    n_candidates: int = 30
    k: int = 20
    history_len: int = 25
    min_fit_positives: int = 25
    positive_threshold: float | None = 4.0
    p: float = 0.9
    rho: float = 0.2
    match_threshold: float = 90.0
    max_tokens: int | None = None
    temperature: float = 0.0
    exclude_history: bool = False
    params: dict = field(default_factory=PAPER_PARAMS.to_dict)
    select_on_validation: bool = False
    out: str = "results/promptshift.jsonl"
    llm_cache: str | None = None

    def __post_init__(self):
        if isinstance(self.llms, str):
            self.llms = (self.llms,)
        self.llms, self.scenarios = tuple(self.llms), tuple(self.scenarios)
        if not self.llms:
            raise ConfigError("at least one LLM is needed")
        if not 1 <= self.n_users:
            raise ConfigError(f"n_users must be >= 1, got {self.n_users}")
        RerankParams(**self.params)  # validates

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("out")
        d.pop("llm_cache")
        return d

    def store_config(self) -> dict:
        """What the stored records depend on (selection happens afterwards, from the stored lists)."""
        d = self.to_dict()
        d.pop("select_on_validation")
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "PromptShiftRunConfig":
        return cls(**dict(d))


# ------------------------------------------------------------------- sample
def sample_users(data: PromptShiftData, n_users: int, seed: int) -> list[str]:
    """Scenario-stratified sample (strata: gender-age slices) of eligible users, fixed by `seed`."""
    from ctrlsim.data import identity_slices

    cross = identity_slices(data.dataset, "gender_age")
    strata: dict[str, list[str]] = {}
    for u in data.eligible:
        strata.setdefault(str(cross.get(u, "none")), []).append(u)
    names = sorted(strata)
    n = min(n_users, len(data.eligible))
    sizes = np.array([len(strata[g]) for g in names], dtype=float)
    alloc = np.zeros(len(names), dtype=int)
    if n >= len(names):
        alloc += 1
    rest = n - alloc.sum()
    if rest > 0:
        share = sizes / sizes.sum() * rest
        alloc += np.floor(share).astype(int)
        left = n - alloc.sum()
        for j in np.argsort(-(share - np.floor(share)), kind="stable")[:left]:
            alloc[j] += 1
    rng = derive_rng(seed, "promptshift-users")
    chosen = []
    for g, a in zip(names, alloc):
        members = strata[g]
        a = min(int(a), len(members))
        chosen += [members[i] for i in sorted(rng.choice(len(members), size=a, replace=False))]
    # Top up (only when a stratum was too small) and fix a seeded processing order.
    spare = [u for u in data.eligible if u not in set(chosen)]
    if len(chosen) < n:
        chosen += [spare[i] for i in rng.choice(len(spare), size=n - len(chosen), replace=False)]
    return [chosen[i] for i in rng.permutation(len(chosen))]


# ---------------------------------------------------------------- evaluation
def _rerankers(env: PromptShiftEnv, params: RerankParams, b3_params: RerankParams | None = None) -> dict:
    """B0-B3; `b3_params` (validation-selected) replace `params` for B3 only."""
    kw = {"slice_names": env.slice_names, "slice_means": env.data.slice_means()}
    return {v: make_reranker(v, env.slice_table, params=b3_params if v == "B3" and b3_params else params, **kw)
            for v in VARIANTS}


def _variant_metrics(env: PromptShiftEnv, obs: dict, rerankers: Mapping, part: str = "test") -> dict:
    slice_id = env.slice_names[int(obs["slice"])]
    return {v: env.evaluate(r.order(obs["candidates"], slice_id, obs["history"]), part=part)
            for v, r in rerankers.items()}


def _generated(d: Mapping) -> GeneratedList:
    return GeneratedList(d["condition"], list(d["titles"]), d["text"], d["prompt_tokens"], d["completion_tokens"],
                         d.get("raw_count", 0), d.get("error"))


def _make_env(cfg: PromptShiftRunConfig, data: PromptShiftData, llm) -> PromptShiftEnv:
    return PromptShiftEnv(llm, data=data, n_candidates=cfg.n_candidates, k=cfg.k, p=cfg.p, rho=cfg.rho,
                          match_threshold=cfg.match_threshold, max_tokens=cfg.max_tokens,
                          temperature=cfg.temperature, exclude_history=cfg.exclude_history,
                          llm_cache=cfg.llm_cache)


def _preload(env: PromptShiftEnv, records: Mapping[str, dict], llm_name: str, users: Sequence[str]) -> None:
    """Put the stored lists of `users` into the env's list cache (no LLM call needed for them)."""
    for user in users:
        controls = records.get(f"{llm_name}/{user}/controls")
        if controls:
            for d in controls["lists"]:
                env.preload(user, _generated(d))
        for s in env.scenarios:
            rec = records.get(f"{llm_name}/{user}/{s}")
            if rec:
                env.preload(user, _generated(rec["cue_list"]))


def _run_user(env: PromptShiftEnv, store: ResultStore, llm_name: str, user: str, params: RerankParams) -> None:
    rerankers = _rerankers(env, params)
    for s in env.scenarios:
        key = f"{llm_name}/{user}/{s}"
        if key in store:
            continue
        obs, info = env.reset(options={"user_id": user, "scenario": s})
        ep = env.episode
        ckey = f"{llm_name}/{user}/controls"
        if ckey not in store:
            para = [env.list_drift(pl) for pl in ep.paraphrases]
            store.add(ckey, {"user": user, "lists": [c.generated.to_dict() for c in (ep.reference, *ep.paraphrases)],
                             "paraphrase_drifts": para, "paraphrase_drift": float(np.mean(para)),
                             "matches": {c.condition: c.counts() for c in (ep.reference, *ep.paraphrases)}})
        store.add(key, {
            "user": user, "scenario": s, "slice": ep.slice_id,
            "mainstreamness": info["mainstreamness"], "scenario_mainstreamness": info["scenario_mainstreamness"],
            "cue_list": ep.cue.generated.to_dict(), "matches": ep.cue.counts(),
            "metrics": _variant_metrics(env, obs, rerankers),
        })


def _records_by_setting(store: ResultStore, llm_name: str, users: Sequence[str], scenarios: Sequence[str]):
    recs = dict(store.records())
    cue = [recs[f"{llm_name}/{u}/{s}"] for u in users for s in scenarios if f"{llm_name}/{u}/{s}" in recs]
    controls = [recs[f"{llm_name}/{u}/controls"] for u in users if f"{llm_name}/{u}/controls" in recs]
    return cue, controls


def _recompute(env: PromptShiftEnv, cue_records: list[dict], params: RerankParams, part: str,
               b3_params: RerankParams | None = None) -> list[dict]:
    """B0-B3 metrics of every stored (user, scenario) from the lists preloaded into `env` (no LLM call)."""
    rerankers = _rerankers(env, params, b3_params)
    out = []
    for rec in cue_records:
        obs, _ = env.reset(options={"user_id": rec["user"], "scenario": rec["scenario"]})
        out.append({**rec, "metrics": _variant_metrics(env, obs, rerankers, part)})
    return out


def _scenario_macro(records: list[dict], variant: str, metric: str, scenarios: Sequence[str]) -> float:
    """Mean over scenarios of the per-scenario mean over users."""
    means = []
    for s in scenarios:
        vals = [r["metrics"][variant][metric] for r in records if r["scenario"] == s]
        if vals:
            means.append(float(np.mean(vals)))
    return float(np.mean(means)) if means else float("nan")


def _metric_names(k: int) -> list[str]:
    return ["drift", "slice_shift", f"difficulty@{k}", f"hit_rate@{k}", f"mrr@{k}", f"ndcg@{k}"]


def _summarise(cfg: PromptShiftRunConfig, llm_name: str, identity: dict, records: list[dict],
               controls: list[dict], selection: dict | None) -> dict:
    k, scen = cfg.k, cfg.scenarios
    metrics = _metric_names(k)
    variants = {v: {m: _scenario_macro(records, v, m, scen) for m in metrics} for v in VARIANTS}
    para = float(np.mean([c["paraphrase_drift"] for c in controls])) if controls else float("nan")
    cue_drift = variants["B0"]["drift"]
    per_scenario = {s: {"cue_drift": float(np.mean([r["metrics"]["B0"]["drift"] for r in records
                                                     if r["scenario"] == s] or [np.nan])),
                        "slice_shift": float(np.mean([r["metrics"]["B0"]["slice_shift"] for r in records
                                                      if r["scenario"] == s] or [np.nan])),
                        "users": sum(1 for r in records if r["scenario"] == s)} for s in scen}
    # Significance (our addition): per-user means over scenarios, paired across users.
    by_user: dict[str, list[dict]] = {}
    for r in records:
        by_user.setdefault(r["user"], []).append(r)
    para_by_user = {c["user"]: c["paraphrase_drift"] for c in controls}
    users = [u for u in by_user if u in para_by_user]
    cue_u = [float(np.mean([r["metrics"]["B0"]["drift"] for r in by_user[u]])) for u in users]
    para_u = [para_by_user[u] for u in users]
    tests = {
        "delta_d>0": paired_t_test(cue_u, para_u, alternative="greater").__dict__,
        "slice_shift>0": paired_t_test([r["metrics"]["B0"]["slice_shift"] for r in records],
                                       alternative="greater").__dict__,
    }
    better = {"drift": "less", "slice_shift": "less", f"difficulty@{k}": "greater", f"hit_rate@{k}": "greater",
              f"mrr@{k}": "greater", f"ndcg@{k}": "greater"}
    for v in ("B1", "B2", "B3"):
        for m, alt in better.items():
            f = abs if m == "slice_shift" else (lambda x: x)  # SliceShift: closer to zero is better
            after = [f(r["metrics"][v][m]) for r in records]
            before = [f(r["metrics"]["B0"][m]) for r in records]
            name = f"{v} vs B0: {'|slice_shift|' if m == 'slice_shift' else m}"
            tests[name] = paired_t_test(after, before, alternative=alt).__dict__
    match_total = {"matched": 0, "total": 0, "in_history": 0, "parse_error": 0}
    for r in records:
        for key in match_total:
            match_total[key] += r["matches"].get(key, 0)
    for c in controls:
        for m in c["matches"].values():
            for key in match_total:
                match_total[key] += m.get(key, 0)
    tokens = {"prompt_tokens": sum(r["cue_list"]["prompt_tokens"] for r in records)
              + sum(d["prompt_tokens"] for c in controls for d in c["lists"]),
              "completion_tokens": sum(r["cue_list"]["completion_tokens"] for r in records)
              + sum(d["completion_tokens"] for c in controls for d in c["lists"])}
    return {
        "dataset": cfg.dataset, "model": llm_name, "llm": identity, "n_users": len(by_user),
        "n_records": len(records),
        "table4": {"paraphrase_drift": para, "cue_drift": cue_drift, "delta_d": cue_drift - para,
                   "slice_shift": variants["B0"]["slice_shift"]},
        "per_scenario": per_scenario, "variants": variants, "significance": tests,
        "matching": {**match_total, "match_rate": match_total["matched"] / max(match_total["total"], 1)},
        "tokens": tokens, "selection": selection,
    }


# --------------------------------------------------------------------- run
def run(config: PromptShiftRunConfig | Mapping | None = None, *, llms: Mapping[str, LLM] | None = None,
        stop_after_users: int | None = None, show_progress: bool = True, overwrite: bool = False) -> dict:
    """Run (or resume) the PromptShift tables; returns the summary that `format_tables` prints.

    `llms` supplies ready LLM objects by spec name (tests, shared meters);
    `stop_after_users` ends the run after that many newly processed users, as
    an interruption would (it is not part of the stored config).
    """
    cfg = config if isinstance(config, PromptShiftRunConfig) else PromptShiftRunConfig.from_dict(config or {})
    dataset = load_dataset(cfg.dataset)
    data = PromptShiftData.build(dataset, scenarios=cfg.scenarios, positive_threshold=cfg.positive_threshold,
                                 history_len=cfg.history_len, min_fit_positives=cfg.min_fit_positives)
    users = sample_users(data, cfg.n_users, cfg.seed)
    store = ResultStore(cfg.out, {**cfg.store_config(), "users": users}, overwrite=overwrite)
    params = RerankParams(**cfg.params)
    new_users = 0
    envs = {}
    complete = True
    for name in cfg.llms:
        env = _make_env(cfg, data, (llms or {}).get(name, name))
        envs[name] = env
        todo = [u for u in users if any(f"{name}/{u}/{s}" not in store for s in cfg.scenarios)]
        bar = tqdm(todo, desc=f"PromptShift {name}", unit="user", disable=not show_progress)
        for user in bar:
            if stop_after_users is not None and new_users >= stop_after_users:
                complete = False
                break
            _preload(env, dict(store.records()), name, [user])
            _run_user(env, store, name, user, params)
            new_users += 1
        bar.close()
        if not complete:
            break

    settings = []
    for name, env in envs.items():
        cue, controls = _records_by_setting(store, name, users, cfg.scenarios)
        if not cue:
            continue
        _preload(env, dict(store.records()), name, users)
        selection, final_params = None, params
        if cfg.select_on_validation:
            def evaluate(p: RerankParams) -> dict:
                recs = _recompute(env, cue, params, "valid", b3_params=p)
                return {**{m: float(np.mean([r["metrics"]["B3"][m] for r in recs])) for m in _metric_names(cfg.k)},
                        "abs_slice_shift": float(np.mean([abs(r["metrics"]["B3"]["slice_shift"]) for r in recs]))}
            base_recs = _recompute(env, cue, params, "valid")
            baseline = {m: float(np.mean([r["metrics"]["B0"][m] for r in base_recs])) for m in _metric_names(cfg.k)}
            final_params, grid_rows = select_params(evaluate, baseline, grid=PARAM_GRID, k=cfg.k, base=params)
            selection = {"chosen": final_params.to_dict(), "paper": PAPER_PARAMS.to_dict(), "grid": grid_rows,
                         "validation_baseline": baseline}
        records = _recompute(env, cue, params, "test", b3_params=final_params)
        identity = env.llm.identity if env.llm_loaded else {"spec": name}
        settings.append(_summarise(cfg, name, identity, records, controls, selection))
    metrics = _metric_names(cfg.k)
    table6 = {v: {m: float(np.mean([s["variants"][v][m] for s in settings])) if settings else float("nan")
                  for m in metrics} for v in VARIANTS}
    return {"config": {**cfg.to_dict(), "out": cfg.out}, "users": users, "complete": complete,
            "records": len(store), "settings": settings, "table6": table6}


# ------------------------------------------------------------------ format
def _f(x: float) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def format_tables(result: Mapping) -> str:
    """Tables 4, 5 and 6 in the paper's layout (plus sample sizes and our significance tests)."""
    k = result["config"]["k"]
    metrics = _metric_names(k)
    heads = ["Drift ↓", "SliceShift → 0", f"Difficulty@{k} ↑", f"HitRate@{k} ↑", f"MRR@{k} ↑", f"NDCG@{k} ↑"]
    out = []
    rows4 = [[DATASET_LABELS.get(s["dataset"], s["dataset"]), s["model"], _f(s["table4"]["paraphrase_drift"]),
              _f(s["table4"]["cue_drift"]), _f(s["table4"]["delta_d"]), _f(s["table4"]["slice_shift"]),
              s["n_users"], f"{s['matching']['match_rate']:.2f}"] for s in result["settings"]]
    out.append("Table 4: Prompt-effect results (Cue Drift and SliceShift averaged across scenarios)\n" + tabulate(
        rows4, headers=["Dataset", "Model", "Paraphrase Drift", "Cue Drift", "Δd", "SliceShift", "Users",
                        "Match rate"], tablefmt="github", disable_numparse=True))
    rows5 = []
    for s in result["settings"]:
        for v in ("B0", "B3"):
            rows5.append([DATASET_LABELS.get(s["dataset"], s["dataset"]), s["model"], v]
                         + [_f(s["variants"][v][m]) for m in metrics])
    out.append("Table 5: B0 vs B3 per dataset-model (averaged across scenarios)\n" + tabulate(
        rows5, headers=["Dataset", "Model", "Variant", *heads], tablefmt="github", disable_numparse=True))
    rows6 = [[v, VARIANT_LABELS[v]] + [_f(result["table6"][v][m]) for m in metrics] for v in VARIANTS]
    out.append(f"Table 6: Macro means across {len(result['settings'])} dataset-model setting(s)\n" + tabulate(
        rows6, headers=["Method", "", *heads], tablefmt="github", disable_numparse=True))
    sig = []
    for s in result["settings"]:
        for name, t in s["significance"].items():
            sig.append([s["model"], name, _f(t["mean"]), _f(t["t"]), _f(t["p"]), t["n"],
                        "yes" if t["p"] == t["p"] and t["p"] < 0.05 else "no"])
    out.append("One-tailed paired t-tests (our addition; the paper reports none)\n" + tabulate(
        sig, headers=["Model", "Test", "Mean diff", "t", "p", "n", "p < 0.05"], tablefmt="github",
        disable_numparse=True))
    for s in result["settings"]:
        if s.get("selection"):
            out.append(f"Validation-selected B3 parameters ({s['model']}): {s['selection']['chosen']}")
    if not result.get("complete", True):
        out.append("(partial run: rerun the same command to finish)")
    return "\n\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ctrlsim promptshift", description=__doc__.split("\n\n")[0])
    parser.add_argument("--llm", action="append", help=f"LLM spec (repeatable; default {DEFAULT_RUN_LLM})")
    parser.add_argument("--users", type=int, default=4, help="users to sample (paper: up to 600)")
    parser.add_argument("--out", default="results/promptshift.jsonl", help="result file (JSON lines, resumable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dataset", default="ml-100k")
    parser.add_argument("--n-candidates", type=int, default=30)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--select-on-validation", action="store_true",
                        help="choose B3's parameters on the validation split instead of the paper's values")
    parser.add_argument("--exclude-history", action="store_true", help="drop generated items already in the history")
    parser.add_argument("--llm-cache", default=None, help="response-cache file for the LLM (sqlite)")
    parser.add_argument("--overwrite", action="store_true", help="start the result file afresh")
    args = parser.parse_args(argv)
    cfg = PromptShiftRunConfig(llms=tuple(args.llm or [DEFAULT_RUN_LLM]), dataset=args.dataset, n_users=args.users,
                               seed=args.seed, scenarios=tuple(args.scenarios), n_candidates=args.n_candidates,
                               k=args.k, exclude_history=args.exclude_history,
                               select_on_validation=args.select_on_validation, out=args.out,
                               llm_cache=args.llm_cache)
    result = run(cfg, overwrite=args.overwrite)
    print(format_tables(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
