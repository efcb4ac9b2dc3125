"""Prompt prefixes: the text a request's prompt begins with, as the worker compares it, and the cheap key
Validate computes from it so that Plan can keep requests sharing a long prefix in one shard."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def prompt_text(body: dict[str, Any], limit: int | None = None) -> str:
    """The prompt as the chat template will lay it out, near enough to compare prefixes and lengths: tools
    first (templates render them into the system turn), then each message's role and text. With `limit`,
    stops once that many characters are known (what Validate needs is only the head)."""
    parts: list[str] = []
    size = 0

    def add(text: str) -> bool:
        nonlocal size
        parts.append(text)
        size += len(text) + 1
        return limit is not None and size >= limit

    tools = body.get("tools")
    if tools and add(json.dumps(tools, sort_keys=True, separators=(",", ":"))):
        return "\n".join(parts)[:limit]
    instructions = body.get("instructions")  # a Responses request's system turn
    if isinstance(instructions, str) and add(f"system\n{instructions}"):
        return "\n".join(parts)[:limit]
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict) and add(
                    f"{message.get('role', '')}\n{_content_text(message.get('content'))}"):
                return "\n".join(parts)[:limit]
    for key in ("prompt", "input"):
        if key in body and add(_content_text(body[key])):
            break
    text = "\n".join(parts)
    return text if limit is None else text[:limit]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Text parts of a message, a list of prompts, or token ids: all compare the same way as text.
        return "\n".join(_content_text(item) for item in content)
    if isinstance(content, dict):
        if "content" in content:  # a Responses input item: {"role": …, "content": "…" or [parts]}
            return f"{content.get('role', '')}\n{_content_text(content['content'])}"
        return str(content.get("text", ""))
    return "" if content is None else str(content)


class PrefixGroups:
    """Prefix groups of one input file, 1..groups for prompts of at least `min_chars` characters, keyed on
    their first `min_chars`; 0 for shorter prompts and when grouping is off. The first `groups` distinct heads
    get a group each, in order of appearance, so that up to `groups` shared prefixes never share a group (a
    hash alone put two of four system prompts in one of eight groups); heads past those fall back to the
    hash of the head. Memory: at most `groups` 8-byte digests."""

    def __init__(self, *, groups: int, min_chars: int) -> None:
        self.groups = groups
        self.min_chars = min_chars
        # Lines at least this long may hold a prompt head worth grouping (a shorter one cannot: group 0).
        self.min_line_bytes = min_chars if groups > 0 else 1 << 62
        self._first: dict[bytes, int] = {}

    def of(self, body: dict[str, Any]) -> int:
        if self.groups <= 0:
            return 0
        head = prompt_text(body, limit=self.min_chars)
        if len(head) < self.min_chars:
            return 0
        digest = hashlib.blake2b(head.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        group = self._first.get(digest)
        if group is None:
            if len(self._first) < self.groups:
                group = self._first[digest] = len(self._first) + 1
            else:
                group = 1 + int.from_bytes(digest, "big") % self.groups
        return group
