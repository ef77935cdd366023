"""SteerEval's prompts (appendix B), shared by the nl-profile recommender and the protocols.

The instructions are the paper's, character for character (tests compare them with
the appendix). The system message is not printed in the paper; it is the one the
SteerEval release sends with every profile and score prompt, kept here for the same
reason (see docs/steereval.md).

Item text is tag-free by default: title with year, plus the description where one
is attached (the paper's "title and TMDb description"). Showing an item's tags is a
named variant (`show_tags=True`) because tag names in item text give the ranker the
answer that the oracle condition is meant to isolate.
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd

SYSTEM = ("Write a response that appropriately completes the following request. "
          "Follow the instructions exactly.")

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
# The digit-probability rating reads the next token after this assistant prefix; the
# user message itself ends with "SCORE:" as in the paper.
SCORE_PREFIX = "SCORE: "


def item_title(item: pd.Series) -> str:
    """"Title (Year)", or the bare title when the year is unknown."""
    year = item.get("year")
    return str(item["title"]) if year is None or pd.isna(year) else f"{item['title']} ({int(year)})"


def item_description(item: pd.Series, *, show_tags: bool = False) -> str:
    """The attached description ("" when none); with `show_tags`, the item's tags appended."""
    description = str(item.get("description", "") or "").strip()
    if show_tags and len(item["tags"]):
        tags = f"({', '.join(item['tags'])})"
        description = f"{description} {tags}".strip()
    return description


def item_block(item: pd.Series, rating: float | None = None, *, show_tags: bool = False) -> str:
    """SteerEval's item block: title, description (when there is one), rating (in histories)."""
    block = f"Movie Title: {item_title(item)}"
    description = item_description(item, show_tags=show_tags)
    if description:
        block += f"\nMovie Description: {description}"
    if rating is not None:
        block += f"\nUser Rating: {float(rating):.1f}"
    return block


def embedding_text(item: pd.Series, *, show_tags: bool = False) -> str:
    """The text the embedding ranker encodes: the same facts as the item block, on one line."""
    description = item_description(item, show_tags=show_tags)
    return f"{item_title(item)}. {description}" if description else item_title(item)


def profile_messages(items: Sequence[pd.Series], ratings: Sequence[float | None], style: str, *,
                     show_tags: bool = False) -> list[dict]:
    history = "\n\n".join(item_block(it, r, show_tags=show_tags) for it, r in zip(items, ratings))
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{PROFILE_STYLES[style]}\n\nUser watch history:\n\n{history}"}]


def score_prompt(profile: str, item_text: str) -> str:
    """The score-prediction request as the paper prints it (task, profile, candidate, "SCORE:")."""
    return f"{SCORE_TASK}\n\nUSER PROFILE:\n{profile}\nCANDIDATE MOVIE:\n{item_text}\nSCORE:"


def score_messages(profile: str, item: pd.Series, *, show_tags: bool = False) -> list[dict]:
    """System message plus the score request; items of one profile share the prompt up to the candidate."""
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": score_prompt(profile, item_block(item, show_tags=show_tags))}]
