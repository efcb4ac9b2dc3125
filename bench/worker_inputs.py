"""Seeded batch inputs for the worker bench: a realistic mixed file, a uniform one and a KV-pressure one.

The mixed file is what a real batch often looks like: a few long system prompts (one per task: "classify
tickets", "extract fields", ...) shared by most requests, interleaved in a random order with requests that
share nothing, some short, some long. The uniform file is the opposite: same-length prompts, no shared
prefix, so that ordering can buy nothing and only per-request overhead shows. The KV-pressure file has
more distinct long system prompts than the engine's KV cache holds at once (the bench sizes the cache for it),
every request starting with one of them, interleaved: in file order a prefix is evicted before it comes
back; grouped by prefix, each one is prefilled about once.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

WORDS_TEXT = (
    "account action answer area army article bank basis battle beach bird blood board body book border "
    "bottle branch bread bridge brother budget building business button camera campaign capital career case "
    "center century chair chance chapter character child choice church city claim class client climate "
    "coach coast coffee college colour column company computer concept contract control corner country "
    "couple course court culture customer damage data dealer debate decade decision degree demand design "
    "detail device dinner director disease doctor document dollar dream driver economy editor effect effort "
    "energy engine event evidence example expert factor family farmer feature field figure film finger "
    "floor flower focus forest format friend future garden glass goal government group growth guest hair "
    "health heart history holiday horse hospital hotel house image impact income industry island issue "
    "job journey judge kitchen knowledge language lawyer leader letter level library light limit machine "
    "manager market meeting member memory message method minute model moment money morning mountain movie "
    "music nation nature network newspaper night number object ocean office officer opinion order owner "
    "paper parent partner patient pattern payment people period person picture piece plane planet player "
    "pocket poem policy position pressure price problem process product program project property purpose "
    "quality question radio reason record region report research resource result river road role room "
    "rule safety salary scene school science screen season secret sector series service shape share ship "
    "shop signal silver sister skill society software soldier solution song source space speech sport "
    "staff stage standard station story strategy street student studio style subject success summer "
    "surface system table target teacher team theory thing ticket title total town trade training travel "
    "treatment truth unit university valley value vehicle version village visit voice water weather week "
    "window winter woman worker writer year"
)
WORDS = WORDS_TEXT.split(" ")

TASKS = (
    "You are a support triage assistant for a hardware company. Classify the customer's message.",
    "You are a contract analyst. Extract the parties, dates and amounts from the text you are given.",
    "You are a product copywriter. Rewrite the description you are given in a warmer tone.",
    "You are a research librarian. Suggest three follow-up questions about the user's topic.",
    "You are a travel planner. Turn the user's notes into a short itinerary.",
    "You are a code reviewer. Point out the riskiest change in the diff you are given.",
)


@dataclass(frozen=True)
class InputShape:
    """How a generated file is made; the defaults are the mixed input."""

    requests: int = 300
    shared_fraction: float = 0.6  # requests that start with one of the long system prompts
    system_prompts: int = 4
    system_words: int = 320  # ~400 tokens with SmolLM2's tokenizer
    long_fraction: float = 0.2  # of the rest: long unshared user prompts
    long_words: int = 160
    short_words: int = 16


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def chat_line(custom_id: str, model: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    # ignore_eos (a vLLM sampling parameter accepted in the body) makes every request generate exactly
    # max_tokens, so both runners produce the same token counts whatever text they produce.
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def mixed_input(model: str, max_tokens: int, shape: InputShape, seed: int = 7) -> list[dict[str, Any]]:
    """≥ 50 % of requests share one of a few long system prompts, interleaved in a seeded random order."""
    rng = random.Random(seed)
    systems = [f"{TASKS[i % len(TASKS)]} Follow this style guide exactly. {words(rng, shape.system_words)}"
               for i in range(shape.system_prompts)]
    n_shared = round(shape.requests * shape.shared_fraction)
    n_long = round((shape.requests - n_shared) * shape.long_fraction)
    kinds = ["shared"] * n_shared + ["long"] * n_long + ["short"] * (shape.requests - n_shared - n_long)
    rng.shuffle(kinds)
    lines = []
    for i, kind in enumerate(kinds):
        if kind == "shared":
            user = f"Message {i}: {words(rng, rng.randint(shape.short_words, 3 * shape.short_words))}"
            messages = [{"role": "system", "content": rng.choice(systems)}, {"role": "user", "content": user}]
        elif kind == "long":
            messages = [{"role": "user", "content": f"Summarise note {i}: {words(rng, shape.long_words)}"}]
        else:
            messages = [{"role": "user", "content": f"Question {i}: {words(rng, shape.short_words)}"}]
        lines.append(chat_line(f"mixed-{i:05d}", model, messages, max_tokens))
    return lines


def uniform_input(model: str, max_tokens: int, shape: InputShape, seed: int = 11) -> list[dict[str, Any]]:
    """Same-length prompts that share nothing beyond the chat template."""
    rng = random.Random(seed)
    return [
        chat_line(f"uniform-{i:05d}", model,
                  [{"role": "user", "content": f"{i:05d} {words(rng, 2 * shape.short_words)}"}], max_tokens)
        for i in range(shape.requests)
    ]


def kv_pressure_input(model: str, max_tokens: int, prefixes: int, shape: InputShape,
                      seed: int = 13) -> list[dict[str, Any]]:
    """Every request starts with one of `prefixes` long system prompts (`shape.system_words` words each),
    in a seeded random order; the user turn is short and unshared."""
    rng = random.Random(seed)
    systems = [f"{TASKS[i % len(TASKS)]} Style guide {i}. {words(rng, shape.system_words)}" for i in range(prefixes)]
    lines = []
    for i in range(shape.requests):
        user = f"Message {i}: {words(rng, rng.randint(shape.short_words, 3 * shape.short_words))}"
        messages = [{"role": "system", "content": systems[rng.randrange(prefixes)]},
                    {"role": "user", "content": user}]
        lines.append(chat_line(f"kv-{i:05d}", model, messages, max_tokens))
    return lines


def to_jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)
