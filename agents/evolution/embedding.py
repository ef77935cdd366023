"""Embed phase: one vector per probe from its bio and its liked items (Appendix C / D.3).

V_final = α · V_profile + (1 − α) · V_mean_likes, where V_profile = enc(bio) and
V_mean_likes = (1/n) Σ_j enc(item_j) over the n items of the behaviour stream, each item
written as the catalogue's text ("Title (Year), (Genres)"). The public release looked items
up by the wrong key type and silently used the bio alone; here the mean is over real item
vectors, and a probe without behaviour falls back to its bio explicitly.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError

from ..persona import Persona

DEFAULT_ALPHA = 0.2


def mixed_vector(bio_vector: np.ndarray, item_vectors: np.ndarray, alpha: float) -> np.ndarray:
    """α · bio + (1 − α) · mean(items); the bio alone when there are no items."""
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"alpha must be in [0, 1], got {alpha}")
    bio_vector = np.asarray(bio_vector, dtype=np.float64)
    if len(item_vectors) == 0:
        return bio_vector
    return alpha * bio_vector + (1.0 - alpha) * np.asarray(item_vectors, dtype=np.float64).mean(axis=0)


def probe_vectors(
    personas: Sequence[Persona], dataset: Dataset, encoder, *, alpha: float = DEFAULT_ALPHA
) -> np.ndarray:
    """(len(personas), d) float64: each persona's V_final. One `encode` call for bios, one for items."""
    if not personas:
        raise ConfigError("cannot embed an empty population")
    for persona in personas:
        dataset.check_items(persona.behaviour)
    bios = encoder.encode([p.bio or p.name for p in personas])
    items = list(dict.fromkeys(i for p in personas for i in p.behaviour))
    texts = dataset.items["text"].to_numpy()
    item_vecs = encoder.encode([str(texts[j]) for j in dataset.indices(items)]) if items else None
    row = {item: n for n, item in enumerate(items)}
    out = []
    for persona, bio in zip(personas, bios):
        own = item_vecs[[row[i] for i in persona.behaviour]] if persona.behaviour else np.zeros((0, len(bio)))
        out.append(mixed_vector(bio, own, alpha))
    return np.vstack(out)
