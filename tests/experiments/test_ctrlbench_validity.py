"""What CtrlBench's numbers count: recommender-only coverage, union targets, pooled Efficiency,
confidence intervals and paired tests checked against hand computations and scipy, custom methods."""
import json
import textwrap

import numpy as np
import pytest
from scipy import stats

import ctrlsim
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.ctrlbench import tables as T
from ctrlsim.experiments.ctrlbench.config import CtrlBenchConfig, episode_key
from ctrlsim.metrics.stats import mean_ci, paired_comparison, ratio_ci


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))


# ----------------------------------------------------------------------------- statistics

def test_mean_ci_is_scipys_t_interval():
    values = [0.1, 0.25, 0.05, 0.3]
    low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    est = mean_ci(values)
    assert est.value == pytest.approx(np.mean(values)) and est.n == 4
    assert (est.low, est.high) == (pytest.approx(low), pytest.approx(high))
    one = mean_ci([0.4, None])
    assert one.value == 0.4 and one.n == 1 and np.isnan(one.low)


def test_ratio_ci_pools_totals_and_counts_episodes_that_found_nothing():
    likes, found = [6, 0, 3], [4, 0, 3]      # the middle episode found no target at all
    est = ratio_ci(likes, found)
    assert est.value == 9 / 7 and est.n == 3  # a ratio of totals, not a mean of 1.5 and 1.0
    # The ratio estimator's variance by hand: d_i = y_i - R x_i, Var = s_d^2 / (n xbar^2).
    r = 9 / 7
    d = np.array([6 - r * 4, 0.0, 3 - r * 3])
    se = np.sqrt(d.var(ddof=1) / (3 * (7 / 3) ** 2))
    assert est.half_width == pytest.approx(stats.t.ppf(0.975, 2) * se)
    assert np.isnan(ratio_ci([0, 0], [0, 0]).value)


def test_paired_comparison_by_hand():
    method, reference = [0.3, 0.2, 0.4, 0.5, 0.25, 0.35], [0.1, 0.1, 0.2, 0.2, 0.2, 0.3]
    cmp = paired_comparison(method, reference)
    assert cmp.wins == 6 and cmp.losses == 0 and cmp.n == 6
    assert cmp.p_wilcoxon == pytest.approx(2 / 2 ** 6)  # exact: all six signs positive, two-sided
    assert cmp.difference.value == pytest.approx(np.mean(np.subtract(method, reference)))
    tied = paired_comparison([0.1, 0.2], [0.1, 0.2])
    assert np.isnan(tied.p_wilcoxon) and tied.difference.value == 0.0


# ----------------------------------------------------------------------------- tables by hand

def _record(method, box, seed, coverage, target_likes, found, k=2):
    return {"method": method, "label": method.title(), "recommender": box, "target": "War", "seed": seed,
            "policy": "random", "k": k, "rounds": 2, "setup_tokens": 0, "search_likes": 0,
            "curves": {"coverage": [coverage / 2, coverage], "len": [1.0, 2.0], "tokens": [0.0, 0.0],
                       "efficiency": [None, None], "efficiency_all_likes": [None, None]},
            "efficiency_counts": {"target_likes": [0, target_likes], "found": [0, found]},
            "parse_failures": 0, "decisions": 0, "dropped": {}, "probes": [], "template_fallbacks": None,
            "merges": None, "merge_fallbacks": None, "target_items_added": None}


def _records():
    recs = [_record("base-small", "narm", s, c, y, x) for s, (c, y, x) in enumerate([(0.1, 4, 2), (0.0, 0, 0),
                                                                                       (0.2, 6, 3)])]
    recs += [_record("mine", "narm", s, c, y, x) for s, (c, y, x) in enumerate([(0.3, 3, 3), (0.2, 2, 2),
                                                                                 (0.4, 5, 4)])]
    recs += [_record("base-small", "popularity", s, 0.9, 9, 9) for s in range(3)]
    recs += [_record("mine", "popularity", s, 0.9, 9, 9) for s in range(3)]
    return {f"{r['method']}|{r['recommender']}|War|seed={r['seed']}": r for r in recs}


def _row(table, *cells) -> list[str]:
    """The row of a report's `Table` that starts with `cells`, as cell text."""
    for row in table.rows:
        parts = [str(c) for c in row]
        if parts[: len(cells)] == list(cells):
            return parts
    raise AssertionError(f"no row {cells} in\n{table.markdown()}")


def test_table7_is_per_box_with_pooled_efficiency():
    config = _config()
    table = T.table7(config, _records())
    narm = _row(table, "narm", "Base-Small")
    # Coverage over narm's three episodes only (the popularity box's 90% never mixes in), a share
    # with scipy's bootstrap interval, which stays in [0, 100]% where a t interval would not.
    from audit_checks import share_interval

    mean, low, high = share_interval([0.1, 0.0, 0.2])
    assert narm[4] == f"{100 * mean:.2f} [{100 * low:.2f}, {100 * high:.2f}]"
    assert mean_ci([0.1, 0.0, 0.2]).low < 0 <= low
    assert narm[5].startswith(f"{10 / 5:.2f} ±")  # (4 + 0 + 6) / (2 + 0 + 3)
    assert narm[6] == "2/3"                        # one episode found nothing, and still counts
    assert _row(table, "popularity", "Mine")[4] == "90.00 [90.00, 90.00]"  # no spread seen


def _config():
    class Config:  # the fields the tables read, without validating a custom method name
        recommenders = ("narm", "popularity")
        all_methods = ("base-small", "mine")
        targets = ("War",)
        rounds = 2
        reference_method = "base-small"

        @staticmethod
        def report_rounds():
            return (1, 2)
    return Config()


def test_paired_table_pairs_by_box_target_and_seed():
    table = T.paired_table(_config(), _records())
    narm = _row(table, "narm", "Mine")
    diff = mean_ci([0.2, 0.2, 0.2])
    assert narm[3] == "3" and narm[4] == f"{100 * diff.value:.2f} ± 0.00" and narm[5] == "3/0/0"
    assert float(narm[6]) == pytest.approx(0.25)  # exact two-sided Wilcoxon with 3 positive pairs
    pooled = _row(table, "all boxes", "Mine")
    assert pooled[3] == "6" and pooled[5] == "3/3/0"


# ----------------------------------------------------------------------------- recommender-only coverage

SEARCHER = textwrap.dedent('''
    """A user's method for the tests: probes that search the target genre and like what search finds."""
    import numpy as np
    from ctrlsim.agents.methods import CustomPolicy, Population


    class GenreSearcher:
        def __init__(self, target):
            self.target = target

        def act(self, observation, info):
            likes = np.zeros(len(observation["slate"]), dtype=np.int8)
            if info["slate_source"] == "search":
                likes[: len(info["slate_item_ids"])] = [i in self.target for i in info["slate_item_ids"]]
                return {"likes": likes, "query": ""}
            return {"likes": likes, "query": "war"}


    def build(context):
        target = set(context.target_items)
        policy = CustomPolicy.per_probe("genre-searcher", lambda persona, rng: GenreSearcher(target))
        return Population(tuple(context.template_personas(context.k_small)), policy)
''')


@pytest.fixture
def searcher_module(tmp_path, monkeypatch):
    (tmp_path / "my_searcher.py").write_text(SEARCHER)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_searcher:build"


def test_search_likes_never_count_as_the_recommenders(ml100k, tmp_path, searcher_module):
    config = CtrlBenchConfig(methods=(searcher_module, "oracle"), recommenders=("popularity",),
                             targets=("War",), agents=(3, 3), rounds=4, seeds=(0,), allow_search=True,
                             decision="json")
    result = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(tmp_path / "run")),
                         show_progress=False, raise_on_failure=False)
    record = result.records_by_key[episode_key(searcher_module, "popularity", "War", 0)]
    rounds = [r for p in record["probes"] for r in p["rounds"]]
    assert {r["source"] for r in rounds} == {"recommender", "search"}
    # Every target like came from search: the recommender gets no credit at all.
    assert record["search_target_likes"] > 0 and record["curves"]["coverage"] == [0.0] * 4
    assert record["search_likes"] == sum(len(r["liked"]) for r in rounds if r["source"] == "search")
    assert record["policy"] == "genre-searcher" and "search likes" in result.markdown.lower()


def test_search_is_refused_by_default(ml100k, tmp_path, searcher_module):
    config = CtrlBenchConfig(methods=(searcher_module,), recommenders=("popularity",), targets=("War",),
                             agents=(3, 2), rounds=3, seeds=(0,))
    record = next(iter(ctrlsim.run("ctrlbench", config=config,
                                   options=RunOptions(out=str(tmp_path / "run")), show_progress=False,
                                   raise_on_failure=False).records_by_key.values()))
    assert len(record["dropped"]) == 2 and all("allow_search=False" in r for r in record["dropped"].values())


def test_oracle_covers_exactly_the_targets_its_slates_showed(ml100k, tmp_path):
    config = CtrlBenchConfig(methods=("oracle", "random"), recommenders=("embedding",),
                             targets=("War+Film-Noir",), agents=(3, 3), rounds=4, seeds=(0,))
    records = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(tmp_path / "run")),
                          show_progress=False, raise_on_failure=False).records_by_key
    oracle = records[episode_key("oracle", "embedding", "War+Film-Noir", 0)]
    union = set(ml100k.items_with_tag("War")) | set(ml100k.items_with_tag("Film-Noir"))
    shown = {i for p in oracle["probes"] for r in p["rounds"] for i in r["slate"]}
    assert oracle["target_size"] == len(union) == 95
    assert oracle["curves"]["coverage"][-1] == len(shown & union) / 95 > 0
    # The per-tag split (Figure 3) counts the found items carrying each tag.
    assert oracle["tag_found"] == {"War": len(shown & set(ml100k.items_with_tag("War"))),
                                   "Film-Noir": len(shown & set(ml100k.items_with_tag("Film-Noir")))}


def test_base_small_draws_its_own_users_unless_nested(ml100k):
    from ctrlsim.agents.methods import MethodContext

    def context(sample):
        return MethodContext(ml100k, None, ("War",), frozenset(), 0, 8, 3, 2, 3, None, None, lambda: None,
                             small_sample=sample)

    large = context("small").sample_users(8, "large")
    own = context("small").sample_users(3, context("small").small_sample)
    nested = context("large").sample_users(3, context("large").small_sample)
    assert nested == large[:3] and own != large[:3] and len(set(own)) == 3


def test_evaluation_setting_is_shared_with_evolve():
    from ctrlsim.agents import llm_probe

    from ctrlsim.experiments.evolve.config import EvolveConfig

    bench, evolve = CtrlBenchConfig(), EvolveConfig()
    assert bench.memory_rounds == evolve.eval_memory_rounds == llm_probe.EVALUATION_MEMORY_ROUNDS
    assert bench.temperature == evolve.eval_temperature == llm_probe.EVALUATION_TEMPERATURE
    assert bench.allow_search == evolve.allow_search == llm_probe.EVALUATION_ALLOW_SEARCH


def test_tables_and_records_round_trip_through_json(ml100k, tmp_path):
    config = CtrlBenchConfig(methods=("random", "oracle"), recommenders=("popularity",), targets=("War",),
                             agents=(3, 2), rounds=2, seeds=(0, 1), task="popularity")
    out = tmp_path / "run"
    result = ctrlsim.run("ctrlbench", config=config, options=RunOptions(out=str(out)), show_progress=False,
                         raise_on_failure=False)
    stored = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()[1:]]
    assert len(stored) == 4 and "Task 3" in result.markdown
    assert {p.name for p in (out / "figures").iterdir()} >= {"new_discoveries_by_round.png",
                                                            "popularity_by_round.png"}
