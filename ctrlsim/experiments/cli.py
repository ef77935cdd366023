"""The `ctrlsim` command line."""
from __future__ import annotations

import argparse
import json
import sys

from ctrlsim.errors import CtrlsimError, RunInterrupted
from ctrlsim.experiments.runner import RUNNER_MODULES


def _print_table(rows: list[dict], columns: list[str]) -> None:
    from tabulate import tabulate

    print(tabulate([[r.get(c, "") for c in columns] for r in rows], headers=columns))


def cmd_info(args: argparse.Namespace) -> int:
    """Datasets, LLMs and encoders available offline here, and what provides each."""
    from ctrlsim.backends.bundled import available_models
    from ctrlsim.data import BUILTIN, FORMATS
    from ctrlsim.data.registry import recbole_example_dir

    datasets = []
    for name in BUILTIN:
        try:
            where, ok = str(recbole_example_dir(name)), True
        except CtrlsimError as exc:
            where, ok = str(exc), False
        datasets.append({"name": name, "available": ok, "provided_by": where})
    models = available_models()
    from ctrlsim.backends.encoders import ALIASES
    from ctrlsim.backends.hub import cached_snapshot

    for alias, spec in ALIASES.items():
        local = cached_snapshot(spec.model)
        models["encoders"].append({"name": alias, "model": spec.model, "available": local is not None,
                                   "provided_by": local or "Hugging Face hub (not cached here)"})
    if args.json:
        print(json.dumps({"datasets": datasets, "formats": sorted(FORMATS), **models}, indent=2))
        return 0
    print("Datasets (built-in names)")
    _print_table(datasets, ["name", "available", "provided_by"])
    print(f"\nDataset formats readable from a path: {', '.join(sorted(FORMATS))}")
    print("\nLLMs (bundled)")
    _print_table(models["llms"], ["name", "model", "available", "provided_by"])
    from ctrlsim.backends.requantize import QUANT_TYPES

    print(f"Any of them converted by llama.cpp on first use: <name>@{' or @'.join(QUANT_TYPES)} "
          "(e.g. qwen2.5-0.5b@bf16; docs/performance.md)")
    print("\nText encoders (bundled)")
    _print_table(models["encoders"], ["name", "model", "available", "provided_by"])
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    """Summary of one dataset."""
    from ctrlsim.data import load_dataset

    ds = load_dataset(args.dataset)
    summary = ds.summary()
    for key in ("name", "items", "interactions", "users", "users_with_attributes", "tags"):
        print(f"{key:>22}: {summary[key]}")
    print(f"{'tags':>22}: {', '.join(ds.tags)}")
    counts = ds.item_tags.groupby("tag").size().sort_values(ascending=False)
    print("\nItems per tag")
    _print_table([{"tag": t, "items": int(n)} for t, n in counts.items()], ["tag", "items"])
    return 0


SERVE_TOKEN_ENV = "CTRLSIM_SERVE_TOKEN"


def _box_options(text: str | None) -> dict:
    """`--box-options` as a dict of keyword arguments for `make_recommender`."""
    from ctrlsim.errors import ConfigError

    if not text:
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--box-options is not valid JSON ({exc}): {text!r}") from None
    if not isinstance(options, dict):
        raise ConfigError(f"--box-options must be a JSON object of keyword arguments, got {text!r}")
    return options


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve a black box over the HTTP contract (docs/http-recommenders.md) until Ctrl-C (exit 0).

    Everything that can be wrong (box name and options, dataset, token variable, limits, a
    non-loopback --host without a token, FastAPI/uvicorn missing) is reported, exit 2, before the
    port is bound."""
    import importlib.util
    import os

    from ctrlsim.errors import ConfigError, MissingDependencyError

    for module in ("fastapi", "uvicorn"):
        if importlib.util.find_spec(module) is None:
            raise MissingDependencyError(module, "serve", "ctrlsim serve")
    from ctrlsim.data import load_dataset
    from ctrlsim.recommenders import make_recommender
    from ctrlsim.recommenders.http.guard import ServeLimits, allowed_hosts_for, check_exposure
    from ctrlsim.recommenders.http.serve import listen, make_app, run_server, url_of
    from ctrlsim.recommenders.registry import check_recommender_name

    options = _box_options(args.box_options)
    check_recommender_name(args.box)
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    token = os.environ.get(args.token_env)
    if token is not None and not token.strip():
        raise ConfigError(f"${args.token_env} is set but empty; unset it to serve without a token")
    check_exposure(args.host, args.token_env, token is not None)
    limits = ServeLimits.from_flags(max_body_mb=args.max_body_mb, max_batch=args.max_batch,
                                    max_list=args.max_list, max_accounts=args.max_accounts,
                                    max_account_items=args.max_account_items)
    hosts = allowed_hosts_for(args.host, [h for h in (args.allowed_hosts or "").split(",") if h.strip()])
    dataset = load_dataset(args.dataset)
    try:
        box = make_recommender(args.box, dataset, **options)
    except TypeError as exc:  # an option the box's constructor does not take
        if not options:
            raise
        raise ConfigError(f"box {args.box!r} does not take the options {sorted(options)}: {exc}") from None
    if args.contract == "prc":  # the Prosocial Ranking Challenge's POST /rank (docs/prc.md)
        from ctrlsim.recommenders.http.prc.serve import make_prc_app

        app = make_prc_app(box, dataset=dataset, token=token, limits=limits, allowed_hosts=hosts)
    else:
        app = make_app(box, dataset=dataset, token=token, limits=limits, allowed_hosts=hosts,
                       contract=args.contract_version)
    sock = listen(args.host, args.port)
    try:
        auth = f"bearer token from ${args.token_env} required" if token else "no token"
        where = url_of(sock, args.host) + ("/rank (PRC ranker)" if args.contract == "prc" else "")
        print(f"ctrlsim serve: {args.box} on {dataset.name} at {where} "
              f"({auth}; OpenAPI document at /openapi.json; Ctrl-C stops)", flush=True)
        run_server(app, sock)
    except KeyboardInterrupt:  # Ctrl-C: uvicorn shut down gracefully, then re-raised SIGINT
        pass
    finally:
        sock.close()
    return 0


def cmd_check_box(args: argparse.Namespace) -> int:
    """Conformance of a box behind HTTP (ctrlsim's contract or the PRC's): exit 0 only when every check
    passes, 1 when one fails (the table names it and the request), 2 for a bad value."""
    from ctrlsim.data import load_dataset
    from ctrlsim.recommenders.http.conformance import check_box

    report = check_box(args.spec, load_dataset(args.dataset), k=args.k, latency_requests=args.requests,
                       examples=args.examples, objective_ms=args.latency_objective_ms,
                       token_env=args.token_env, timeout=args.timeout)
    print(report.table())
    print(f"\n{args.spec}: " + ("every check passed" if report.ok else "FAILED"))
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    """The `ctrlsim` parser; the runners and `report` parse their own arguments (`commands`)."""
    parser = argparse.ArgumentParser(prog="ctrlsim", description="Measure how controllable recommenders are.")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="datasets, LLMs and encoders available offline")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=cmd_info)
    data = sub.add_parser("data", help="summary of a dataset")
    data.add_argument("dataset", nargs="?", default="ml-100k", help="built-in name or path")
    data.set_defaults(func=cmd_data)
    serve = sub.add_parser("serve", help="serve a black box over HTTP (docs/http-recommenders.md)")
    serve.add_argument("box", help="any make_recommender name: popularity, embedding, sasrec, dial:0.5, ...")
    serve.add_argument("--dataset", default="ml-100k", help="the catalogue the box serves (default ml-100k)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    serve.add_argument("--box-options", default=None, metavar="JSON",
                       help='keyword arguments of the box as a JSON object, e.g. \'{"mask_shown": true}\'')
    serve.add_argument("--token-env", default=SERVE_TOKEN_ENV, metavar="NAME",
                       help=f"environment variable holding the bearer token clients must send "
                            f"(default {SERVE_TOKEN_ENV}; unset: no authentication, which only a "
                            f"loopback --host allows)")
    from ctrlsim.serve_limits import MIB, default_limits

    limits = default_limits()
    serve.add_argument("--allowed-hosts", default="", metavar="NAMES",
                       help="comma-separated Host header values answered besides the --host, localhost and "
                            "127.0.0.1 (the names clients use to reach the service; '*' answers any)")
    serve.add_argument("--max-body-mb", type=int, default=limits['max_body'] // MIB, metavar="MIB",
                       help=f"largest request body in MiB (default {limits['max_body'] // MIB})")
    serve.add_argument("--max-batch", type=int, default=limits['max_batch'], metavar="N",
                       help=f"states, accounts or events in one request (default {limits['max_batch']:,})")
    serve.add_argument("--max-list", type=int, default=limits['max_list'], metavar="N",
                       help=f"entries of one history, shown, candidates or attributes list "
                            f"(default {limits['max_list']:,})")
    serve.add_argument("--max-accounts", type=int, default=limits['max_accounts'], metavar="N",
                       help=f"accounts kept in memory; the least recently used is evicted "
                            f"(default {limits['max_accounts']:,})")
    serve.add_argument("--max-account-items", type=int, default=limits['max_account_items'], metavar="N",
                       help=f"history and shown entries all accounts hold; the least recently used are "
                            f"evicted (default {limits['max_account_items']:,})")
    serve.add_argument("--contract-version", default="2", choices=("1", "2"),
                       help="the HTTP contract served: 2 (default; negative feedback, settings, GET "
                            "/controls) or 1 (as servers before version 2: to rehearse a version-1 service)")
    serve.add_argument("--contract", default="ctrlsim", choices=("ctrlsim", "prc"),
                       help="the schema served: ctrlsim's contract (default) or the Prosocial Ranking "
                            "Challenge's POST /rank (docs/prc.md)")
    serve.set_defaults(func=cmd_serve)
    check = sub.add_parser("check-box", help="conformance of a box behind HTTP: schema, ids, k, determinism, "
                                             "latency (docs/prc.md)")
    check.add_argument("spec", help="http(s)://host:port (ctrlsim's contract) or prc+http(s)://host:port/rank")
    check.add_argument("--dataset", default="ml-100k", help="the catalogue the box serves (default ml-100k)")
    check.add_argument("--k", type=int, default=10, help="k of the representative requests (default 10)")
    check.add_argument("--requests", type=int, default=50, metavar="N",
                       help="requests timed for the latency percentiles (default 50)")
    check.add_argument("--examples", type=int, default=10, metavar="N",
                       help="generated requests per endpoint of the service's OpenAPI document "
                            "(default 10; 0 skips)")
    check.add_argument("--latency-objective-ms", type=float, default=500.0, metavar="MS",
                       help="the p95 latency objective in milliseconds (default 500, the PRC's)")
    check.add_argument("--token-env", default="CTRLSIM_RECOMMENDER_TOKEN", metavar="NAME",
                       help="environment variable holding the service's bearer token")
    check.add_argument("--timeout", type=float, default=30.0, help="seconds for one request (default 30)")
    check.set_defaults(func=cmd_check_box)
    for name in RUNNER_MODULES:
        sub.add_parser(name, help=f"{name} tables (see `ctrlsim {name} --help`)", add_help=False)
    sub.add_parser("report", help="rebuild tables and figures from run folders (see `ctrlsim report --help`)",
                   add_help=False)
    sub.add_parser("audit", help="every protocol that applies to a box, one report.html (see `ctrlsim audit "
                                 "--help`)", add_help=False)
    sub.add_parser("noise", help="rerun a run without its caches in another batch layout: its noise floor "
                                 "and smallest detectable effect (`ctrlsim noise --help`)", add_help=False)
    return parser


# Every runner of the one table (`ctrlsim.experiments.runner.RUNNER_MODULES`) is a subcommand.
PROTOCOLS = RUNNER_MODULES


INTERRUPTED_EXIT = 130  # 128 + SIGINT, what shells report for a command stopped by Ctrl-C


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done, 1 some units failed, 2 a bad value, 130 interrupted by Ctrl-C (one line
    on stderr says what is stored where; the same command resumes)."""
    try:
        return _main(argv)
    except RunInterrupted as exc:
        message = str(exc)
    except KeyboardInterrupt:  # before the run's units started, or while its tables were written
        message = "interrupted; finished units stay stored, and rerunning the same command resumes"
    # Printed once the interrupted frames are gone (a progress bar they held has closed by now).
    print(f"ctrlsim: {message}", file=sys.stderr, flush=True)
    return INTERRUPTED_EXIT


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv and argv[0] in RUNNER_MODULES:
            from ctrlsim.experiments.commands import runner_main

            return runner_main(argv[0], argv[1:])
        if argv and argv[0] == "report":
            from ctrlsim.experiments.commands import report_main

            return report_main(argv[1:])
        if argv and argv[0] == "audit":
            from ctrlsim.experiments.audit.runner import audit_main

            return audit_main(argv[1:])
        if argv and argv[0] == "noise":
            from ctrlsim.experiments.noise.command import noise_main

            return noise_main(argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except CtrlsimError as exc:
        from ctrlsim.redact import redact_secrets

        print(f"ctrlsim: error: {redact_secrets(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
