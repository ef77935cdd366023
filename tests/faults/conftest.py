"""The faults suite (issue 14, point 10): bad input and faults a new user meets, each kept fixed by a test.

Every test here asserts either the typed error class and that its message names the offending value
or file, or that results are identical to an uninterrupted run. Kinds covered, counted per file
(one kind = one distinct bad input or fault that is tried): 415 in all.

test_data_faults.py (36): bad numbers in every loader (22: timestamps out of range or infinite,
  ratings NaN/infinite/above the scale/not whole, years not whole or out of range, ages negative or
  not whole, empty or unknown ML-1M occupations, a Last.fm age that is a word, Amazon ratings and
  review times, tag votes and genome relevance out of range); the same checks on tables handed to
  `Dataset.build` (3); an extra field that would shift the columns (3: csv, '::' .dat, RecBole
  atomic); damaged Amazon files (6: plain file named .gz, truncated gzip, non-UTF-8 bytes, category
  as a string, null description, unknown `missing_metadata`); `UserState` history "12" and None (2).
test_env_faults.py (29): likes that are fractions (0.5, 1.0000001, nan, a float32 0.9, a complex
  number: floats only when exactly 0.0 or 1.0), strings, out of range, the wrong length or a bare
  string; render modes an env does not have (a warning, as Gymnasium gives); queries too long,
  outside the charset or not strings; unknown action keys and non-dict
  actions; bad `l_init`; reset seeds negative, fractional, strings or bools; bad slate size, budget
  and render mode; step before reset; step past the budget; unknown or conflicting reset options;
  an unknown user; bad rosters; a seed history given as one string; a live object handed to
  `gymnasium.make`; unknown target, task and recommender names; policy failures in a population.
test_recbole_faults.py (12): cached RecBole metadata without `test_metrics`, `item_tokens`,
  `model_config` or `format` (4); a NaN test metric, item tokens without padding, a field of the
  wrong type, a model config without a field the scorer reads (4); metadata that is not JSON or is
  a list (2); NaN or infinite weights (2).
test_cache_faults.py (21): response/embedding cache that is not SQLite, has damaged pages, holds a
  non-JSON value, a JSON value of the wrong shape or a truncated embedding blob (5); a locked cache
  that must not be taken for a damaged one (1); empty LLM specs "", "   ", "llamacpp:", None (4); a
  brief write by another process (waited for) and a lock held past the busy timeout (a
  `CacheLockedError` naming the file) (2); a cache in a folder that cannot be created, under a file,
  read-only as a file or as a folder (4); two writers of one key (the first stored value wins and
  both get it), a damaged stored value (replaced), two embedding caches on one file (3); two runs
  computing one chat reply or one rating at once, both using the stored one (2).
test_cache_folder_faults.py (9): `$CTRLSIM_CACHE` that cannot be created (a typed error naming it and
  the variable), the up-front check's message, an encoder whose cache folder is unwritable (in
  memory, with a warning) (3); an unwritable `$CTRLSIM_CACHE` for ctrlbench random and oracle and
  calibrate random (they run) and for ctrlbench base-small, calibrate base-small and evolve (exit 2
  before any model loads) (6).
test_provenance_faults.py (12): a dataset folder edited under the same path, a model file replaced
  under the same path, changed source code, a changed library version, a changed resolved default
  (each refuses the resume naming what changed; the code change passes with `--allow-code-change`,
  recorded) (5); a file rewritten in place with the same size, a folder with a file renamed or
  rewritten (each hashed again) (3); a provenance log with a torn last line (skipped, then moved
  aside by the next append) or a damaged middle line (named) (2); an evolution ledger of another
  config, and one that is not an object (2).
test_merge_replay_faults.py (21): `ctrlsim report A B --out M` of folders of one config made from
  other dataset contents, with another resolved default, or on other code (refused naming the field,
  both values and both folders; code passes with `--allow-code-change`, recorded), a unit two folders
  hold with different records, a folder at `--out` holding different records, a folder without
  provenance.jsonl (each refused, nothing written), identical duplicates (merged), a merge run on
  newer code (M records its sources' provenance) and one folder's report rebuilt on newer code (not
  refused, provenance unchanged), a report whose dataset changed since its records (refused) (10);
  `--replay` of a log with an edited answer, an edited answer whose digest was recomputed, a line
  removed, reordered or inserted (each a `ReplayLogError` naming the log and the line), a log without
  digests (refused naming `--replay-unverified`; with it, replayed, warned and recorded), the box's
  `replay=` option on an edited log, a log edited in place after a replay in the same process,
  `--replay-unverified` without `--replay`, the flag as a URL fragment option (10); a replay records
  the log's path, SHA-256, length and chain head (1).
test_artefact_faults.py (13): a saved policy (`rl:PATH`) whose zip carries code, each refused naming
  the file and the entry with nothing run (a marker payload that Stable-Baselines3's own loader runs):
  a planted pickled entry (also refused up front by `ctrlsim ctrlbench`, exit 2), a payload in place
  of a standard entry, a cloudpickled function, an import disguised behind pushed-and-popped strings,
  a pickled object in `policy.pth`, two members of one name (6); NaN weights, weights of another
  network, an activation named as an import path, a `policy.zip` that is not a zip (4); a
  `module:attribute` method's module edited, a helper of its package edited, a module with no source
  file (each refuses the resume naming it; `--allow-code-change` passes, recorded) (3).
test_cache_trust_faults.py (11): a parsed-dataset entry replaced by another valid dataset (War 71 -> 5
  items) and one copied from another key (2); an output entry (text, figures) rewritten with a
  matching sha256, and one copied from another key (3); each named in a warning and rebuilt, the
  run's records equal to a clean run's; an in-place edit that keeps size, mtime and inode, right
  after a run (the resume refused naming the file) and on an hour-old file (hashed again); a racily
  clean memo on a filesystem whose timestamps did not move; a memo edited to name another digest
  (named, hashed again) (4); a cache key open to others or planted as a symlink (replaced, its
  entries rebuilt, the symlink's target untouched) (2).
test_interrupt_faults.py (12): a server trickling its body or its headers (the whole-request
  deadline ends each attempt) (2); credentials in the URL of the deadline error (1); Ctrl-C during a
  batch of hanging requests (cancelled at once) and during a `ctrlsim ctrlbench` run (exit 130, one
  line, the rerun resumes) (2); replies without `usage`, with only prompt or only completion tokens,
  with an empty `usage` (unknown tokens, never 0) (4); a cached reply and a rating without counts
  (still unknown) (2); Table 7 of a server that sends no counts (reads "unknown") (1).
test_store_faults.py (11): a second writer in the same process and in another process (the lock
  released by SIGKILL) (2); a duplicate key from a foreign writer; a line torn by a kill; a header
  that is a list; a line without `key`; a non-JSON line mid-file; a binary file; a folder where the
  file belongs; another config on the same file; a run folder that is a file (9).
test_cli_faults.py (112), for each of the seven runners (probe, steereval, promptshift, ctrlbench,
  evolve, calibrate, train-probe), exit code 2 naming the value and no LLM/torch/encoder module imported: a
  negative seed (6); negative or zero counts and out-of-range numbers, a lambda outside [0, 1]
  among them (24); text where a number belongs (2); unknown names of boxes, tasks, targets, tags,
  conditions, scenarios, methods, protocols, rules (17); repeated list values, a repeated lambda
  among them (12); `--out` under a file and in an unwritable folder (12); two runs on one folder at
  once, the second refused naming the holder's pid (1); a count above its upper bound (1e12 agents,
  rounds, users, slate sizes, tokens, ...; 2**63 as a seed) (29).
test_input_faults.py (12): roster entries of the wrong type (6: `"behaviour": "12"`, a string
  `interests`, a bool item id, a number as name, a list as attributes, an empty probe id), each a
  `DataFileError` naming the entry and field; malformed cached personas (4: not an object, no tokens,
  a string behaviour, negative tokens), deleted with a warning and written again; a damaged record (2:
  not an object, a field missing), reported by line and recomputed.
test_runfolder_faults.py (10): a full disk while writing an artefact and a record (1: one
  `DataFileError` naming the path, no `.tmp` left, the old file intact); a planted symlink as the
  lock file (its target untouched), as records.jsonl, as `rosters/` or `figures/` (4); two
  `--overwrite` runs in one second (both previous runs kept, whole) and `--overwrite` moving
  rosters, tables and figures too (2); an existing
  folder that is not a run folder (1); the lock file deleted while held (1); a roster lost after its
  record, rebuilt on resume (1).
test_audit_folder_faults.py (36): `ctrlsim audit --out` a user's folder holding a report.html and a
  summary.json (exit 2 naming it, nothing deleted), a runner's run folder, the same under `--llms`,
  an earlier `--llms` folder without its top audit.json (still the audit's; with a file of yours, not)
  (4); a runner's `--llms` into a user's folder holding a sensitivity.md, and a link at it (2);
  `--overwrite` moving a user's folder and an earlier audit aside whole, a rerun resuming in place
  (2); a second audit on a folder in use (1); a link planted at audit.json, cost.jsonl,
  report.html, summary.json or a sub-run folder (refused before anything runs, the target untouched)
  (5); a link at the old predictable temporary name of an atomic write (1); a cost entry without its
  seconds (1); a sub-run setting naming a field the audit owns (the reported `--recommenders`,
  recommenders, compare, llm twice, dataset, slate_size, slate-size, recommender_llm; encoder,
  conditions, protocol from Python), a run option (out, --executor, overwrite, llms), a flag spelling,
  an unknown field (18); a caller's dict changed after the config was built, `--llms` replacing the
  probes' LLM per model (2).
test_jsonl_faults.py (14): a torn last line in exchanges.jsonl (still replays), provenance.jsonl (never
  blocks a later resume), unit-seconds.jsonl of a run and of the machine, the audit's cost.jsonl, two
  in one second (each moved aside with a warning, kept whole) (6); a whole last line without its
  newline (ended, kept), a damaged last line with its newline (named) (2); a link at exchanges.jsonl
  (never resolved, refused), at a run's exchanges.jsonl or unit-seconds.jsonl (exit 2 before any unit
  runs), at the machine's cost log (nothing written through) (4); a log that is a folder or a FIFO (2).
test_server_faults.py (32): `ctrlsim serve` left running: a client without a token, or with a wrong
  one, announcing a 74 MB body (401 before the body is read) (2); a Content-Length above the body
  limit and a chunked body streamed past it (413 naming the limit and its flag) (2); a foreign `Host`
  header (DNS rebinding) (1); a batch of states, accounts or events, and a history, shown,
  candidates, attributes or account history above the limits (8); an account table overflowed (the
  least recently used evicted, its 404 says so), one request creating more accounts than it keeps,
  accounts whose histories repeat items past the entry budget (evicted), one request past it (413),
  deleting an unknown account (5); `--host` 0.0.0.0, :: or a LAN address without a token (exit 2
  before binding, `ExposedServiceError`) (3); bad `--max-body-mb`, `--max-batch`, `--max-list`,
  `--max-accounts`, `--max-account-items`, `--allowed-hosts` (6); stateful boxes: two users without
  an id and the same history, one id with two profiles, a history repeating a like, the ceiling's
  beam states sharing their probe's id, an account the service evicted (each ranked as the
  in-process box ranks it) (5).
test_secret_faults.py (4): credentials in an LLM spec (URL userinfo, a secret query value) reach no
  file of the run folder or the cache and no printed line, for ctrlbench, promptshift and calibrate
  (2); an Authorization / API-key header and a bearer token are cut from text (2).
test_runner_resume.py (8): SIGKILL after the first record (train-probe: mid-training), then a rerun,
  for each runner (7);
  records equal an uninterrupted run's (wall-clock fields named per runner), no key written twice;
  a unit that failed because its LLM was missing is retried once the model is there (1).

SteerEval's per-record token counts no longer depend on where a run was interrupted (shared work
counts towards its first unit); the xfail check stays for any runner that declares such fields.
"""
