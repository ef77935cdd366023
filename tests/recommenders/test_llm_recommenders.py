"""nl-profile and keyword-bm25 on real bundled LLMs."""
import numpy as np
import pytest

from ctrlsim.errors import ConfigError, EmptyHistoryError, LLMOutputError
from ctrlsim.recommenders import UserState, make_recommender
from ctrlsim.recommenders.keyword_bm25 import parse_keywords
from ctrlsim.recommenders.prompts import PROFILE_PARAGRAPH, item_block

HORROR_FAN = ("This user loves horror films: slashers, ghosts, monsters, gore and suspense. "
              "They find romance and love stories dull.")


def share(ids, group):
    group = set(group)
    return np.mean([i in group for i in ids])


@pytest.fixture(scope="module")
def pools(ml100k):
    horror = ml100k.items_with_tag("Horror")
    romance = [i for i in ml100k.items_with_tag("Romance") if i not in set(horror)]
    return horror, horror[:10] + romance[:10]


@pytest.mark.llm
def test_nl_profile_llm_ranker_follows_the_profile(ml100k, qwen05, pools):
    horror, pool = pools
    # Item text is tag-free by default (SteerEval); from titles alone qwen2.5-0.5b puts only 4 of 10
    # horror movies on top, so this checks the ranker with the genres shown (show_tags=True).
    rec = make_recommender("nl-profile", ml100k, llm=qwen05, show_tags=True)
    slate = rec.recommend([UserState(profile=HORROR_FAN)], 10, candidates=pool)[0]
    assert share(slate.item_ids, horror) > 0.5
    assert rec.identity["llm"]["model"] == "qwen2.5-0.5b" and rec.identity["rating"] == "digits"


@pytest.mark.llm
def test_nl_profile_embedding_ranker_and_generated_profile(ml100k, smol, minilm, pools):
    horror, pool = pools
    rec = make_recommender("nl-profile", ml100k, llm=smol, ranker="embedding", encoder=minilm)
    slate = rec.recommend([UserState(profile=HORROR_FAN)], 10, candidates=pool)[0]
    assert share(slate.item_ids, horror) > 0.5
    state = UserState(history=tuple(horror[:3]), attributes={"ratings": (5.0, 4.0, 5.0)})
    profile = rec.profiles([state])[0]
    assert profile and rec.profiles([state])[0] == profile  # memoised, deterministic
    batch = rec.recommend([state, UserState(profile=HORROR_FAN)], 5, candidates=pool)
    assert batch[0].item_ids == rec.recommend([state], 5, candidates=pool)[0].item_ids
    with pytest.raises(EmptyHistoryError):
        rec.recommend([UserState()], 5, candidates=pool)


@pytest.mark.llm
def test_nl_profile_generate_and_parse_option(ml100k, smol, pools):
    _, pool = pools
    rec = make_recommender("nl-profile", ml100k, llm=smol, rating="generate")
    slates = rec.recommend([UserState(profile=HORROR_FAN)], 5, candidates=pool[:6])
    assert len(slates[0]) == 5 and rec.identity["rating"] == "generate"
    with pytest.raises(ConfigError):
        make_recommender("nl-profile", ml100k, ranker="psychic")


def test_profile_prompt_follows_steereval(ml100k):
    block = item_block(ml100k.item("1"), 4.0)
    assert block == "Movie Title: Toy Story (1995)\nUser Rating: 4.0"  # tag-free; ml-100k has no descriptions
    assert "5-6 sentences" in PROFILE_PARAGRAPH


@pytest.mark.llm
def test_keyword_bm25_follows_a_horror_history(ml100k, qwen05, pools):
    horror, _ = pools
    rec = make_recommender("keyword-bm25", ml100k, llm=qwen05)
    westerns = tuple(ml100k.items_with_tag("Western")[:8])
    states = [UserState(history=tuple(horror[:10])), UserState(history=westerns)]
    slates = rec.recommend(states, 20)
    assert share(slates[0].item_ids, horror) > 2 * len(horror) / len(ml100k.items)
    assert not set(slates[0].item_ids) & set(states[0].history)
    assert all(1 <= len(k) <= 8 for k in rec.last_keywords)
    in_batch = rec.last_keywords[1]
    single = rec.recommend([states[1]], 20)[0]
    # One by one, the state gets its own keywords and slate, not its batch neighbour's: batching
    # noise may change a near-tied word (docs/performance.md, "Same results?"), so the keywords must
    # mostly agree with the batch's.
    alone = rec.last_keywords[0]
    assert len(set(alone) & set(in_batch)) >= len(set(alone) | set(in_batch)) / 2, (alone, in_batch)
    # BM25 on a few changed words can move most of a slate, so the slate is checked against the search
    # for the words written alone: its first item has the best score outside the history.
    scores = rec.search.scores(" ".join(alone))
    allowed = [ml100k.item_index[i] for i in ml100k.item_ids if i not in set(states[1].history)]
    assert scores[ml100k.item_index[single.item_ids[0]]] == max(scores[allowed])
    assert rec.identity["llm"]["model"] == "qwen2.5-0.5b"


def test_keyword_parsing():
    keywords = parse_keywords("1. Horror, 2. ghosts\n- Slasher films, horror", 8)
    assert keywords == ["horror", "ghosts", "slasher films"]
    assert parse_keywords("a, b, c", 2) == ["a", "b"]
    with pytest.raises(LLMOutputError, match="no search keywords"):
        parse_keywords(" , \n ", 8)
