"""Runs in `python -I -S` with only the Lambda asset on sys.path: imports each handler and answers one event.

argv: asset directory, then a JSON file of [{"handler": "module.attr", "event": {...}, "env": {...}}, ...].
Each call's environment is applied on top of the process's (AWS endpoint and credentials). Prints one JSON
line per call, then a line listing every loaded module file outside the asset and the standard library.
"""

import json
import os
import sys
import sysconfig


def main() -> None:
    asset, calls_path = sys.argv[1], sys.argv[2]
    sys.path.insert(0, asset)
    import importlib

    with open(calls_path) as f:
        calls = json.load(f)
    base_env = dict(os.environ)
    for call in calls:
        os.environ.clear()
        os.environ.update(base_env)
        os.environ.update(call["env"])
        module_name, _, attr = call["handler"].rpartition(".")
        # Each Lambda is its own process: cached settings and clients must not carry over.
        for name in [m for m in sys.modules if m.startswith(("nightbatch", "functions"))]:
            del sys.modules[name]
        handler = getattr(importlib.import_module(module_name), attr)
        try:
            result = handler(call["event"], Context(call["handler"]))
            print(json.dumps({"handler": call["handler"], "result": result}, default=str), flush=True)
        except Exception as exc:
            print(json.dumps({"handler": call["handler"], "error": f"{type(exc).__name__}: {exc}"}), flush=True)
    stdlib = sysconfig.get_paths()["stdlib"]
    foreign = sorted({getattr(m, "__file__", None) or "" for m in list(sys.modules.values())}
                     - {"", os.path.abspath(__file__)})
    foreign = [f for f in foreign if not f.startswith(os.path.abspath(asset))
               and (not f.startswith(stdlib) or "site-packages" in f)]
    print(json.dumps({"foreign_modules": foreign}), flush=True)


class Context:
    """The Lambda context a handler reads; tests/infra/moto_workflow.py calls handlers with it too."""

    def __init__(self, name: str, *, request_id: str = "asset-test", remaining_ms: int = 300_000) -> None:
        self.function_name = name
        self.aws_request_id = request_id
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{name}"
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


if __name__ == "__main__":
    main()
