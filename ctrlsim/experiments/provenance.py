"""What produced a run: the code, the content of every input given by path, the resolved defaults.

A run folder's records are only comparable with each other if every unit ran on the same inputs and
the same code. The config alone does not say so: a dataset file edited under the same path, a GGUF
replaced under the same name, or a default changed in the code all leave the config equal. So every
run records, beside its config, a *provenance* entry:

- `code`: ctrlsim's version, a SHA-256 of its source files (`ctrlsim`, `ctrlsim.envs`,
  `ctrlsim.agents`), the git commit where the source is a git checkout (with whether it had
  uncommitted changes), and the versions of the libraries results depend on; with `user_code`, the
  source digests of the user's modules a `module:attribute` method runs (`user_code`);
- `inputs`: for every config value that names an existing file or folder (a dataset, a roster, a
  side table, a GGUF, an encoder folder), its SHA-256 (folders: over every file in them);
- `resolved`: the values a runner gave to fields left open (`slate_size: null` -> 3 per box).

The entries are appended to `provenance.jsonl` in the run folder (append-only, under the run's lock),
and the latest is in `config.json`. Resuming a folder that holds results checks the new entry
against the stored one (`check_resume`): a changed input or resolved default is refused (it would
mix two experiments in one table); changed code is refused unless the user allows it
(`--allow-code-change`), and the allowance is recorded. Merging run folders (`ctrlsim report A B
--out M`) checks their entries against each other the same way (`merged_entry`), and M records
theirs. An entry may carry notes beside these three keys, such as the exchange log a replay
answered from (`replay`) or the folders a merge came from (`merged_from`).

Digests of large files are remembered by (size, mtime, inode, ctime), as git's index does, under
`$CTRLSIM_CACHE/digests`; a racily clean or edited memo is not trusted (`digest_memo`).
"""
from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.digest_memo import file_digest  # also this module's public name
from ctrlsim.experiments.user_code import config_strings

PROVENANCE = "provenance.jsonl"
CODE_PACKAGES = ("ctrlsim", "ctrlsim.envs", "ctrlsim.agents")
SHOWN = 8  # changes listed in a refusal; the rest are counted


# ----------------------------------------------------------------------------- code

def _package_dirs() -> list[Path]:
    import importlib.util

    dirs = []
    for name in CODE_PACKAGES:
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(Path(location).resolve())
    return dirs


def _source_files(dirs: Iterable[Path]) -> list[tuple[str, Path]]:
    files = []
    for root in dirs:
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            files.append((f"{root.name}/{path.relative_to(root).as_posix()}", path))
    return sorted(files)


def source_digest() -> str:
    """SHA-256 over the names and bytes of every Python file of ctrlsim and its env/agent layers."""
    digest = hashlib.sha256()
    for name, path in _source_files(_package_dirs()):
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(where: Path) -> dict[str, Any]:
    """The commit of the git checkout `where` is in, and whether its tracked files differ from it."""
    if not any((parent / ".git").exists() for parent in (where, *where.parents)):
        return {}
    commit = _git(["rev-parse", "HEAD"], where)
    if not commit:
        return {}
    status = _git(["status", "--porcelain", "--untracked-files=no"], where)
    return {"git_commit": commit, "git_dirty": bool(status)}


@lru_cache(maxsize=None)
def library_version(dist: str) -> str | None:
    """`importlib.metadata.version(dist)`, or None when `dist` is not installed; once per process.

    The `Version:` field is read from the metadata file's header lines: `metadata.version` parses
    the whole file as an e-mail message first, long description included (several milliseconds
    for numpy; a dozen lookups were a noticeable part of a fully cached rerun)."""
    from importlib import metadata

    try:
        found = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return None
    text = found.read_text("METADATA") or found.read_text("PKG-INFO") or ""
    for line in text.splitlines():
        if not line.strip():  # the end of the header lines
            break
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return found.version  # no Version header line: the library's own parser decides


def software_versions() -> dict[str, str]:
    """Versions recorded beside every run (results depend on them)."""
    versions = {"python": platform.python_version()}
    for dist in ("ctrlsim", "numpy", "gymnasium", "pettingzoo", "llama_cpp_python", "torch", "recbole"):
        version = library_version(dist)
        if version is not None:
            versions[dist] = version
    return versions



@lru_cache(maxsize=1)
def code_version() -> dict[str, Any]:
    """ctrlsim's version, source digest, git state and the library versions (once per process)."""
    versions = software_versions()
    dirs = _package_dirs()
    return {"ctrlsim": versions.pop("ctrlsim", "unknown"), "source_sha256": source_digest(),
            **(git_state(dirs[0]) if dirs else {}), "libraries": versions}


# ----------------------------------------------------------------------------- inputs

FILES_LISTED = 100  # a folder input with at most this many files keeps each file's digest


def folder_files(path: Path) -> dict[str, str]:
    """Each file under folder `path` (relative name) -> its SHA-256."""
    return {entry.relative_to(path).as_posix(): file_digest(entry)
            for entry in sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)}


def path_digest(path: str | Path, files: Mapping[str, str] | None = None) -> str:
    """A file's digest, or for a folder a digest over the relative names and digests of its files."""
    path = Path(path)
    if path.is_file():
        return file_digest(path)
    digest = hashlib.sha256()
    for name, value in (files if files is not None else folder_files(path)).items():
        digest.update(name.encode() + b"\0" + value.encode() + b"\0")
    return digest.hexdigest()


def _named_path(text: str) -> Path | None:
    """The file or folder a config string names (`x.gguf`, `llamacpp:/m/x.gguf`), if it exists."""
    if not text or "://" in text or len(text) > 4096 or "\0" in text:
        return None
    candidates = [text]
    if ":" in text:
        candidates.append(text.split(":", 1)[1])
    for candidate in candidates:
        path = Path(candidate).expanduser()
        try:
            if path.exists():
                return path
        except OSError:
            continue
    return None


def input_digests(identity: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """For every string in the config that names an existing file or folder: its resolved path and
    SHA-256, keyed by the string as the config holds it."""
    found: dict[str, dict[str, Any]] = {}
    for text in config_strings(identity):
        path = _named_path(text)
        if path is None or text in found:
            continue
        if path.is_dir():
            files = folder_files(path)
            found[text] = {"path": str(path.resolve()), "sha256": path_digest(path, files)}
            if len(files) <= FILES_LISTED:  # so a refusal can name the file that changed
                found[text]["files"] = files
        else:
            found[text] = {"path": str(path.resolve()), "sha256": path_digest(path)}
    return found


# ----------------------------------------------------------------------------- the entry

def provenance(identity: Mapping[str, Any], resolved: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """This run's provenance entry (see the module docstring)."""
    from ctrlsim.experiments.user_code import user_code

    code = code_version()
    mine = user_code(identity, FILES_LISTED)  # a `module:attribute` method's source, as ctrlsim's own
    return {"code": {**code, "user_code": mine} if mine else code, "inputs": input_digests(identity),
            "resolved": json.loads(json.dumps(dict(resolved or {}), default=str))}


def merged(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """`old` with `new`'s values, nested mappings merged key by key (an extension's new boxes join)."""
    out = dict(old)
    for key, value in new.items():
        both = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = merged(out[key], value) if both else value
    return out


def _short(digest: str | None) -> str:
    return (digest or "none")[:12]


def _flat(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    from ctrlsim.experiments.identity import flatten

    return flatten(value, prefix)


def _version(code: Mapping[str, Any]) -> str:
    git = code.get("git_commit")
    dirty = " with uncommitted changes" if code.get("git_dirty") else ""
    where = f", git {git[:10]}{dirty}" if git else ""
    return f"ctrlsim {code.get('ctrlsim')} (source {_short(code.get('source_sha256'))}{where})"


def resume_changes(stored: Mapping[str, Any], now: Mapping[str, Any], *,
                   labels: tuple[str, str] = ("then", "now")) -> tuple[list[str], list[str]]:
    """(changes that always refuse a resume, code changes): one line each.

    Inputs and resolved defaults are compared where both entries have them (an extension adds new
    ones); the code is the source digest and the library versions. `labels` name the two entries
    in each line (a merge names its folders)."""
    from ctrlsim.experiments.user_code import files_changed

    was, is_ = labels
    refused: list[str] = []
    inputs_then, inputs_now = stored.get("inputs") or {}, now.get("inputs") or {}
    for name in sorted(set(inputs_then) & set(inputs_now)):
        a, b = inputs_then[name], inputs_now[name]
        if a.get("sha256") == b.get("sha256"):
            continue
        what = files_changed(a, b, SHOWN) or "content changed"
        refused.append(f"input {name} ({b.get('path')}): {what} "
                       f"(sha256 {_short(a.get('sha256'))}... {was}, {_short(b.get('sha256'))}... {is_})")
    resolved_then, resolved_now = _flat(stored.get("resolved") or {}), _flat(now.get("resolved") or {})
    for name in sorted(set(resolved_then) & set(resolved_now)):
        if resolved_then[name] != resolved_now[name]:
            refused.append(f"default {name}: resolved to {resolved_then[name]!r} {was}, "
                           f"{resolved_now[name]!r} {is_}")
    code: list[str] = []
    then, current = stored.get("code") or {}, now.get("code") or {}
    if then.get("source_sha256") != current.get("source_sha256"):
        code.append(f"code: {_version(then)} {was}, {_version(current)} {is_}")
    libraries_then, libraries_now = then.get("libraries") or {}, current.get("libraries") or {}
    for name in sorted(set(libraries_then) | set(libraries_now)):
        if libraries_then.get(name) != libraries_now.get(name):
            code.append(f"library {name}: {libraries_then.get(name, 'absent')} {was}, "
                        f"{libraries_now.get(name, 'absent')} {is_}")
    from ctrlsim.experiments.user_code import changes

    code += changes(then.get("user_code") or {}, current.get("user_code") or {}, labels, SHOWN)
    return refused, code


def check_resume(where: str, stored: Mapping[str, Any], now: Mapping[str, Any], *,
                 allow_code_change: bool) -> list[str]:
    """Raise a `ConfigError` of a few lines when resuming `stored` with `now` would mix inputs, defaults
    or (unless allowed) code; returns the allowed code changes (empty when nothing changed)."""
    refused, code = resume_changes(stored, now)
    blocking = refused + ([] if allow_code_change else code)
    if not blocking:
        return code
    advice = "use another --out, or --overwrite to move the old run aside"
    if code and not refused:
        advice += "; --allow-code-change resumes with the new code (recorded in the folder)"
    raise ConfigError(f"{where} holds results made with other inputs or code; a resume would mix them:\n  "
                      + "\n  ".join(_shown_lines(blocking)) + f"\n{advice}")


def _shown_lines(lines: list[str]) -> list[str]:
    return lines[:SHOWN] + ([f"... and {len(lines) - SHOWN} more"] if len(lines) > SHOWN else [])


ENTRY_KEYS = ("code", "inputs", "resolved")  # what a resume or a merge compares; other keys are notes


def merged_entry(sources: Sequence[tuple[str, Mapping[str, Any]]], *,
                 allow_code_change: bool) -> dict[str, Any]:
    """The provenance of records gathered from run folders (`ctrlsim report A B --out M`), from each
    folder's (path, latest entry).

    One folder: its entry as it is. Several: their inputs and resolved defaults, which must agree
    wherever two folders both have one; the first folder's code, which the others must share unless
    `allow_code_change` (each allowed difference is kept under `allowed_code_change`); and
    `merged_from`, each folder with what produced it. A difference is a `ConfigError` naming it, its
    two values and the two folders, as a refused resume does."""
    if len(sources) == 1:
        return {k: v for k, v in sources[0][1].items() if k != "time"}
    out: dict[str, Any] = {k: dict(sources[0][1].get(k) or {}) for k in ENTRY_KEYS}
    names, allowed = [sources[0][0]], []
    for name, entry in sources[1:]:
        now = {k: entry.get(k) or {} for k in ENTRY_KEYS}
        refused, code = resume_changes(out, now, labels=(f"in {', '.join(names)}", f"in {name}"))
        blocking = refused + ([] if allow_code_change else code)
        if blocking:
            advice = "merge only run folders made from the same inputs and defaults"
            if code and not refused:
                advice = ("--allow-code-change merges them anyway (recorded in the merged folder's "
                          "provenance.jsonl)")
            raise ConfigError(f"run folder {name} was made with other inputs or code than "
                              f"{', '.join(names)}; merging them would mix two experiments in one table:\n  "
                              + "\n  ".join(_shown_lines(blocking)) + f"\n{advice}")
        allowed += [f"{name}: {line}" for line in code]
        out["inputs"] = {**out["inputs"], **now["inputs"]}
        out["resolved"] = merged(out["resolved"], now["resolved"])
        names.append(name)
    out["merged_from"] = [{"folder": str(Path(name).resolve()),
                           **{k: v for k, v in entry.items() if k not in ("time", "inputs", "resolved")}}
                          for name, entry in sources]
    if allowed:
        out["allowed_code_change"] = allowed
    return out


def check_inputs_unchanged(where: str, recorded: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    """Raise a `ConfigError` naming each input or resolved default that differs between the entry
    `recorded` (what made a folder's records) and `now` (what this process reads): a report rebuilt
    from the records reads the data again (target sizes, the user sample). Code may differ: a fix of
    the report code is what a rebuild is for."""
    refused, _ = resume_changes(recorded, now, labels=("when the records were made", "now"))
    if refused:
        raise ConfigError(f"the report of {where} reads its inputs again, and they changed since its records "
                          "were made; its tables would mix two experiments:\n  "
                          + "\n  ".join(_shown_lines(refused))
                          + "\nrestore those inputs, or run the new ones into another folder")


def read_entries(path: Path) -> list[dict]:
    """The entries of a `provenance.jsonl` (a torn last line, from a kill, is skipped)."""
    from ctrlsim.jsonlines import read_objects

    return read_objects(path)


def append_entry(path: Path, entry: Mapping[str, Any]) -> None:
    """Append one entry as one line, synced; a torn last line before it (a kill mid-write) is moved
    aside first, never joined to it (`ctrlsim.jsonlines`)."""
    from ctrlsim.jsonlines import append_object

    append_object(path, entry)
