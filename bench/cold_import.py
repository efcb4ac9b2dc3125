"""API Lambda cold import: `python -X importtime -c "import functions.api.handler"` in fresh processes.

Prints the median (min..max) of the handler's cumulative import time over `--repeat` runs, and the largest
imports of the median run. `--asset DIR` imports from a built Lambda asset (what `infra/bundling.py` puts in
the zip; `-S`, so nothing else is importable) instead of this checkout and its virtualenv; `--build-asset`
first builds one into DIR the way infra/bundling.py does, for this machine's platform and Python (the real
asset is for Lambda's arm64 Python and cannot be imported here); `--compile` also ships .pyc files compiled by
this interpreter, as the Docker bundling does with the runtime's Python (without them every cold start compiles
every module: Lambda's /var/task is read-only). The process CPU time (user + sys, interpreter start included)
is printed next to importtime's wall time: on a loaded machine it moves much less. Goal: <= 400 ms.

`--compare-tracer` instead runs, interleaved in fresh processes with Lambda's environment variables set, the
handler's import alone and Powertools' Tracer made first as the task Lambdas make it (functions/tasks/tracing.py:
X-Ray SDK loaded, botocore imported and patched), and prints both (wall and process CPU) and their ratio: what
a Tracer would add to the API's init.

    .venv/bin/python -m bench.cold_import --repeat 9
    .venv/bin/python -m bench.cold_import --repeat 9 --asset /tmp/api-asset --build-asset [--compile]
    .venv/bin/python -m bench.cold_import --repeat 9 --compare-tracer
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

MODULE = "functions.api.handler"


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one_run(python: str, path: str, isolated: bool, cpu: list[float] | None = None) -> list[tuple[int, int, str]]:
    """(self µs, cumulative µs, indented name) per imported module, in importtime's order; appends the process's
    CPU ms to `cpu`."""
    env = {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [python, *(["-S"] if isolated else []), "-X", "importtime", "-c", f"import {MODULE}"]
    before = _children_cpu()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=path)
    if cpu is not None:
        cpu.append((_children_cpu() - before) * 1000)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    rows = []
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = line.removeprefix("import time:").split("|", 2)
        rows.append((int(self_us), int(cum_us), name.rstrip()))
    return rows


# As functions/tasks/tracing.py makes it.
TRACER = "from aws_lambda_powertools.tracing import Tracer; Tracer(service='nightbatch', patch_modules=('botocore',)); "


def timed_run(python: str, path: str, isolated: bool, prelude: str) -> tuple[float, float]:
    """(wall ms from the first statement to the handler imported, the process's CPU ms) in a fresh interpreter."""
    code = (f"import time; t = time.perf_counter(); {prelude}import {MODULE}; "
            "print((time.perf_counter() - t) * 1000)")
    env = {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1", "LAMBDA_TASK_ROOT": path,
           "AWS_LAMBDA_FUNCTION_NAME": "bench", "AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:9"}
    before = _children_cpu()
    out = subprocess.run([python, *(["-S"] if isolated else []), "-c", code], env=env, capture_output=True,
                         text=True, cwd=path)
    cpu = (_children_cpu() - before) * 1000
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return float(out.stdout.split()[-1]), cpu


def compare_tracer(python: str, path: str, isolated: bool, repeat: int) -> None:
    timed_run(python, path, isolated, TRACER)  # warm-up (page cache, .pyc), discarded
    runs: dict[str, list[tuple[float, float]]] = {"handler alone": [], "Tracer + handler": []}
    for _ in range(repeat):
        runs["handler alone"].append(timed_run(python, path, isolated, ""))
        runs["Tracer + handler"].append(timed_run(python, path, isolated, TRACER))
    medians = {}
    for name, xs in runs.items():
        wall, cpu = [x[0] for x in xs], [x[1] for x in xs]
        medians[name] = (statistics.median(wall), statistics.median(cpu))
        print(f"{name:>16}: wall median {medians[name][0]:.0f} ms ({min(wall):.0f}..{max(wall):.0f}), "
              f"process CPU median {medians[name][1]:.0f} ms ({min(cpu):.0f}..{max(cpu):.0f}) over {repeat} runs")
    (w0, c0), (w1, c1) = medians.values()
    print(f"{'ratio':>16}: wall {w1 / w0:.2f}x (+{w1 - w0:.0f} ms), CPU {c1 / c0:.2f}x (+{c1 - c0:.0f} ms); "
          f"load average {os.getloadavg()[0]:.1f}")


def total_ms(rows: list[tuple[int, int, str]]) -> float:
    return next(c for _, c, n in rows if n.strip() == MODULE) / 1000


def direct_children(rows: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """The handler's direct imports: importtime prints each module after its children, one level deeper."""
    pending: dict[int, list[tuple[int, int, str]]] = {}
    for row in rows:
        depth = (len(row[2]) - len(row[2].lstrip())) // 2
        children = pending.pop(depth + 1, [])
        if row[2].strip() == MODULE:
            return children
        pending.setdefault(depth, []).append(row)
    return []


def build_asset(out: Path, compile: bool = False) -> None:
    import platform

    from infra.bundling import PipLocalBundler, lambda_requirements

    root = Path(__file__).resolve().parents[1]
    out.mkdir(parents=True, exist_ok=True)
    PipLocalBundler(root=root, requirements=lambda_requirements(root / "pyproject.toml"),
                    python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
                    platform=f"manylinux2014_{platform.machine()}", compile=compile).try_bundle(str(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--asset", help="a built Lambda asset directory (default: this checkout)")
    p.add_argument("--build-asset", action="store_true", help="build the asset into --asset first (pip)")
    p.add_argument("--compile", action="store_true", help="with --build-asset: ship .pyc files (this Python's)")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--compare-tracer", action="store_true", help="the handler with and without a Tracer first")
    args = p.parse_args()
    if args.build_asset:
        build_asset(Path(args.asset), compile=args.compile)
    path = args.asset or str(Path(__file__).resolve().parents[1])
    if args.compare_tracer:
        compare_tracer(sys.executable, path, bool(args.asset), args.repeat)
        return
    one_run(sys.executable, path, bool(args.asset))  # warm-up (page cache, .pyc), discarded
    cpu: list[float] = []
    runs = [one_run(sys.executable, path, bool(args.asset), cpu) for _ in range(args.repeat)]
    totals = [total_ms(r) for r in runs]
    median = statistics.median(totals)
    pyc = any(Path(path).rglob("__pycache__/*.pyc")) if args.asset else True
    print(f"{MODULE} cold import from {'asset ' + args.asset if args.asset else 'this checkout'} "
          f"(Python {sys.version_info.major}.{sys.version_info.minor}, {'with' if pyc else 'no'} .pyc): "
          f"median {median:.0f} ms ({min(totals):.0f}..{max(totals):.0f}) over {args.repeat} runs (goal <= 400 ms); "
          f"process CPU median {statistics.median(cpu):.0f} ms ({min(cpu):.0f}..{max(cpu):.0f}); "
          f"load average {os.getloadavg()[0]:.1f}")
    mid = runs[min(range(len(totals)), key=lambda i: abs(totals[i] - median))]
    top = direct_children(mid)
    print("largest direct imports of the handler in the median run (cumulative ms):")
    for _, cum, name in sorted(top, key=lambda r: -r[1])[:args.top]:
        print(f"  {cum / 1000:>7.1f}  {name.strip()}")


if __name__ == "__main__":
    main()
