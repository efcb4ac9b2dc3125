"""A tiny vision-language model for engine tests: a BLIP-2 (a ViT vision tower, a Q-Former that reads the
image into a fixed number of query embeddings, and a Llama those are put in front of) with random weights and
a byte-level tokenizer written here, since no vision-language model ships in a PyPI package.

Why BLIP-2: the vision architectures whose vLLM or transformers code needs torchvision cannot run here (PyPI's
Linux torchvision is a CUDA build, so the project uninstalls it). Qwen2-VL's processor always loads a video
processor, which needs it; vLLM's LLaVA and PaliGemma (any CLIP or SigLIP tower) import Pixtral's image
processor, which does too. BLIP-2's processor is BLIP's image processor (PIL backend) and the tokenizer.

Its replies mean nothing; what it exercises is the image path (the image fetched and decoded, resized and
normalised, run through the vision tower and Q-Former and spliced into the prompt), which shows in the
prompt's token count: BLIP-2 puts IMAGE_TOKENS tokens before the prompt, whatever the image's size."""

from __future__ import annotations

import json
from pathlib import Path

IMAGE_SIZE = 56  # pixels per side every image is resized to
PATCH = 14  # pixels per patch side
IMAGE_TOKENS = 8  # the Q-Former's query tokens: what one image is in the prompt
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>")

# ChatML; image parts render as nothing, since BLIP-2's processor puts the image in front of the prompt.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for part in m['content'] if part['type'] == 'text' %}{{ part['text'] }}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_vlm(out: Path, seed: int = 29) -> Path:
    """Writes the model's Hugging Face directory to `out`: config and safetensors, tokenizer, processor."""
    import torch
    from transformers import Blip2Config, Blip2ForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    ids = _write_tokenizer(out)
    config = Blip2Config(
        vision_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": IMAGE_SIZE, "patch_size": PATCH},
        qformer_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                        "num_attention_heads": 2, "vocab_size": len(ids)},
        text_config={
            # Two heads of 64: a head size vLLM's CPU attention supports.
            "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": len(ids),
            "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 4096, "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
        },
        num_query_tokens=IMAGE_TOKENS, image_token_index=ids["<image>"],
    )
    torch.manual_seed(seed)
    Blip2ForConditionalGeneration(config).save_pretrained(out)
    preprocessor = {
        "image_processor_type": "BlipImageProcessor", "processor_class": "Blip2Processor",
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}, "do_resize": True, "resample": 3,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    processor = {"processor_class": "Blip2Processor", "num_query_tokens": IMAGE_TOKENS}
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2))
    return out


def _write_tokenizer(out: Path) -> dict[str, int]:
    """A byte-level tokenizer (one token per byte, no merges) with the special tokens; returns its vocab."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={symbol: i for i, symbol in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE,
    )
    wrapped.save_pretrained(out)
    return dict(wrapped.get_vocab())
