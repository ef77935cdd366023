"""Controllability ceiling: which target items can the probes reach at all?

From each probe's seed history we explore the recommendation graph: a node is
(history, items shown so far); its slate is the black box's answer; an edge is
"like item i on the slate" (one like per round) or "skip". A target item is
reachable when it appears on some slate at depth < budget (a probe could then
like it). The full graph has (slate_size + 1)^budget paths, so the exploration
is a beam search: at every depth each probe keeps `beam` nodes, preferring
paths with more target likes, ties interleaved across parents (rank on the
slate first). Bound: at most beam x budget expanded nodes per probe (default
beam = max_states_per_probe // budget). The result is therefore a LOWER bound
on the true ceiling unless `exhaustive` is True (the beam never had to drop a
node). Search actions are not explored (recommendation-only reachability).
Each depth level of all probes is served by one batched `recommend` call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import networkx as nx

from ctrlsim.errors import ConfigError
from ctrlsim.recommenders import Recommender, UserState

from .engine import ProbeSpec


@dataclass
class CeilingResult:
    reachable: set[str]
    target_size: int
    first_round: dict[str, int]      # target item -> fewest rounds before it can be shown
    states_expanded: int
    exhaustive: bool
    max_states_per_probe: int
    budget: int
    graphs: list[nx.DiGraph] = field(repr=False, default_factory=list)

    @property
    def coverage_ceiling(self) -> float:
        return len(self.reachable) / self.target_size if self.target_size else float("nan")

    def ceiling_at(self, rounds: int) -> float:
        """Reachable share of the target within `rounds` rounds."""
        hits = sum(1 for r in self.first_round.values() if r < rounds)
        return hits / self.target_size if self.target_size else float("nan")


def controllability_ceiling(recommender: Recommender, probes: Sequence[ProbeSpec], target: set[str], *,
                            slate_size: int, budget: int, max_states_per_probe: int = 300,
                            mask_shown: bool = True, keep_graphs: bool = False,
                            progress=None) -> CeilingResult:
    if max_states_per_probe < budget:
        raise ConfigError(f"max_states_per_probe ({max_states_per_probe}) must be >= budget ({budget})")
    beam = max_states_per_probe // budget
    graphs = [nx.DiGraph() for _ in probes]
    # Per probe, the current level: list of (target_likes, node); node = (history, shown).
    levels: list[list[tuple[int, tuple]]] = [[(0, (tuple(spec.history), frozenset()))] for spec in probes]
    first_round: dict[str, int] = {}
    expanded, exhaustive = 0, True
    for depth in range(budget):
        flat = [(n, likes, node) for n, level in enumerate(levels) for likes, node in level]
        if not flat:
            break
        # The probe's profile and attributes go with every state, as in the env's UserState.
        states = [UserState(history=node[0], shown=tuple(sorted(node[1])) if mask_shown else (),
                            profile=probes[n].profile, attributes=dict(probes[n].attributes),
                            user_id=probes[n].name)
                  for n, _, node in flat]
        slates = recommender.recommend(states, slate_size)
        expanded += len(flat)
        children: list[list] = [[] for _ in probes]
        for order, ((n, likes, node), slate) in enumerate(zip(flat, slates)):
            history, shown = node
            for item in slate.item_ids:
                if item in target and item not in first_round:
                    first_round[item] = depth
            if depth + 1 >= budget:
                continue
            new_shown = shown | frozenset(slate.item_ids) if mask_shown else shown
            options = [(history + (item,), likes + (item in target), f"like {item}")
                       for item in slate.item_ids]
            options.append((history, likes, "skip"))
            for rank, (child_history, child_likes, label) in enumerate(options):
                child = (child_history, new_shown)
                graphs[n].add_edge(node, child, action=label)
                children[n].append((-child_likes, rank, order, child_likes, child))
        levels = []
        for cands in children:
            cands.sort(key=lambda c: c[:3])
            unique = list({c[4]: c for c in cands}.values())
            if len(unique) > beam:
                exhaustive = False
            levels.append([(c[3], c[4]) for c in unique[:beam]])
        if progress is not None:
            progress(expanded)
    return CeilingResult(set(first_round), len(target), first_round, expanded, exhaustive,
                         max_states_per_probe, budget, graphs if keep_graphs else [])
