"""Caches verify what they return (issue 45, item 3), with the issue's reproductions.

Every cache whose entries ctrlsim reads back (parsed datasets, derived outputs, the file-digest memo)
uses an entry only if its seal verifies: an HMAC under the cache folder's own key (`.seal-key`, mode
0600), which an edit of the entry cannot recompute. Each tampered entry below is named in a
`CacheCorruptionWarning` and built again from its source, giving the same results as a clean run.
File digests are not trusted when their memo was "racily clean" (recorded within `RACY_NS` of the
file's mtime), and the memo also holds the ctime, so an in-place edit that keeps a file's size,
mtime and inode is hashed again.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
import secrets
import shutil
from pathlib import Path

import pytest

from ctrlsim.cache_seal import KEY_NAME, cache_secret, seal
from ctrlsim.data import load_dataset, parsed_cache
from ctrlsim.data.dataset import Dataset
from ctrlsim.errors import CacheCorruptionWarning
from ctrlsim.experiments import digest_memo, output_cache, provenance
from ctrlsim.experiments.cli import main
from ctrlsim.experiments.runfolder import RunFolder, new_figure
from ctrlsim.experiments.units import clear_worker_cache

CTRLBENCH = ["ctrlbench", "--methods", "random", "--recommenders", "popularity", "--targets", "War",
             "--agents", "1,1", "--rounds", "1", "--figures", "false", "--seeds", "0"]
FILES = ("ml-100k.inter", "ml-100k.item", "ml-100k.user")
INPUTS = {"records": [{"tag": "War", "target_size": 71}]}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # no matplotlibrc of the repository's working folder
    return tmp_path / "cache"


@pytest.fixture
def ml100k_copy(tmp_path) -> Path:
    """The embedded ml-100k's RecBole atomic files, copied to a folder the test may edit."""
    from ctrlsim.data.registry import recbole_example_dir

    folder = tmp_path / "data" / "ml-100k"
    folder.mkdir(parents=True)
    for name in FILES:
        shutil.copy(Path(recbole_example_dir("ml-100k")) / name, folder / name)
    return folder


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _records(run: Path) -> list[dict]:
    """The run's records without their wall-clock field (`timing`)."""
    lines = (run / "records.jsonl").read_text(encoding="utf-8").splitlines()[1:]
    records = [json.loads(line) for line in lines]
    for stored in records:
        stored["record"].pop("timing")
    return records


def _forged(key: str, dataset: Dataset) -> bytes:
    """A dataset entry in the right layout, sealed with a key that is not the cache's."""
    return parsed_cache.sealed_entry(secrets.token_bytes(32), key, pickle.dumps(dataset))


# ------------------------------------------------------------------------ parsed datasets (2 kinds)

def test_a_dataset_entry_replaced_by_another_valid_dataset_is_rebuilt(tmp_path, ml100k_copy, private_cache):
    clean = tmp_path / "clean"
    assert main([*CTRLBENCH, "--dataset", str(ml100k_copy), "--out", str(clean)]) == 0
    (entry,) = (private_cache / "datasets").glob("*.pickle")
    real = load_dataset(ml100k_copy)
    war = real.items_with_tag("War")
    assert len(war) == 71
    tags = real.item_tags
    altered = Dataset(real.name, real.items, real.interactions, real.users,
                      tags[(tags["tag"] != "War") | tags["item_id"].isin(war[:5])].reset_index(drop=True),
                      dict(real.source))
    assert len(altered.items_with_tag("War")) == 5  # valid, but another dataset
    entry.write_bytes(_forged(entry.stem, altered))

    again = tmp_path / "again"
    clear_worker_cache()  # as a new process would: no dataset kept in memory from the clean run
    with pytest.warns(CacheCorruptionWarning, match=f"{entry}.*seal does not verify"):
        assert main([*CTRLBENCH, "--dataset", str(ml100k_copy), "--out", str(again)]) == 0
    assert _records(again) == _records(clean)  # the numbers of the clean run, not of the altered entry
    assert len(parsed_cache._read(entry.read_bytes().partition(b"\n")[2]).items_with_tag("War")) == 71


def test_a_dataset_entry_copied_from_another_key_is_rebuilt(tmp_path, ml100k_copy, private_cache):
    other = tmp_path / "other"
    shutil.copytree(ml100k_copy, other)
    inter = other / "ml-100k.inter"
    inter.write_text("".join(inter.read_text(encoding="utf-8").splitlines(keepends=True)[:-500]),
                     encoding="utf-8")
    cache = private_cache / "datasets"
    expected = load_dataset(ml100k_copy, cache=cache)
    entry = next(cache.glob("*.pickle"))
    load_dataset(other, cache=cache)
    (copied,) = set(cache.glob("*.pickle")) - {entry}
    shutil.copy(copied, entry)  # a genuine, sealed entry, but of another key (500 ratings fewer)
    with pytest.warns(CacheCorruptionWarning, match=f"{entry}.*seal does not verify"):
        got = load_dataset(ml100k_copy, cache=cache)
    assert len(got.interactions) == len(expected.interactions) == 100_000


# ------------------------------------------------------------------------ derived outputs (3 kinds)

def _rewrite(entry: Path, name: str, data: bytes) -> None:
    """Replace one file of an output entry, with the sha256 beside it recomputed to match."""
    stored = json.loads(entry.read_text(encoding="utf-8"))
    stored["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(),
                             "base64": base64.b64encode(data).decode("ascii")}
    entry.write_text(json.dumps(stored), encoding="utf-8")


def test_an_output_entry_rewritten_with_a_matching_sha256_is_made_again(private_cache):
    calls = []

    def make() -> str:
        calls.append(1)
        return "| tag | items |\n| War | 71 |\n"

    clean = output_cache.cached_text("t", INPUTS, make)
    (entry,) = (private_cache / "outputs").glob("*.json")
    _rewrite(entry, "text", b"| tag | items |\n| War | 5 |\n")
    with pytest.warns(CacheCorruptionWarning, match=f"{entry}.*seal does not verify"):
        assert output_cache.cached_text("t", INPUTS, make) == clean
    assert len(calls) == 2
    assert output_cache.cached_text("t", INPUTS, make) == clean and len(calls) == 2  # resealed, read back


def test_a_figure_entry_rewritten_with_a_matching_sha256_is_drawn_again(tmp_path, private_cache):
    def draw(target) -> None:
        fig, ax = new_figure((3, 2))
        ax.bar([0], [71])
        target.save_figure(fig, "war")

    with RunFolder(tmp_path / "clean", {"x": 1}) as folder:
        output_cache.cached_figures(folder, "f", INPUTS, draw)
    clean = (tmp_path / "clean" / "figures" / "war.png").read_bytes()
    (entry,) = (private_cache / "outputs").glob("*.json")
    _rewrite(entry, "war", b"\x89PNG\r\n\x1a\n another picture")
    with pytest.warns(CacheCorruptionWarning, match=f"{entry}.*seal does not verify"):
        with RunFolder(tmp_path / "again", {"x": 1}) as folder:
            output_cache.cached_figures(folder, "f", INPUTS, draw)
    assert (tmp_path / "again" / "figures" / "war.png").read_bytes() == clean


def test_an_output_entry_copied_from_another_key_is_made_again(private_cache):
    other = {"records": [{"tag": "War", "target_size": 5}]}
    clean = output_cache.cached_text("t", INPUTS, lambda: "War 71")
    entry = next((private_cache / "outputs").glob("*.json"))
    output_cache.cached_text("t", other, lambda: "War 5")
    (copied,) = set((private_cache / "outputs").glob("*.json")) - {entry}
    shutil.copy(copied, entry)  # a genuine, sealed entry, but of other inputs
    with pytest.warns(CacheCorruptionWarning, match=f"{entry}.*seal does not verify"):
        assert output_cache.cached_text("t", INPUTS, lambda: "War 71") == clean


# ------------------------------------------------------------------------ file digests (4 kinds)

def _edit_in_place(path: Path, old: bytes, new: bytes) -> None:
    """Rewrite `path` through the same inode with the same size, then set its mtime back."""
    before = path.stat()
    data = path.read_bytes()
    assert len(old) == len(new) and data.count(old) >= 1
    with open(path, "r+b") as fh:  # in place: no new inode
        fh.write(data.replace(old, new, 1))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    kept = ("st_ino", "st_size", "st_mtime_ns")
    assert [getattr(after, f) for f in kept] == [getattr(before, f) for f in kept]


def test_a_racily_clean_in_place_edit_refuses_the_resume_naming_the_file(tmp_path, ml100k_copy, capsys):
    run = tmp_path / "r"
    args = [*CTRLBENCH, "--dataset", str(ml100k_copy), "--out", str(run)]
    assert main(args) == 0  # the copy is seconds old: its memo is racily clean
    user = ml100k_copy / "ml-100k.user"
    _edit_in_place(user, b"\t24\t", b"\t25\t")  # a user one year older
    records = (run / "records.jsonl").read_bytes()
    assert main([*CTRLBENCH, "--dataset", str(ml100k_copy), "--seeds", "0,1", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"input {ml100k_copy}" in err and "files changed: ml-100k.user (" in err
    assert (run / "records.jsonl").read_bytes() == records
    assert provenance.file_digest(user) == _sha256(user)


def test_an_old_file_edited_in_place_with_its_mtime_set_back_is_hashed_again(tmp_path):
    path = tmp_path / "table.csv"
    path.write_bytes(b"item,tag\n1,War\n")
    hour_ago = path.stat().st_mtime_ns - 3600 * 10**9
    os.utime(path, ns=(hour_ago, hour_ago))  # not racy: the memo is trusted from now on
    first = provenance.file_digest(path)
    assert provenance.file_digest(path) == first == _sha256(path)
    _edit_in_place(path, b"War", b"Zen")  # size, mtime and inode kept; only the ctime moves
    assert provenance.file_digest(path) == _sha256(path) != first


def test_a_racily_clean_memo_is_not_trusted_on_a_coarse_clock(tmp_path, monkeypatch):
    """A filesystem whose timestamps did not move for a rewrite (coarse granularity): only the racy
    rule can tell, because the stat the memo holds is still the file's stat."""
    path = tmp_path / "table.csv"
    path.write_bytes(b"item,tag\n1,War\n")
    frozen, resolved, real_stat = path.stat(), path.resolve(), Path.stat

    def coarse(self, *args, **kwargs):
        found = real_stat(self, *args, **kwargs)
        if self != resolved:
            return found
        fields = {"st_size": found.st_size, "st_ino": frozen.st_ino, "st_mtime_ns": frozen.st_mtime_ns,
                  "st_ctime_ns": frozen.st_ctime_ns}
        return type("Stat", (), fields)()

    monkeypatch.setattr(Path, "stat", coarse)
    first = provenance.file_digest(path)
    path.write_bytes(b"item,tag\n1,Zen\n")  # the same size, within the same (frozen) timestamp
    assert provenance.file_digest(path) == _sha256(path) != first
    # Once a memo is recorded RACY_NS after the mtime, it is what answers (so the rule is not vacuous).
    monkeypatch.setattr(digest_memo.time, "time_ns", lambda: frozen.st_mtime_ns + digest_memo.RACY_NS)
    provenance.file_digest(path)
    path.write_bytes(b"item,tag\n1,Cat\n")
    assert provenance.file_digest(path) == hashlib.sha256(b"item,tag\n1,Zen\n").hexdigest()


def test_a_memo_edited_to_name_another_digest_is_not_trusted(tmp_path, private_cache):
    path = tmp_path / "table.csv"
    path.write_bytes(b"item,tag\n1,War\n")
    hour_ago = path.stat().st_mtime_ns - 3600 * 10**9
    os.utime(path, ns=(hour_ago, hour_ago))
    real = provenance.file_digest(path)
    (memo,) = (private_cache / "digests").glob("*.json")
    stored = json.loads(memo.read_text(encoding="utf-8"))
    stored["sha256"] = hashlib.sha256(b"another table").hexdigest()
    memo.write_text(json.dumps(stored), encoding="utf-8")
    with pytest.warns(CacheCorruptionWarning, match=f"{memo}.*does not match its seal"):
        assert provenance.file_digest(path) == real


# ------------------------------------------------------------------------ the cache key (2 kinds)

def test_a_cache_key_open_to_others_is_replaced_and_its_entries_rebuilt(private_cache):
    made = output_cache.cached_text("t", INPUTS, lambda: "War 71")
    key = private_cache / "outputs" / KEY_NAME
    assert key.stat().st_mode & 0o777 == 0o600  # created private
    key.chmod(0o644)
    with pytest.warns(CacheCorruptionWarning) as caught:
        assert output_cache.cached_text("t", INPUTS, lambda: "War 71") == made
    shown = [str(w.message) for w in caught]
    assert any(f"cache key {key} is mode 0644" in m for m in shown)
    assert any("seal does not verify" in m for m in shown)  # sealed with the old key: made again
    assert key.stat().st_mode & 0o777 == 0o600


def test_a_cache_key_planted_as_a_symlink_is_replaced_and_its_target_untouched(tmp_path, private_cache):
    folder = private_cache / "outputs"
    folder.mkdir(parents=True)
    known = tmp_path / "known-key"
    known.write_bytes(b"k" * 32)
    known.chmod(0o600)
    (folder / KEY_NAME).symlink_to(known)
    forged_entry_key = output_cache.output_key("t", INPUTS, output_cache.TABLE_LIBRARIES)
    listed = {"text": {"sha256": hashlib.sha256(b"War 5").hexdigest(),
                       "base64": base64.b64encode(b"War 5").decode("ascii")}}
    digests = json.dumps({"text": listed["text"]["sha256"]}, sort_keys=True)
    (folder / f"{forged_entry_key}.json").write_text(json.dumps(
        {"format": output_cache.CACHE_FORMAT, "kind": "t", "files": listed,
         "seal": seal(b"k" * 32, "outputs", forged_entry_key, digests)}))  # sealed with the planted key
    with pytest.warns(CacheCorruptionWarning) as caught:
        assert output_cache.cached_text("t", INPUTS, lambda: "War 71") == "War 71"
    shown = [str(w.message) for w in caught]
    assert any(f"cache key {folder / KEY_NAME} is a symbolic link" in m for m in shown)
    assert any("seal does not verify" in m for m in shown)  # the entry sealed with the planted key
    assert known.read_bytes() == b"k" * 32 and not (folder / KEY_NAME).is_symlink()
    assert cache_secret(folder) != b"k" * 32
