"""The batch commands of the `nightbatch` console script: submit, status, list, cancel, results (and doctor).

They talk to any nightbatch server through the stock OpenAI SDK, so they double as a worked example.
`register` adds them to the console script's parser; each sets `handler`, which returns the exit status.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from nightbatch.cli.doctor import register as register_doctor

Handler = Callable[[argparse.Namespace], int]

MIB = 1024 * 1024
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": MIB, "mb": 1000**2, "mib": MIB,
          "g": 1024**3, "gb": 1000**3, "gib": 1024**3}


def size(text: str) -> int:
    m = _SIZE.fullmatch(text)
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4MiB, 512KiB, 1000000)")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "b").lower()])


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def command(name: str) -> Handler:
    """The handler `nightbatch.cli.batches.<name>`, imported when it runs (the OpenAI SDK is slow to
    import and `nightbatch local` does not need it); anything the user can fix becomes one line on stderr."""

    def run(args: argparse.Namespace) -> int:
        import openai

        from nightbatch.cli.connection import CommandError, explain

        handler: Handler = getattr(importlib.import_module("nightbatch.cli.batches"), name)
        try:
            return handler(args)
        except (CommandError, openai.OpenAIError, OSError) as e:
            if isinstance(e, BrokenPipeError):  # `nightbatch results … | head`: the reader has had enough
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 0
            print(f"nightbatch {args.command}: error: {explain(e)}", file=sys.stderr)
            return e.exit_code if isinstance(e, CommandError) else 1
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 130

    return run


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    server = argparse.ArgumentParser(add_help=False)
    server.add_argument("--base-url", metavar="URL",
                        help="the nightbatch API, e.g. https://abc.execute-api.eu-west-1.amazonaws.com/prod "
                             "(default: $NIGHTBATCH_BASE_URL, else the `nightbatch local` running here)")
    server.add_argument("--api-key", metavar="KEY", help="API key (default: $NIGHTBATCH_API_KEY)")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print the API's JSON on stdout")
    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--poll-interval", type=float, default=5.0, metavar="SECONDS",
                         help="seconds between polls while waiting (default 5)")

    p = sub.add_parser("submit", parents=[server, as_json, waiting],
                       help="upload a JSONL file of requests and create a batch",
                       description="Upload a JSONL file of requests and create a batch from it.")
    p.add_argument("file", type=Path, help="the requests, one JSON object per line (OpenAI's batch format)")
    p.add_argument("--endpoint", help="/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, "
                                      "/v1/score or /v1/rerank (default: the url of the first request in the file)")
    p.add_argument("--window", default="24h", help="completion window, e.g. 24h or 72h (default 24h)")
    p.add_argument("--metadata", nargs="+", action="extend", type=key_value, default=[], metavar="KEY=VALUE",
                   help="metadata to attach to the batch (up to 16 pairs)")
    p.add_argument("--wait", action="store_true", help="show progress until the batch ends; exit 0 if it "
                                                       "completed, 1 otherwise")
    p.add_argument("--estimate", action="store_true", help="upload and validate the file, print tokens, "
                   "GPU-seconds, cost and the shard plan (POST /v1/nightbatch/estimate); create no batch")
    p.add_argument("--part-size", type=size, default=4 * MIB, metavar="SIZE",
                   help="files larger than this go through the Uploads API in parts of this size "
                        "(default 4MiB, what fits through API Gateway; up to 64MiB on `nightbatch local`)")
    p.set_defaults(handler=command("submit"))

    p = sub.add_parser("status", parents=[server, as_json, waiting], help="show one batch",
                       description="Show one batch: status, counts, tokens, cost, times, files, errors.")
    p.add_argument("batch_id")
    p.add_argument("--wait", action="store_true", help="show progress until the batch ends")
    p.set_defaults(handler=command("status"))

    p = sub.add_parser("list", parents=[server, as_json], help="list batches, newest first")
    p.add_argument("--limit", type=int, default=20, help="how many batches to show (default 20)")
    p.set_defaults(handler=command("list_batches"))

    p = sub.add_parser("cancel", parents=[server, as_json], help="cancel a batch",
                       description="Cancel a batch. Finished requests stay in its output file.")
    p.add_argument("batch_id")
    p.set_defaults(handler=command("cancel"))

    p = sub.add_parser("results", parents=[server], help="download a batch's output (or error) file",
                       description="Stream a batch's output file (or, with --errors, its error file).")
    p.add_argument("batch_id")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--errors", action="store_true", help="the error file instead of the output file")
    p.add_argument("--partial", action="store_true",
                   help="the lines finished so far, while the batch runs (the final file once it has ended)")
    p.set_defaults(handler=command("results"))
    register_doctor(sub, server)
