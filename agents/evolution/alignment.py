"""Align phase: the super probes' behaviour becomes their seed history (§3.3, §3.2 Stage 2).

Before evaluation each super probe's distilled behaviour is what the black box is told about
it. Alignment keeps only catalogue items (deduplicated, order kept) and, for a probe whose
behaviour is shorter than `min_behaviour`, runs the paper's register-search-click step: it
searches the catalogue (BM25 over item texts) with the probe's interests and "clicks" the
best matches it does not have yet, so no super probe starts cold. No LLM is involved.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from ctrlsim.data import Dataset

from ..persona import Persona

FLAG_SEARCH_FILLED = "aligned_by_search"


@dataclass(frozen=True)
class AlignmentRecord:
    probe_id: str
    kept: int
    dropped_unknown: tuple[str, ...]
    searched: tuple[str, ...]

    def to_dict(self) -> dict:
        return {
            "probe_id": self.probe_id,
            "kept": self.kept,
            "dropped_unknown": list(self.dropped_unknown),
            "searched": list(self.searched),
        }


def align_roster(
    personas: Sequence[Persona], dataset: Dataset, *, min_behaviour: int = 4, search=None
) -> tuple[list[Persona], list[AlignmentRecord]]:
    """Personas ready for evaluation (seed history = behaviour) and what alignment changed."""
    known = dataset.item_index
    aligned, records = [], []
    for persona in personas:
        behaviour = [i for i in dict.fromkeys(persona.behaviour) if i in known]
        dropped = tuple(i for i in persona.behaviour if i not in known)
        searched: list[str] = []
        if len(behaviour) < min_behaviour:
            if search is None:
                from ctrlsim.recommenders.search import CatalogueSearch

                search = CatalogueSearch(dataset)
            query = " ".join(persona.interests) or persona.bio
            exclude = dataset.indices(behaviour)
            hits = search.search(query, min_behaviour - len(behaviour), exclude=exclude) if query else []
            searched = [str(dataset.item_ids[j]) for j in hits]
            behaviour += searched
        flags = persona.flags + ((FLAG_SEARCH_FILLED,) if searched else ())
        aligned.append(replace(persona, behaviour=tuple(behaviour), flags=flags))
        records.append(
            AlignmentRecord(persona.probe_id, len(behaviour) - len(searched), dropped, tuple(searched))
        )
    return aligned, records
