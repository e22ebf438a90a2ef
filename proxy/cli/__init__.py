"""``prefixpin`` command line: serve, check-config, audit, replay."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from proxy.config import Config, ConfigError, config_file, load


def _load_or_exit(path: str | None, overrides: dict[str, object] | None = None) -> Config:
    """The effective config, or exit 2 with every problem it has, each naming its key."""
    try:
        return load(path, overrides=overrides)
    except ConfigError as exc:
        source = config_file(path)
        named = any(p.startswith("config file ") for p in exc.problems)  # the file's own problem names it
        where = f" ({source})" if source and not named else ""
        if len(exc.problems) == 1:
            print(f"prefixpin: invalid configuration{where}: {exc.problems[0]}", file=sys.stderr)
        else:
            print(f"prefixpin: invalid configuration{where}, {len(exc.problems)} problems:", file=sys.stderr)
            for problem in exc.problems:
                print(f"  {problem}", file=sys.stderr)
        raise SystemExit(2) from None


def cmd_serve(args: argparse.Namespace) -> int:
    from proxy.cli.serve import serve_here, setup_logging
    from proxy.workers import serve, worker_count

    config = _load_or_exit(
        args.config,
        {
            "upstream.url": args.upstream,
            "listen.host": args.host,
            "listen.port": args.port,
            "listen.workers": args.workers,
            "trace.path": args.trace,
        },
    )
    setup_logging(config)
    if config.upstream.kind == "litellm":  # fail now, with the reason, if LiteLLM is missing
        from proxy.upstream.litellm import _import_litellm

        _import_litellm()
    workers = worker_count(config)
    if workers > 1:
        return serve(config, workers)
    return serve_here(config)


def cmd_check_config(args: argparse.Namespace) -> int:
    config = _load_or_exit(args.path)
    if not config_file(args.path):
        print("prefixpin: no config file (PATH or $PREFIXPIN_CONFIG): the built-in defaults", file=sys.stderr)
    data = config.public_dict()
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from proxy.cli.audit import run_audit

    config = _load_or_exit(args.config)
    return run_audit(
        args.trace,
        config,
        as_json=args.json,
        progress=not args.no_progress,
        html=args.html,
        fail_on=args.fail_on,
        min_ratio=args.min_ratio,
        suggest_rules=args.suggest_rules,
    )


def cmd_replay(args: argparse.Namespace) -> int:
    from proxy.cli.replay import run_replay

    return run_replay(
        args.trace,
        upstream=args.upstream,
        via=args.via,
        as_json=args.json,
        progress=not args.no_progress,
        api_key=args.api_key,
        timeout_s=args.timeout,
        honor_timing=args.timing,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefixpin",
        description="OpenAI-compatible reverse proxy that keeps LLM prefix caches hitting.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_serve, _add_check_config, _add_audit, _add_replay):
        add(sub)
    return parser


Commands = Any  # argparse's subparsers action (its class is private to argparse)


def _add_serve(sub: Commands) -> None:
    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="YAML config file (default: $PREFIXPIN_CONFIG, else built-in defaults)")
    serve.add_argument("--upstream", help="upstream base URL, e.g. http://127.0.0.1:8080")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8787)")
    serve.add_argument(
        "--workers", help="worker processes sharing the port, lineages in Redis: N or auto (one per CPU); default 1"
    )
    serve.add_argument(
        "--trace",
        metavar="PATH",
        help="record every request to PATH as an audit trace (JSON Lines; trace.path), for prefixpin audit",
    )
    serve.set_defaults(func=cmd_serve)


def _add_check_config(sub: Commands) -> None:
    check = sub.add_parser(
        "check-config", help="validate a config and print the effective one; exit 2 listing every problem"
    )
    check.add_argument("path", nargs="?", help="YAML config file (default: $PREFIXPIN_CONFIG)")
    check.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    check.set_defaults(func=cmd_check_config)


def _add_audit(sub: Commands) -> None:
    audit = sub.add_parser("audit", help="offline: predicted cacheable prefix before/after, breaks by cause")
    audit.add_argument("trace", help="trace file (JSON Lines)")
    audit.add_argument("--config", help="YAML config file")
    audit.add_argument("--json", action="store_true", help="machine-readable output")
    audit.add_argument("--html", metavar="FILE", help="also write the report as one self-contained HTML page")
    audit.add_argument(
        "--fail-on",
        metavar="CAUSES",
        help="exit 3 when a request still breaks its prefix for one of these causes after canonicalization "
        "(comma-separated: system_changed, tools_changed, params_changed, model_changed, history_rewritten, any)",
    )
    audit.add_argument(
        "--min-ratio",
        metavar="X",
        type=float,
        help="exit 3 when the trace's predicted cacheable ratio after canonicalization is below X (0..1)",
    )
    audit.add_argument("--no-progress", action="store_true", help="no progress bar")
    audit.add_argument(
        "--suggest-rules",
        action="store_true",
        help="print a config document with a rule for every volatile span learned from the trace (learn: pin)",
    )
    audit.set_defaults(func=cmd_audit)


def _add_replay(sub: Commands) -> None:
    replay = sub.add_parser("replay", help="send a trace to an upstream (or through prefixpin) and report")
    replay.add_argument("trace", help="trace file (JSON Lines)")
    replay.add_argument("--upstream", required=True, help="upstream base URL")
    replay.add_argument("--via", help="a running prefixpin to send through (its base URL)")
    replay.add_argument("--json", action="store_true", help="machine-readable output")
    replay.add_argument("--no-progress", action="store_true", help="no progress bar")
    replay.add_argument("--api-key", help="Authorization bearer key for requests without one")
    replay.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    replay.add_argument("--timing", action="store_true", help='honour the trace\'s "t" offsets')
    replay.set_defaults(func=cmd_replay)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `prefixpin audit ... | head`: the reader is gone, and so is the rest
        _quiet_stdout()
        return 141  # as a process SIGPIPE ended (128 + 13), like `cat` in the same pipe


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises no second
    BrokenPipeError (Python's documented recipe for SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
