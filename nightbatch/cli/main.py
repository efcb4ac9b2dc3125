"""The `nightbatch` console script."""

from __future__ import annotations

import argparse
import logging
import sys

from nightbatch.cli import keys as cli_keys
from nightbatch.cli.commands import register as register_batch_commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nightbatch", description="Self-hosted OpenAI-compatible Batch API")
    sub = parser.add_subparsers(dest="command", required=True)
    local = sub.add_parser("local", help="run the whole stack on this machine (embedded AWS, CPU engines)")
    local.add_argument("--host", default="127.0.0.1")
    local.add_argument("--port", type=int, default=8000)
    local.add_argument("--no-engines", action="store_true",
                       help="do not start model engines, for API-only work: a batch ends at once, completed with "
                            "every line in its error file as shard_failed")
    cli_keys.register(sub)
    register_batch_commands(sub)  # submit, status, list, cancel, results, doctor
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "handler", None):  # commands that set a handler print for people, not log lines
        return int(args.handler(args))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # The embedded AWS logs every request it serves and botocore every credential lookup: noise for a user.
    for noisy in ("werkzeug", "botocore", "moto"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.command == "local":
        from nightbatch.local.stack import serve

        serve(args.host, args.port, engines=not args.no_engines)
    if args.command == "keys":
        return cli_keys.run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
