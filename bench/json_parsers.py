"""JSON parser bench: stdlib `json` vs orjson vs msgspec on the lines the control plane parses and writes.

Each parser runs the same lines, in rotating order, `--repeat` times after one discarded warm-up; the table
shows the median time per line and the spread (min..max) of each parser's speed relative to the stdlib.

    .venv/bin/python -m bench.json_parsers --lines 20000 --repeat 7    # pip install orjson to include it
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec

from bench.control_plane_world import input_line, result_line

Fn = Callable[[Any], Any]


def _std_dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


PARSERS: dict[str, tuple[Fn, Fn]] = {
    "stdlib json": (json.loads, _std_dumps),
    "msgspec": (msgspec.json.decode, msgspec.json.encode),
}
try:  # not a dependency of nightbatch: `pip install orjson` to compare it
    import orjson

    PARSERS["orjson"] = (orjson.loads, orjson.dumps)
except ImportError:
    pass


def timed(fn: Fn, items: list[Any]) -> float:
    t0 = time.perf_counter()
    for x in items:
        fn(x)
    return time.perf_counter() - t0


def measure(lines: int, repeat: int) -> dict[str, dict[str, list[float]]]:
    inputs = [input_line(i).rstrip(b"\n") for i in range(lines)]
    results = [result_line("batch_bench", f"r{i}", i).rstrip(b"\n") for i in range(lines)]
    objects = [json.loads(x) for x in results]
    tasks: dict[str, Callable[[int], list[Any]]] = {
        "loads input line": lambda _: inputs, "loads result line": lambda _: results,
        "dumps result line": lambda _: objects,
    }
    names = list(PARSERS)
    out: dict[str, dict[str, list[float]]] = {t: {n: [] for n in names} for t in tasks}
    for r in range(repeat + 1):  # round 0 is the warm-up, discarded
        order = names[r % len(names):] + names[:r % len(names)]
        for task, items in tasks.items():
            for name in order:
                fn = PARSERS[name][1 if task.startswith("dumps") else 0]
                s = timed(fn, items(0))
                if r:
                    out[task][name].append(s / lines)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    res = measure(args.lines, args.repeat)
    print(f"{args.lines} lines, {args.repeat} repeats (warm-up discarded, order rotated); "
          "speed vs stdlib = median (min..max) over paired runs")
    print(f"{'task':<20} {'parser':<12} {'µs/line':>8} {'speed vs stdlib':>22}")
    for task, by in res.items():
        base = by["stdlib json"]
        for name, times in by.items():
            ratios = [b / t for b, t in zip(base, times, strict=True)]
            print(f"{task:<20} {name:<12} {statistics.median(times) * 1e6:>8.2f} "
                  f"{statistics.median(ratios):>8.2f}x ({min(ratios):.2f}..{max(ratios):.2f})")


if __name__ == "__main__":
    main()
