"""Cost bench: $ per 1M output tokens for 8B and 70B models on AWS GPU instances, beside hosted batch prices.

Throughputs come from published benchmarks (source tags in brackets), instance prices from
nightbatch/batches/cost.py, hosted prices from each provider's price page (Llama 3.1 8B and 70B, their batch rates);
rows marked `est` are arithmetic or assumptions, not measurements. Plug in your own measurement with
`--measured MODEL:INSTANCE:OUT_TOK_PER_S` (e.g. from bench/worker on a GPU box).

Sources: [S1] vLLM's blog, "vLLM v0.6.0: 2.7x throughput improvement" (2024-09-05); [S2] vllm-project/vllm pull
request 18566 (2025-05-22), its benchmark output; [S5] MLPerf Inference v5.1 results, llama3.1-8b Offline (Red Hat
and IBM Cloud vLLM submissions); [S9] NVIDIA TensorRT-LLM's performance overview (v1.0); [S11] MLPerf Inference
v4.1 results, NVIDIA's llama2-70b Offline submissions.

    .venv/bin/python -m bench.cost
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from nightbatch.batches.cost import PRICES

GPUS = {"g6e.xlarge": 1, "g6e.12xlarge": 4, "p5.48xlarge": 8, "p5e.48xlarge": 8, "p5en.48xlarge": 8}


@dataclass(frozen=True)
class Row:
    model: str
    instance: str
    out_tok_s_per_gpu: float
    source: str
    estimate: bool


ROWS = [
    Row("8B", "g6e.xlarge", 1642, "vLLM 0.10 MLPerf v5.1 offline, FP8, input-heavy [S5]", False),
    Row("8B", "g6e.xlarge", 5000, "assumed ~50% of the L40S FP8 decode ceiling", True),
    Row("8B", "p5.48xlarge", 6583, "vLLM V1 ShareGPT, BF16 [S2]", False),
    Row("8B", "p5.48xlarge", 15220, "TensorRT-LLM FP8 1000/1000 [S9]", False),
    Row("8B", "p5en.48xlarge", 17744, "TensorRT-LLM FP8 H200 1000/1000 [S9]", False),
    Row("8B", "p5e.48xlarge", 17744, "TensorRT-LLM FP8 H200 1000/1000 [S9]", False),
    Row("70B", "g6e.12xlarge", 250, "assumed: 4x L40S TP4 FP8, ~0.25 of H100 TP2 per GPU", True),
    Row("70B", "p5.48xlarge", 775, "vLLM 0.6 ShareGPT, BF16 TP4 [S1]", False),
    Row("70B", "p5.48xlarge", 2103, "TensorRT-LLM FP8 TP2 1000/1000 [S9]", False),
    Row("70B", "p5en.48xlarge", 2909, "TensorRT-LLM FP8 H200 TP1 1000/1000 [S9]", False),
    Row("70B", "p5e.48xlarge", 3913, "MLPerf v4.1 Llama2-70B H200 offline [S11]", False),
]

HOSTED = {
    "8B": [("DeepInfra (no batch discount), output", 0.05), ("Groq batch (25% off 0.08)", 0.06),
           ("Together batch", 0.09), ("Fireworks batch", 0.10), ("Bedrock batch", 0.11),
           ("OpenAI gpt-4o-mini batch, output", 0.30)],
    "70B": [("Bedrock batch", 0.36), ("DeepInfra 3.1-70B Turbo, output", 0.40), ("Together batch", 0.44),
            ("Fireworks batch", 0.45), ("Groq batch (25% off 0.79)", 0.59)],
}


def usd_per_1m_out(instance: str, capacity: str, out_tok_s_per_gpu: float) -> float:
    per_gpu_hour = PRICES[instance][capacity] / GPUS[instance]
    return per_gpu_hour / (out_tok_s_per_gpu * 3600) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--measured", action="append", default=[], metavar="MODEL:INSTANCE:OUT_TOK_PER_S_PER_GPU")
    args = p.parse_args()
    rows = list(ROWS)
    for m in args.measured:
        model, instance, tps = m.split(":")
        rows.append(Row(model, instance, float(tps), "measured (bench/worker)", False))
    print("$ per 1M output tokens, self-hosted (input tokens ride along at the measured in/out mix)")
    print(f"{'model':<5} {'instance':<14} {'out tok/s/GPU':>13} {'spot $/1M':>10} {'OD $/1M':>9}  source")
    for r in rows:
        spot = usd_per_1m_out(r.instance, "spot", r.out_tok_s_per_gpu)
        od = usd_per_1m_out(r.instance, "on-demand", r.out_tok_s_per_gpu)
        mark = " (est)" if r.estimate else ""
        print(f"{r.model:<5} {r.instance:<14} {r.out_tok_s_per_gpu:>13,.0f} {spot:>10.3f} {od:>9.3f}  {r.source}{mark}")
    print("\nInstance prices ($/h, us-east-1; spot is a snapshot; p5 on-demand is the post-cut estimate) [S16-S19]:")
    for inst, gpus in GPUS.items():
        od, spot = PRICES[inst]["on-demand"], PRICES[inst]["spot"]
        print(f"  {inst:<14} {gpus} GPU  on-demand {od:>7.3f}  spot {spot:>7.3f}")
    print("  (p5e: on-demand is the Capacity Blocks price and spot is us-east-2's — both est)")
    for model, prices in HOSTED.items():
        print(f"\nHosted {model} prices beside them, $ per 1M output tokens [S20-S25]:")
        for name, price in prices:
            print(f"  {name:<40} {price:.2f}")


if __name__ == "__main__":
    main()
