"""Control-plane bench: validate + plan + finalize wall time and peak RSS, next to the floor.

The floor reads the same input object from the same S3 endpoint and parses every line. Two floors are
printed: with the standard library's `json` and with msgspec, the compiled parser nightbatch uses on its hot
paths; the speed ratio is taken against the msgspec floor (the same parser on both sides). S3 is moto's server
in another process; a second table splits each side's time into its own process CPU and the CPU the S3
server spent meanwhile (work real S3 does on its own machines: Finalize's UploadPartCopy and
CompleteMultipartUpload are copies inside moto here). A third table puts nightbatch's own CPU against the
floor's, and counts the bytes sent to S3 (PutObject and UploadPart bodies; UploadPartCopy apart, as bytes
S3 copies without them crossing the network) per input byte and against the output's size, and the S3
requests per 1,000 lines. Between the two timed sections stand-in workers checkpoint each shard's results at
the real worker's cadence (gpu_worker.checkpoints' own policy and writer, on a clock of
control_plane_world.WORKER_BYTES_PER_SECOND per shard; not timed, their bytes and requests counted as the
workers'). Each measurement runs in a fresh child process so that its peak RSS is its own
(nightbatch's: the higher of its two timed sections' peaks, the stand-in's left out); each size runs
`--repeat` times (floors and ours alternating) and the tables show medians with the min..max spread. The
world it runs in (S3, the batch, the stand-in workers): bench/control_plane_world.py.

    .venv/bin/python -m bench.control_plane --sizes 10,10000,100000,1000000
    .venv/bin/python -m bench.control_plane --sizes 1000000 --baseline /tmp/base   # a speed-up against REV:
                                           # git worktree add /tmp/base REV
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.control_plane_world import (
    BUCKET,
    TABLE,
    WORKER_BYTES_PER_SECOND,
    prepare,
    settings,
    start_s3,
    write_results,
)


class Clocks:
    """This process's CPU and the S3 server's (BENCH_S3_PID), summed over the timed sections."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.s3_cpu = 0.0
        self.pid = os.environ.get("BENCH_S3_PID", "")

    def _s3(self) -> float:
        if not self.pid:
            return 0.0
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def __enter__(self) -> Clocks:
        self._t = (time.process_time(), self._s3())
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu += time.process_time() - self._t[0]
        self.s3_cpu += self._s3() - self._t[1]

    def fields(self) -> dict[str, float]:
        return {"cpu": self.cpu, "s3_cpu": self.s3_cpu}


class S3Bytes:
    """Bytes this process sends to S3 (PutObject and UploadPart bodies) and asks S3 to copy (UploadPartCopy:
    its bytes never cross the network, so they are counted apart), and its S3 requests, by the phase set in
    `phase`."""

    def __init__(self, client: Any) -> None:
        self.phase = "control"
        self.written: dict[str, int] = {}
        self.requests: dict[str, int] = {}
        self.copied = 0
        events = client.meta.events
        events.register("before-call.s3", self._request)
        events.register("before-parameter-build.s3.PutObject", self._sent)
        events.register("before-parameter-build.s3.UploadPart", self._sent)
        events.register("before-parameter-build.s3.UploadPartCopy", self._copy)

    def _sent(self, params: dict[str, Any], **_: Any) -> None:
        body = params.get("Body", b"")
        if isinstance(body, bytes | bytearray | memoryview):
            size = len(body)
        else:  # a file object, from where it stands to its end
            at = body.tell()
            size = body.seek(0, io.SEEK_END) - at
            body.seek(at)
        self.written[self.phase] = self.written.get(self.phase, 0) + size

    def _request(self, **_: Any) -> None:
        self.requests[self.phase] = self.requests.get(self.phase, 0) + 1

    def _copy(self, params: dict[str, Any], **_: Any) -> None:
        first, last = params["CopySourceRange"].removeprefix("bytes=").split("-")
        self.copied += int(last) - int(first) + 1


def child_ours(batch_id: str) -> dict[str, Any]:
    from nightbatch import layout
    from nightbatch.aws import make_adapters
    from nightbatch.pipeline import BatchTaskInput, finalize_batch, plan_batch, validate_batch
    from nightbatch.wiring import build_services

    class NoWorkflow:
        def start(self, batch_id: str) -> None:
            pass

    services = build_services(make_adapters(settings()), NoWorkflow())
    inp = BatchTaskInput(batch_id=batch_id)
    clocks = Clocks()
    sent = S3Bytes(services.adapters.blobs.client)
    t0 = time.perf_counter()
    with clocks, profiled("validate_plan"):
        assert validate_batch(inp, services).valid
        plan_batch(inp, services)
    t_plan = time.perf_counter() - t0
    cpu_plan = clocks.cpu
    rss_plan = peak_rss_mb()
    sent.phase = "workers"
    write_results(services, batch_id)
    sent.phase = "control"
    Path("/proc/self/clear_refs").write_text("5")  # the stand-in workers' peak is not the control plane's
    t1 = time.perf_counter()
    with clocks, profiled("finalize"):
        out = finalize_batch(inp, services)
    t_final = time.perf_counter() - t1
    rss = max(rss_plan, peak_rss_mb())
    batch = services.batches.get("bench", batch_id)
    output = services.adapters.blobs.size(layout.output_key(batch_id)) or 0
    return {"seconds": t_plan + t_final, "validate_plan_s": t_plan, "finalize_s": t_final, **clocks.fields(),
            "status": out.status, "completed": batch.request_counts.completed, "total": batch.request_counts.total,
            "written_control": sent.written.get("control", 0), "written_workers": sent.written.get("workers", 0),
            "requests_control": sent.requests.get("control", 0), "requests_workers": sent.requests.get("workers", 0),
            "copied": sent.copied, "output_bytes": output, "rss_mb": rss, "validate_plan_cpu": cpu_plan,
            "finalize_cpu": clocks.cpu - cpu_plan}


@contextlib.contextmanager
def profiled(section: str) -> Iterator[None]:
    """`--profile SECTION` (BENCH_PROFILE): cProfile over that timed section of the child, on each thread's own
    CPU clock (time spent waiting on S3 is not counted), its thread and the threads it starts (S3 calls sent
    from thread pools) summed; the top BENCH_PROFILE_TOP functions by own CPU (or by BENCH_PROFILE_SORT, e.g.
    `cumulative`) printed to stderr, which the parent passes on."""
    if os.environ.get("BENCH_PROFILE") != section:
        yield
        return
    import cProfile
    import pstats
    import threading

    profs = [cProfile.Profile(time.thread_time)]

    def in_thread(*_: Any) -> None:  # a new thread's first event: it gets a profiler of its own
        profs.append(prof := cProfile.Profile(time.thread_time))
        prof.enable()

    threading.setprofile(in_thread)
    profs[0].enable()
    try:
        yield
    finally:
        profs[0].disable()
        threading.setprofile(None)
        out = io.StringIO()
        stats = pstats.Stats(profs[0], stream=out)
        for prof in profs[1:]:
            stats.add(prof)
        stats.sort_stats(os.environ.get("BENCH_PROFILE_SORT", "tottime"))
        stats.print_stats(int(os.environ.get("BENCH_PROFILE_TOP", 15)))
        print(f"--- profile of {section} ({len(profs)} threads, by own CPU) ---", out.getvalue(), sep="\n",
              file=sys.stderr)


def child_floor(file_key: str, parser: str) -> dict[str, Any]:
    import msgspec

    from nightbatch.aws import make_adapters
    from nightbatch.jsonl import split_lines

    parse = msgspec.json.Decoder().decode if parser == "msgspec" else json.loads
    blobs = make_adapters(settings()).blobs
    clocks = Clocks()
    t0 = time.perf_counter()
    n = 0
    with clocks:
        for raw in split_lines(blobs.iter_chunks(file_key), max_bytes=1 << 20):
            if raw.data:
                parse(raw.data)
                n += 1
    return {"seconds": time.perf_counter() - t0, "lines": n, **clocks.fields()}


def peak_rss_mb() -> float:
    """VmHWM of this process image (ru_maxrss would carry the parent's peak across exec on Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_child(kind: str, arg: str, env: dict[str, str], cwd: Path | None = None) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.control_plane", "--child", kind, arg], env=env, cwd=cwd,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} child failed:\n{out.stderr[-3000:]}")
    if env.get("BENCH_PROFILE") and kind == "ours":
        sys.stderr.write(out.stderr)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}..{max(xs):.2f})"


def measure(sizes: list[int], repeat: int = 1, baseline: Path | None = None) -> list[dict[str, Any]]:
    """`baseline`: another checkout of nightbatch (e.g. `git worktree add /tmp/base REV`) whose validate + plan +
    finalize run alternating with this one's, on batches of the same input, for a speed-up measured side by side."""
    proc, url = start_s3()
    env = {**os.environ, "AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "BENCH_S3_PID": str(proc.pid),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    rows = []
    try:
        from nightbatch.aws import make_adapters
        from nightbatch.aws.dynamo import create_table

        a = make_adapters(settings())
        a.client("s3").create_bucket(Bucket=BUCKET)
        create_table(a.client("dynamodb"), TABLE)
        for n in sizes:
            runs: dict[str, list[dict[str, Any]]] = {"std": [], "fast": [], "ours": [], "base": []}
            kinds = ["std", "fast", "ours", *(["base"] if baseline else [])]
            for r in range(repeat):
                prep = prepare(n)  # a fresh batch each run (Validate and Finalize run once per batch)
                for kind in kinds if r % 2 == 0 else kinds[::-1]:
                    if kind in ("ours", "base"):
                        batch_id = prep["batch_id"] if kind == "ours" else prepare(n)["batch_id"]
                        res = run_child("ours", batch_id, env) if kind == "ours" else run_child(
                            "ours", batch_id, {**env, "PYTHONPATH": str(baseline)}, cwd=baseline)
                        assert res["total"] == n and res["completed"] == n, res
                    else:
                        res = run_child("floor-" + ("msgspec" if kind == "fast" else "stdlib"), prep["file_key"],
                                        env)
                    runs[kind].append(res)
            secs = {k: [x["seconds"] for x in v] for k, v in runs.items()}
            rows.append({"lines": n, "mb": prep["bytes"] / 1e6, "std_s": spread(secs["std"]),
                         "fast_s": spread(secs["fast"]), "ours_s": spread(secs["ours"]),
                         "speed": [f / o for f, o in zip(secs["fast"], secs["ours"], strict=True)],
                         "speed_std": [f / o for f, o in zip(secs["std"], secs["ours"], strict=True)],
                         "parts": {k: spread([x[k] for x in runs["ours"]])
                                   for k in ("validate_plan_s", "finalize_s", "cpu", "s3_cpu")},
                         "floor_parts": {k: spread([x[k] for x in runs["fast"]]) for k in ("cpu", "s3_cpu")},
                         "floor_rss_mb": max(x["rss_mb"] for x in runs["fast"]),
                         "ours_rss_mb": max(x["rss_mb"] for x in runs["ours"]),
                         "cpu_vs_floor": [f["cpu"] / o["cpu"] for f, o in zip(runs["fast"], runs["ours"],
                                                                                strict=True)],
                         "bytes": {k: statistics.median(x[k] for x in runs["ours"]) for k in (
                             "written_control", "written_workers", "copied", "output_bytes")},
                         "written_per_output": [
                             (x["written_control"] + x["written_workers"]) / max(1, x["output_bytes"])
                             for x in runs["ours"]],
                         "requests_per_1k": {k: [x[k] * 1000 / n for x in runs["ours"]]
                                             for k in ("requests_control", "requests_workers")},
                         "input_bytes": prep["bytes"],
                         "cpu_split": " / ".join(spread([x[k] for x in runs["ours"]]) for k in (
                             "validate_plan_cpu", "finalize_cpu")),
                         "base_s": spread(secs["base"]) if baseline else "",
                         "cpu_vs_base": {k: ([b[k] for b in runs["base"]], [o[k] for o in runs["ours"]])
                                         for k in ("validate_plan_cpu", "finalize_cpu", "cpu")},
                         "vs_base": [b / o for b, o in zip(secs["base"], secs["ours"], strict=False)]})
    finally:
        proc.terminate()
        proc.wait()
    return rows


def print_table(rows: list[dict[str, Any]], repeat: int) -> None:
    def ratio(xs: list[float]) -> str:
        return f"{statistics.median(xs):.0%} ({min(xs):.0%}..{max(xs):.0%})"

    print(f"S3: moto server in another process; {repeat} runs per size, alternating order; "
          "median (min..max); RSS = the highest peak")
    markdown_table(["lines", "MB", "floor, stdlib json (s)", "floor, msgspec (s)", "nightbatch (s)",
                    "speed vs msgspec floor (goal >= 50 %)", "speed vs stdlib floor", "peak RSS floor / ours (MB)"],
                   [[r["lines"], f"{r['mb']:.1f}", r["std_s"], r["fast_s"], r["ours_s"], ratio(r["speed"]),
                     ratio(r["speed_std"]), f"{r['floor_rss_mb']:.0f} / {r['ours_rss_mb']:.0f}"] for r in rows])
    print("\nWhere the time goes (medians, min..max): nightbatch's two timed sections; this process's CPU and the "
          "S3 server's CPU during them, for nightbatch and for the msgspec floor")
    markdown_table(["lines", "validate + plan (s)", "finalize (s)", "nightbatch CPU (s)", "S3 server CPU (s)",
                    "floor CPU (s)", "floor's S3 server CPU (s)"],
                   [[r["lines"], *(r["parts"][k] for k in ("validate_plan_s", "finalize_s", "cpu", "s3_cpu")),
                     r["floor_parts"]["cpu"], r["floor_parts"]["s3_cpu"]] for r in rows])
    print("\nCPU and S3 bytes (medians): nightbatch's own CPU against the msgspec floor's (floor CPU / ours); "
          "bytes sent to S3 in PutObject and UploadPart bodies by the control plane (validate, plan, finalize) "
          "and by the stand-in workers (checkpoints at the real worker's cadence, their summaries and progress "
          f"samples, at {WORKER_BYTES_PER_SECOND / 1000:.0f} KB of results a second per shard); UploadPartCopy "
          "counted apart, as copied (no bytes cross the network); S3 requests per 1,000 lines, control plane / "
          "stand-in workers")
    mb = 1e6

    def written(r: dict[str, Any]) -> int:
        return int(r["bytes"]["written_control"] + r["bytes"]["written_workers"])

    markdown_table(["lines", "CPU vs floor (goal >= 50 %)", "CPU: validate + plan / finalize (s)",
                    "written: control (MB)", "written: workers (MB)",
                    "copied by S3 (MB)", "output (MB)", "written / input byte", "written / output (goal <= 1.2)",
                    "S3 requests / 1k lines: control / workers", "peak RSS (goal <= 256 MB)"],
                   [[r["lines"], ratio(r["cpu_vs_floor"]), r["cpu_split"], f"{r['bytes']['written_control'] / mb:.1f}",
                     f"{r['bytes']['written_workers'] / mb:.1f}", f"{r['bytes']['copied'] / mb:.1f}",
                     f"{r['bytes']['output_bytes'] / mb:.1f}",
                     f"{written(r) / r['input_bytes']:.2f}", spread(r["written_per_output"]),
                     " / ".join(spread(r["requests_per_1k"][k]) for k in ("requests_control", "requests_workers")),
                     f"{r['ours_rss_mb']:.0f}"] for r in rows])
    if any(r["vs_base"] for r in rows):
        print("\nAgainst the baseline checkout, side by side (speed-up: its time over ours, run by run)")
        markdown_table(["lines", "baseline (s)", "nightbatch (s)", "speed-up"],
                       [[r["lines"], r["base_s"], r["ours_s"],
                         f"{statistics.median(r['vs_base']):.2f}x ({min(r['vs_base']):.2f}..{max(r['vs_base']):.2f})"]
                        for r in rows])
        print("\nCPU against the baseline (this process's, medians and min..max; the ratio its CPU over ours, run by "
              "run)")

        def cpu(r: dict[str, Any], k: str) -> str:
            base, ours = r["cpu_vs_base"][k]
            x = [b / max(1e-9, o) for b, o in zip(base, ours, strict=False)]
            return f"{spread(base)} / {spread(ours)} = {statistics.median(x):.2f}x ({min(x):.2f}..{max(x):.2f})"

        markdown_table(["lines", "validate + plan CPU (s): baseline / ours", "finalize CPU (s): baseline / ours",
                        "all CPU (s): baseline / ours"],
                       [[r["lines"], *(cpu(r, k) for k in ("validate_plan_cpu", "finalize_cpu", "cpu"))] for r in rows])


def markdown_table(header: list[str], rows: list[list[Any]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---:|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10,10000,100000,1000000")
    p.add_argument("--repeat", type=int, default=3, help="runs per size (default 3)")
    p.add_argument("--baseline", type=Path, help="another nightbatch checkout to run side by side (a speed-up)")
    p.add_argument("--profile", choices=["validate_plan", "finalize"],
                   help="print a cProfile of this timed section of every nightbatch run (its CPU then includes "
                        "the profiler's)")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.profile:
        os.environ["BENCH_PROFILE"] = args.profile
    if args.child:
        kind, arg = args.child
        result = child_ours(arg) if kind == "ours" else child_floor(arg, kind.removeprefix("floor-"))
        result.setdefault("rss_mb", peak_rss_mb())
        print(json.dumps(result))
        return
    print_table(measure([int(x) for x in args.sizes.split(",")], args.repeat, args.baseline), args.repeat)


if __name__ == "__main__":
    main()
