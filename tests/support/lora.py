"""A tiny LoRA adapter for SmolLM2 made from random weights with peft, so the LoRA path runs on a real engine."""

from __future__ import annotations

from pathlib import Path

from nightbatch.models.spec import LOCAL_MODELS

RANK = 8


def make_smollm2_adapter(out: Path, seed: int = 0) -> Path:
    """PEFT's adapter format (adapter_config.json + adapter_model.safetensors) for SmolLM2-135M's attention.

    The B matrices are random too (peft's default makes them zero, an adapter that changes nothing), so a
    line served through the adapter answers differently from the base model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from gpu_worker.model_prep import resolve_model_dir

    if (out / "adapter_config.json").is_file():
        return out
    base = resolve_model_dir(LOCAL_MODELS[0])
    torch.manual_seed(seed)
    # Only the adapter's own matrices are saved: the base weights can stay random (and skip loading).
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base))
    # lora_alpha 4r scales the update 4x: at 1x a random adapter changed one greedy answer in three.
    config = LoraConfig(r=RANK, lora_alpha=4 * RANK, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
                        task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(str(out))
    return out


if __name__ == "__main__":  # python -m tests.support.lora OUT_DIR: keeps torch out of the test process
    import sys

    make_smollm2_adapter(Path(sys.argv[1]))
