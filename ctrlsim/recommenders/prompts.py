"""SteerEval's prompts (appendix B), shared by the nl-profile recommender and the protocols."""
from __future__ import annotations

from typing import Sequence

import pandas as pd

SYSTEM = "Write a response that appropriately completes the following request. Follow the instructions exactly."

PROFILE_PARAGRAPH = (
    "Given the user's previously watched and rated movies, write in a single paragraph (5-6 sentences) "
    "summarizing their taste. Be definitive (no hedging). Do NOT mention tags, genres, metadata, reviews, "
    "or any lack thereof. Infer tone, pacing, themes, and style."
)
PROFILE_SENTENCE = (
    "Given the user's previously watched and rated movies, write exactly ONE concise English sentence "
    "(20-35 words) summarizing their taste. Be definitive (no hedging). Do NOT mention tags, genres, "
    "metadata, reviews, or any lack thereof. Infer tone, pacing, themes, and style."
)
PROFILE_STYLES = {"paragraph": PROFILE_PARAGRAPH, "sentence": PROFILE_SENTENCE}

SCORE_TASK = (
    "Task: Predict the user's rating for a movie on a scale from 0.0 to 5.0\n"
    "Guidelines:\n"
    "- 0.0: Completely irrelevant.\n"
    "- 5.0: Perfect match for ALL user interests.\n"
    "- Use decimal precision as necessary (e.g. 1.4, 3.7, 4.2) to capture partial matches.\n"
    "- Be strict. Do not give high scores for partial matches.\n"
    "Output format: A single float number only."
)
SCORE_PREFIX = "SCORE: "


def fallback_description(item: pd.Series) -> str:
    """How an item without a description (ml-100k) is described: its year and tags."""
    parts = []
    if not pd.isna(item["year"]):
        parts.append(f"Released {int(item['year'])}")
    if item["tags"]:
        parts.append(", ".join(item["tags"]))
    return ". ".join(parts)


def item_block(item: pd.Series, rating: float | None = None) -> str:
    """SteerEval's item block: title, description, rating."""
    description = str(item.get("description", "") or "") or fallback_description(item)
    block = f"Movie Title: {item['title']}\nMovie Description: {description}"
    if rating is not None:
        block += f"\nUser Rating: {float(rating):.1f}"
    return block


def profile_messages(items: Sequence[pd.Series], ratings: Sequence[float | None], style: str) -> list[dict]:
    history = "\n\n".join(item_block(it, r) for it, r in zip(items, ratings))
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{PROFILE_STYLES[style]}\n\nUser watch history:\n\n{history}"}]


def score_messages(profile: str, item: pd.Series) -> list[dict]:
    """The score-prediction prompt; the profile comes first so many items share one prefix."""
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{SCORE_TASK}\n\nUSER PROFILE:\n{profile}\nCANDIDATE MOVIE:\n"
                                        f"{item_block(item)}"}]
