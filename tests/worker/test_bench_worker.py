"""The worker bench's own helpers (bench/worker*.py): inputs, engine-arg plumbing, run_batch's progress line.
Nothing here runs an engine or measures anything."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from bench.worker import compare_tokens, input_spec, parse_args, parse_engine_arg, print_tables, ratio, write_inputs
from bench.worker_inputs import InputShape, kv_pressure_input, mixed_input, to_jsonl, uniform_input
from bench.worker_sides import BAR_RE, RunResult, Usage, cli_flags, usage_of


def test_mixed_input_shares_long_system_prompts_interleaved_in_random_order() -> None:
    shape = InputShape(requests=300)
    lines = mixed_input("m", 16, shape)
    assert len(lines) == 300 and len({line["custom_id"] for line in lines}) == 300
    systems = [line["body"]["messages"][0]["content"] if line["body"]["messages"][0]["role"] == "system" else None
               for line in lines]
    shared = [s for s in systems if s]
    assert len(shared) >= 150 and len(set(shared)) == shape.system_prompts
    assert all(len(s) > 1500 for s in shared)
    # Interleaved: the shared requests are not one block, and the prompts sharing one system prompt neither.
    first = systems.index(shared[0])
    assert any(s is None for s in systems[first:first + 10])
    assert all(line["body"]["ignore_eos"] is True and line["body"]["max_tokens"] == 16 for line in lines)
    assert mixed_input("m", 16, shape) == lines  # seeded
    assert to_jsonl(lines).count(b"\n") == 300 and json.loads(to_jsonl(lines).split(b"\n")[0]) == lines[0]


def test_uniform_input_has_same_length_prompts_and_no_shared_prefix() -> None:
    lines = uniform_input("m", 8, InputShape(requests=50))
    contents = [line["body"]["messages"][0]["content"] for line in lines]
    assert len({len(c.split()) for c in contents}) == 1
    assert len({c[:5] for c in contents}) == 50


def test_kv_input_has_more_long_prefixes_than_its_cache_holds_interleaved() -> None:
    args = parse_args([])
    assert "kv" in args.inputs.split(",")
    shape = InputShape(requests=200)
    lines = kv_pressure_input("m", 16, args.kv_prefixes, shape)
    systems = [line["body"]["messages"][0]["content"] for line in lines]
    assert all(line["body"]["messages"][0]["role"] == "system" for line in lines)
    assert len(set(systems)) == args.kv_prefixes and all(len(s) > 1500 for s in systems)
    # ~1.2 tokens a word: the distinct prefixes need more tokens than the cache has (128-token blocks on CPU).
    prefix_tokens = sum(1.2 * len(s.split()) for s in set(systems))
    assert prefix_tokens > args.kv_blocks * 128
    # Interleaved: a prefix rarely follows itself, so file order evicts it before it comes back.
    repeats = sum(a == b for a, b in itertools.pairwise(systems))
    assert repeats < len(lines) / 4
    assert kv_pressure_input("m", 16, args.kv_prefixes, shape) == lines  # seeded


def test_only_the_kv_input_runs_with_the_small_kv_cache(tmp_path: Path) -> None:
    from nightbatch.models.spec import ModelSpec

    args = parse_args(["--requests", "12", "--kv-blocks", "24"])
    spec = ModelSpec(name="m", source="/x", engine_args={"max_num_seqs": 64})
    assert input_spec(spec, args, "kv").engine_args == {"max_num_seqs": 64, "num_gpu_blocks_override": 24}
    assert input_spec(spec, args, "mixed") is spec and spec.engine_args == {"max_num_seqs": 64}
    paths = write_inputs(args, tmp_path)
    assert list(paths) == ["mixed", "uniform", "kv"]
    assert all(p.read_bytes().count(b"\n") == 12 for p in paths.values())
    with pytest.raises(SystemExit):
        write_inputs(parse_args(["--inputs", "nope"]), tmp_path)


def test_engine_args_become_the_same_settings_on_both_sides() -> None:
    assert parse_engine_arg("max_num_seqs=256") == ("max_num_seqs", 256)
    assert parse_engine_arg("enable-prefix-caching=false") == ("enable_prefix_caching", False)
    assert parse_engine_arg("kv_cache_dtype=fp8") == ("kv_cache_dtype", "fp8")
    flags = cli_flags({"max_num_seqs": 256, "enable_chunked_prefill": True, "enable_prefix_caching": False,
                       "compilation_config": {"level": 0}})
    assert flags == ["--max-num-seqs", "256", "--enable-chunked-prefill", "--no-enable-prefix-caching",
                     "--compilation-config", '{"level": 0}']


@pytest.mark.parametrize(("line", "seconds"), [
    ("Running batch: 100% Completed | 300/300 [01:16<00:00,  3.94req/s]", 300 / 3.94),
    ("Running batch: 100% Completed | 100/100 [02:26<00:00,  1.46s/req]", 100 * 1.46),
])
def test_run_batch_final_progress_line_gives_the_running_phase(line: str, seconds: float) -> None:
    done, _, rate, unit = BAR_RE.findall("noise\n" + line + "\nmore")[-1]
    assert (int(done) / float(rate) if unit == "req/s" else int(done) * float(rate)) == pytest.approx(seconds)


def test_token_counts_are_compared_line_by_line() -> None:
    line = {"response": {"status_code": 200, "body": {"usage": {
        "prompt_tokens": 30, "completion_tokens": 16, "prompt_tokens_details": {"cached_tokens": 16}}}}}
    assert usage_of(line) == Usage(200, 30, 16, 16)
    a = RunResult("a", 1.0, 2.0, {"x": Usage(200, 30, 16, 16), "y": Usage(200, 5, 16, 0)})
    b = RunResult("b", 1.0, 2.0, {"x": Usage(200, 30, 16, 0), "y": Usage(200, 5, 15, 0)})
    check = compare_tokens(a, b)
    assert check["lines"] == 2 and check["mismatched"] == 1  # cached tokens may differ; counts may not
    assert check["a"] == (35, 32, 16) and check["b"] == (35, 31, 0)


def test_repeats_scheduler_sizes_and_median_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args([])
    assert args.repeat >= 3 and args.max_num_seqs and args.max_num_batched_tokens and args.prefix_caching
    u = {"x": Usage(200, 30, 16, 8)}
    rb = [RunResult(f"rb{i}", t, t + 30, u) for i, t in enumerate((10.0, 20.0, 40.0))]
    ours = [RunResult(f"o{i}", t, t + 30, u) for i, t in enumerate((5.0, 20.0, 80.0))]
    assert ratio(ours, rb, "out_tps") == "**1.00x** (0.50..2.00)"  # the median of per-repeat ratios, not the best
    print_tables({"mixed": (rb, ours)}, {"mixed": compare_tokens(rb[0], ours[0])}, [("control", ours)])
    out = capsys.readouterr().out
    assert "cached prompt tokens" in out and "(0.50..2.00)" in out and "control" in out
