"""Media references of a request line, on every wire: where a line names an image (or a video, an audio clip) and
what each reference may be. The one walker of those places: Validate checks a line through `check_references`
(with the batch tenant's files, validation/file_images.py) and the GPU worker walks the same references with the
same checks before it fetches any (gpu_worker/images.py), so the worker resolves only what Validate's rules let a
line name, whatever the line it reads says.

Where references are (docs/USER_BUCKETS.md, docs/ANTHROPIC.md), in every `content` list at any depth:
- OpenAI wires (chat, responses, the `messages` of an embeddings line, score and rerank sides): a part's
  `image_url`, `video_url` or `audio_url` (`{"url": ...}` or a string), a Responses `input_image`'s `file_id`; a
  Responses `function_call_output`'s `output` list too.
- Anthropic Messages: every block's `source` (`url`, `file`, or inline `base64`): an image inside a
  `tool_result` is an image like any other.

What a reference may be: an inline `data:` URL (an image within `max_image_bytes`); an https URL on a host of
NIGHTBATCH_MEDIA_ALLOWED_DOMAINS; and, for an image, an `s3://` object the tenant may read (tenancy/scope.py) or
a file id of the tenant's (`ReferenceChecks.check`). At most `max_images_per_request` images a line, counted
across every place, and at most `max_image_bytes_per_request` bytes of the images whose size is known here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from nightbatch.ids import is_file_id
from nightbatch.models.spec import MESSAGES_ENDPOINT, SCORE_ENDPOINTS
from nightbatch.settings import Settings
from nightbatch.settings.base import comma_list
from nightbatch.tenancy.scope import Scope, ScopeError, is_s3_uri
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.requests import echo
from nightbatch.validation.scoring import SCORE_PAIRS

IMAGE = "image"
# The parts' fields of OpenAI's wires that hold a media URL, and what they hold.
MEDIA_FIELDS = (("image_url", IMAGE), ("video_url", "video"), ("audio_url", "audio"))
# The lists a walk descends into: a message's or block's `content` (an Anthropic `tool_result`'s too), a Responses
# `function_call_output`'s `output`. Nothing else of a line is read as media (a tool call's arguments are not).
CONTAINERS = ("content", "output")
# The sides of a score or rerank line (each a list of, or one, `{"content": [parts]}` object or string).
SCORE_SIDES = (*dict.fromkeys(name for pair in SCORE_PAIRS for name in pair), "query")
MAX_DEPTH = 64  # lists and objects below `messages`: far deeper than any real conversation
# What vLLM is given as its allowed media domains when none are allowed: vLLM reads an empty list as "any host",
# and a URL's host never holds a space, so no URL matches this one.
NO_MEDIA_DOMAIN = "(none: data: URLs only)"
_HTTPS_HOST = re.compile(r"https://([^/:?#@]+)(?::443)?(?:[/?#]|\Z)")  # matched from the start; \Z: no newline


class ReferenceChecks(Protocol):
    """Who answers for the references a line makes to stored objects: the batch tenant's files at Validate
    (validation/file_images.py), the shard's tenant in the worker (gpu_worker/images.py)."""

    @property
    def scope(self) -> Scope | None:
        """The tenant's scope: which `s3://` images it may name (None: none here)."""

    def check(self, file_id: str, param: str) -> int:
        """A LineInvalid naming `param` unless the file is one this line may use as an image; else its size in
        bytes (0: not known here)."""


@dataclass(slots=True)
class MediaRef:
    """One reference: `holder[field]` is its value; `param` its path in the line."""

    holder: dict[str, Any]
    field: str
    param: str
    kind: str  # "image", "video", "audio"; an Anthropic block of another type: its type
    name: str  # the field a message names: image_url, video_url, audio_url, file_id, source
    anthropic: bool = False

    @property
    def value(self) -> Any:
        return self.holder.get(self.field)

    @property
    def by_reference(self) -> bool:
        """An image the worker fetches (an `s3://` object or a file id), not one the line holds or vLLM reads."""
        value = self.value
        return self.kind == IMAGE and isinstance(value, str) and (is_s3_uri(value) or is_file_id(value))

    def replace(self, data_url: str) -> None:
        """Puts the fetched image in the reference's place, in the shape the engine reads."""
        if self.anthropic:  # vLLM hands a url source's url to its media loader, which reads data: URLs
            self.holder.clear()
            self.holder.update(type="url", url=data_url)
        elif self.field == "file_id":  # vLLM reads an input_image's image_url only
            del self.holder["file_id"]
            self.holder["image_url"] = data_url
        else:
            self.holder[self.field] = data_url


def references(endpoint: str, body: dict[str, Any]) -> Iterator[MediaRef]:
    """Every media reference of a line's body for `endpoint`, in the order the line holds them."""
    if endpoint == MESSAGES_ENDPOINT:
        yield from _walk(body.get("messages"), "body.messages", True, 0)
    elif endpoint in SCORE_ENDPOINTS:
        for name in SCORE_SIDES:
            if name in body:
                yield from _walk(body[name], f"body.{name}", False, 0)
    else:
        for name in ("messages", "input"):
            yield from _walk(body.get(name), f"body.{name}", False, 0)


def _walk(node: Any, where: str, anthropic: bool, depth: int) -> Iterator[MediaRef]:
    if depth > MAX_DEPTH:
        raise LineInvalid("invalid_request", f"The request's content is nested more than {MAX_DEPTH} levels deep.",
                          where)
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _walk(item, f"{where}[{i}]", anthropic, depth + 1)
    elif isinstance(node, dict):
        yield from (_anthropic_refs if anthropic else _openai_refs)(node, where)
        for key in CONTAINERS:
            child = node.get(key)
            if isinstance(child, list):
                yield from _walk(child, f"{where}.{key}", anthropic, depth + 1)


def _openai_refs(part: dict[str, Any], where: str) -> Iterator[MediaRef]:
    if "file_id" in part and part.get("type") == "input_image":  # the Responses API's image by file id
        yield MediaRef(part, "file_id", f"{where}.file_id", IMAGE, "file_id")
        return
    for name, kind in MEDIA_FIELDS:
        ref = part.get(name)
        if isinstance(ref, dict):
            if ref.get("url") is not None:
                yield MediaRef(ref, "url", f"{where}.{name}.url", kind, name)
        elif ref is not None:
            yield MediaRef(part, name, f"{where}.{name}", kind, name)


def _anthropic_refs(block: dict[str, Any], where: str) -> Iterator[MediaRef]:
    source = block.get("source")
    if not isinstance(source, dict):
        return  # e.g. a search_result's source, a plain string vLLM never reads
    kind = block.get("type")
    kind = kind if isinstance(kind, str) else ""
    what = source.get("type")
    if what == "url":
        yield MediaRef(source, "url", f"{where}.source.url", kind, "source", anthropic=True)
    elif what == "file":
        yield MediaRef(source, "file_id", f"{where}.source.file_id", kind, "source", anthropic=True)
    elif kind == IMAGE:  # base64, which vLLM also assumes of a source of no (or another) type
        yield MediaRef(source, "data", f"{where}.source.data", kind, "source", anthropic=True)


def check_references(settings: Settings, endpoint: str, body: dict[str, Any],
                     files: ReferenceChecks | None) -> list[MediaRef]:
    """The line's media references, each checked (a LineInvalid naming its param for the first that fails);
    `files` answers for file ids and `s3://` images (None: neither is accepted here)."""
    refs = list(references(endpoint, body))
    if not refs:
        return refs
    v = settings.validation
    images = 0
    known: set[object] = set()  # the images counted in `total`: each file once, each inline image
    total = 0
    for n, ref in enumerate(refs):
        if ref.kind == IMAGE:
            images += 1
            if v.max_images_per_request and images > v.max_images_per_request:
                raise LineInvalid("too_many_images", f"The request has more than {v.max_images_per_request} "
                                  f"images; at most {v.max_images_per_request} are allowed per request.", ref.param)
        size = _check(settings, ref, files)
        key = ref.value if ref.by_reference else n
        if size and key not in known:
            known.add(key)
            total += size
            if v.max_image_bytes_per_request and total > v.max_image_bytes_per_request:
                raise LineInvalid("image_too_large", f"The request's images total about {total} bytes, over the "
                                  f"limit of {v.max_image_bytes_per_request} bytes per request (each image "
                                  "counted once).", ref.param)
    return refs


def _check(settings: Settings, ref: MediaRef, files: ReferenceChecks | None) -> int:
    """One reference's rule; the image's size in bytes when known here (inline, or a file's), else 0."""
    value = ref.value
    if ref.field == "file_id":
        if not ref.anthropic and ref.holder.get("image_url") is not None:
            raise LineInvalid("invalid_request", "An input_image takes 'image_url' or 'file_id', not both.",
                              ref.param)
        return _file(ref, files)
    if ref.field == "data":  # an Anthropic base64 source: the image itself
        return _inline(settings, ref, len(value) * 3 // 4 if isinstance(value, str) else 0)
    if isinstance(value, str) and value.startswith("data:"):
        return _inline(settings, ref, (len(value) - value.find(",") - 1) * 3 // 4)  # base64's size, within 2
    if ref.kind == IMAGE and is_s3_uri(value):  # fetched by the worker (gpu_worker/images.py)
        scope = files.scope if files is not None else None
        if scope is None:
            raise LineInvalid("invalid_value", "Images by s3:// URI are not accepted here: send the image as a "
                              "data: URL.", ref.param)
        try:
            scope.readable(value, ref.param)
        except ScopeError as e:
            raise LineInvalid(e.code or "invalid_value", e.message, ref.param) from None
        return 0
    if ref.kind == IMAGE and isinstance(value, str) and value.startswith("file-"):  # nightbatch's extension
        return _file(ref, files)
    check_media_url(settings, value, ref.name, ref.param)
    return 0


def _file(ref: MediaRef, files: ReferenceChecks | None) -> int:
    file_id = ref.value
    if ref.kind != IMAGE:
        raise LineInvalid("invalid_value", "Only images may be named by file id.", ref.param)
    if not is_file_id(file_id):
        raise LineInvalid("invalid_value", f"Invalid 'file_id': {echo(file_id)} is not a file id.", ref.param)
    if files is None:
        raise LineInvalid("invalid_value", "Images by file id are not accepted here: send the image as a data: URL.",
                          ref.param)
    return files.check(str(file_id), ref.param)


def _inline(settings: Settings, ref: MediaRef, size: int) -> int:
    if ref.kind != IMAGE:
        return 0
    if size > settings.validation.max_image_bytes:
        raise LineInvalid("image_too_large", f"The image is about {size} bytes, over the limit of "
                          f"{settings.validation.max_image_bytes} bytes per image.", ref.param)
    return size


def check_media_url(settings: Settings, url: object, name: str, param: str) -> None:
    """A media URL vLLM itself would fetch: only an https URL on an allowed host (a GPU worker fetching any URL a
    tenant names would reach its VPC and the instance metadata service)."""
    allowed = allowed_domains(settings.validation.media_allowed_domains)
    m = _HTTPS_HOST.match(url) if isinstance(url, str) else None
    if m is None or m.group(1).lower() not in allowed:
        raise LineInvalid(
            "invalid_value", f"Invalid '{name}.url': only data: URLs are accepted"
            + (f", or https URLs on {', '.join(sorted(allowed))}" if allowed else "") + ".", param)


@lru_cache(maxsize=16)
def allowed_domains(raw: str) -> frozenset[str]:
    """NIGHTBATCH_MEDIA_ALLOWED_DOMAINS (comma-separated hosts) as a set, parsed once per distinct value."""
    return frozenset(d.lower() for d in comma_list(raw))


def engine_media_domains(raw: str) -> list[str]:
    """The hosts vLLM may fetch media from (its `allowed_media_domains`): the allowed ones, or none at all."""
    return sorted(allowed_domains(raw)) or [NO_MEDIA_DOMAIN]
