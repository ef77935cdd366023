"""PromptShift on Last.fm-1K data: music prompts, play-count positives, "Artist - Title" matching."""
import pytest

from ctrlsim.data import load_dataset
from ctrlsim.experiments.promptshift.config import PromptShiftConfig
from ctrlsim.experiments.promptshift.units import build_data, protocol_choices
from ctrlsim.recommenders.promptshift.data import PromptShiftData
from ctrlsim.recommenders.promptshift.engine import CandidateList, PromptShiftEngine
from ctrlsim.recommenders.promptshift.generation import (
    HISTORY_ONLY,
    GeneratedList,
    build_messages,
    parse_numbered_list,
)

TRACKS = [("Portishead", "Roads"), ("Radiohead", "Karma Police"), ("Björk", "Hyperballad"),
          ("Massive Attack", "Teardrop"), ("Air", "La Femme d'Argent"), ("Moby", "Porcelain"),
          ("Beck", "Loser"), ("Blur", "Song 2"), ("Pulp", "Common People"), ("Suede", "Animal Nitrate")]


@pytest.fixture(scope="module")
def lastfm_folder(tmp_path_factory):
    """Two listeners (m, 22 and f, 45). Each first plays "Lone Track" once (not a positive), then the ten
    tracks twice each, in order: 11 (user, track) pairs -> 8 fit (the single play + 7), 1 validation,
    2 test."""
    folder = tmp_path_factory.mktemp("lastfm") / "lastfm-dataset-1K"
    folder.mkdir()
    rows = []
    for u, user in enumerate(("user_000001", "user_000002")):
        day = f"2009-0{u + 1}"
        rows.append(f"{user}\t{day}-01T00:00:00Z\t\tLone Artist\t\tLone Track")
        for t, (artist, track) in enumerate(TRACKS):
            for play in range(2):
                rows.append(f"{user}\t{day}-{t + 2:02d}T0{play}:00:00Z\t\t{artist}\t\t{track}")
    (folder / "userid-timestamp-artid-artname-traid-traname.tsv").write_text("\n".join(rows) + "\n",
                                                                             encoding="utf-8")
    (folder / "userid-profile.tsv").write_text(
        "#id\tgender\tage\tcountry\tregistered\nuser_000001\tm\t22\tPeru\tFeb 24, 2006\n"
        "user_000002\tf\t45\tJapan\tAug 13, 2006\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def music_data(lastfm_folder):
    return PromptShiftData.build(load_dataset(str(lastfm_folder)), positive_threshold=2, history_len=3,
                                 min_fit_positives=3)


def test_play_count_positives_and_music_histories(music_data):
    assert music_data.domain == "music" and music_data.eligible == ["user_000001", "user_000002"]
    fit = music_data.fit_positives["user_000001"]
    assert len(fit) == 7 and "Lone Artist - Lone Track" not in fit  # one play is no positive
    # Fit: the single play and the first seven tracks; H_u = the last three of them.
    profile = music_data.user("user_000001")
    assert profile.history_titles == ("Air - La Femme d'Argent", "Moby - Porcelain", "Beck - Loser")
    assert profile.positives("valid") == {"Blur - Song 2"}
    assert profile.positives() == {"Pulp - Common People", "Suede - Animal Nitrate"}


def test_music_prompts_and_artist_title_matching(music_data):
    engine = PromptShiftEngine(music_data, "never-loaded")
    assert engine.domain == "music"
    history = music_data.user("user_000002").history_titles
    messages = build_messages(history, HISTORY_ONLY, 30, domain=engine.domain)
    assert messages[0]["content"] == ("You are a professional music recommendation system that recommends "
                                      "individual songs.")
    assert "Listening history:\n1. Air - La Femme d'Argent" in messages[1]["content"]
    reply = ("1. Björk - Hyperballad\n2. radiohead - karma police\n3. Bjork - Hyperballad\n"
             "4. Oasis - Wonderwall")
    titles = parse_numbered_list(reply, "music")
    assert titles == ["Björk - Hyperballad", "radiohead - karma police", "Bjork - Hyperballad",
                      "Oasis - Wonderwall"]
    cand = CandidateList.from_generated(GeneratedList("history", titles, reply, 0, 0), engine.matcher)
    # Case and accents fold; the accent-free repeat is the same track (dropped); Oasis is unknown.
    assert cand.item_ids == ["Björk - Hyperballad", "Radiohead - Karma Police", None]
    assert cand.dropped_duplicates == 1


def test_runner_resolves_music_choices(lastfm_folder):
    cfg = PromptShiftConfig(dataset=str(lastfm_folder), history_len=3, min_fit_positives=3)
    data = build_data(cfg)
    assert data.positive_threshold == 2.0  # play-count positives by default on listening data
    choices = protocol_choices(cfg, data)
    assert choices["domain"] == "music" and choices["positives"] == "play count >= 2"
    assert "<artist> - <title>" in choices["request sentence"]
