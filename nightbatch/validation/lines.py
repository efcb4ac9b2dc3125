"""Validation of batch input lines: stable codes, 1-based line numbers, OpenAI's wording where it has one."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from nightbatch.ids import custom_id_digest, custom_id_digests
from nightbatch.jsonl import UndecodableLine, loads
from nightbatch.models.spec import MESSAGES_ENDPOINT, SCORE_ENDPOINTS, ModelSpec, served_model
from nightbatch.settings import Settings
from nightbatch.validation.file_images import FileImages
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.line import RequestLine
from nightbatch.validation.media import check_references
from nightbatch.validation.requests import (
    check_messages,
    check_responses,
    check_template_kwargs,
    check_tools,
    echo,
    estimate_tokens,
    estimate_tokens_each,
)
from nightbatch.validation.scoring import check_scoring
from nightbatch.wire import BatchError

MAX_CUSTOM_ID = 512
# A batch's stored `errors` stop growing here (besides max_reported_errors), so 100 failed batches in one list
# response stay far under the ~6 MB a Lambda may answer, and the batch item under DynamoDB's 400 KB.
MAX_ERRORS_BYTES = 32 * 1024


CustomId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_CUSTOM_ID)]


# The plain line of an endpoint, decoded in one typed pass: only the fields declared here, each with a type
# msgspec checks (`forbid_unknown_fields`: any other field, or a value of another type, sends the line to the
# general path). So every value of a line the fast path takes is decoded, as `loads` would decode it or more
# strictly (numbers range-checked, strings checked for UTF-8 and lone surrogates), and the general path reads
# nothing here but the model and the output cap: what it checks closer (stream, tools, n, media parts, ...)
# is not declared.
class _Body(msgspec.Struct, forbid_unknown_fields=True, gc=False, kw_only=True):  # gc=False: no cycles
    model: str
    max_tokens: int | None = None
    max_completion_tokens: int | UnsetType | None = UNSET  # present, even null, it wins over max_tokens
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    user: str | None = None


class _Message(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    role: str
    content: str  # text only: a list of parts (media) takes the general path
    name: str | None = None


class _ChatBody(_Body, kw_only=True):
    messages: Annotated[list[_Message], msgspec.Meta(min_length=1)]
    logprobs: bool | None = None
    top_logprobs: int | None = None


class _CompletionBody(_Body, kw_only=True):
    prompt: str | list[str]
    echo: bool | None = None
    suffix: str | None = None


class _EmbeddingBody(_Body, kw_only=True):
    input: str | list[str]
    encoding_format: str | None = None
    dimensions: int | None = None


_CUSTOM_ID = operator.attrgetter("custom_id")
_MAX_TOKENS = operator.attrgetter("body.max_tokens")
_MAX_COMPLETION_TOKENS = operator.attrgetter("body.max_completion_tokens")
_DECODE_RUN = 256  # lines of a block decoded together (Validator.plain_block)


def _output_cap(body: _Body) -> int | None:
    """The output cap a plain body asks for: max_completion_tokens when present (even null), else max_tokens."""
    return body.max_tokens if body.max_completion_tokens is UNSET else body.max_completion_tokens


@functools.lru_cache(maxsize=64)  # a few ms to build; a deployment serves a few models
def _line_decoder(endpoint: str, model: str) -> Callable[[bytes], Any]:
    """The plain line of a batch: its url `endpoint`, its model `model` (both literals the decode checks),
    the body of its endpoint."""
    base = _BODIES[endpoint]
    body = msgspec.defstruct(f"_Plain{base.__name__}", [("model", Literal[model])],
                             bases=(base,), forbid_unknown_fields=True, gc=False, kw_only=True)
    line = msgspec.defstruct(f"_PlainLine{base.__name__}", [
        ("custom_id", CustomId), ("method", Literal["POST"]), ("url", Literal[endpoint]),
        ("body", body)], forbid_unknown_fields=True, gc=False)
    return msgspec.json.Decoder(line).decode


_BODIES: dict[str, type[_Body]] = {
    "/v1/chat/completions": _ChatBody,
    "/v1/completions": _CompletionBody,
    "/v1/embeddings": _EmbeddingBody,
}


@dataclass
class Validator:
    """Checks one line at a time; keeps only a fixed-size digest per custom_id (docs/ARCHITECTURE.md, decision 2)."""

    settings: Settings
    endpoint: str
    model: str | None = None
    spec: ModelSpec | None = None
    seen: set[int] = field(default_factory=set)
    # The batch tenant's files a line may name as an image (validation/file_images.py); None: no file ids here.
    file_images: FileImages | None = None
    _specs: dict[str, ModelSpec] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)  # valid lines per model, of the general path
    embedding_inputs: int = 0
    # Lines at least this long take the general path, which builds their body (Validate's prefix groups read
    # the body of long lines; decoding it twice would cost more than the fast path saves).
    fast_max_bytes: int = 1 << 62

    def __post_init__(self) -> None:
        # The custom_id(s) of the last line `plain` took and of the last block `plain_block` took: what the line
        # index records of each line (nightbatch.shards.index.LineIndex.ids).
        self.last_id = ""
        self.block_ids: list[str] = []
        # The batch's plain line (its model in it): built on the batch's first valid line, which sets the model.
        self._decode_line: Callable[[bytes], Any] | None = None
        self._embeddings = self.endpoint == "/v1/embeddings"
        self._default_out = self.settings.serving.default_max_tokens  # read per line: once here

    @property
    def models(self) -> dict[str, int]:
        """Valid lines per `body.model` (Plan groups by it; more than one: a multi-model or multi-adapter batch)."""
        counts = dict(self._counts)
        # Every valid line leaves one digest in `seen`; those the general path did not count are the fast
        # path's, all of the batch's model (one model costs no count per line).
        plain = len(self.seen) - sum(counts.values())
        if plain and self.model is not None:
            counts[self.model] = counts.get(self.model, 0) + plain
        return counts

    def check(self, number: int, data: bytes | None, size: int) -> RequestLine:
        if data is not None:
            est = self.plain(data)
            if est:
                assert self.model is not None
                return RequestLine(number, None, None, est, data, self.model)
        return self.general(number, data, size)

    def general(self, number: int, data: bytes | None, size: int) -> RequestLine:
        """`check` of a line `plain` did not take (Validate has tried it already): every check, on the
        general decode, and the error of the first that fails."""
        req = self._check(number, data, size)
        self._counts[req.model] = self._counts.get(req.model, 0) + 1
        return req

    def plain(self, data: bytes) -> int:
        """The estimated tokens of a plain line of the batch's model (the types above, one typed decode, each
        field read once), checked as the general path checks it and recorded as valid (its custom_id seen);
        0 leaves the line unrecorded for `general`, which words any error. Validate calls this first for every
        line: a valid plain line costs it nothing else."""
        decode = self._decode_line
        if decode is None or len(data) >= self.fast_max_bytes:
            return 0
        try:
            line = decode(data)
        except (msgspec.MsgspecError, RecursionError):
            return 0  # another line, another model or url, or a refusal: the general path words it
        body = line.body
        inputs = 0
        if self._embeddings:
            inputs = len(body.input) if isinstance(body.input, list) else 1
            cap = self.settings.validation.max_embedding_inputs_per_request
            if not body.input or (cap and inputs > cap) or (
                    self.embedding_inputs + inputs > self.settings.validation.max_embedding_inputs):
                return 0
            est = estimate_tokens(len(data))
        else:
            out = _output_cap(body)
            est = estimate_tokens(len(data)) + (out if out is not None and out > 0 else self._default_out)
        seen = self.seen
        known = len(seen)
        seen.add(custom_id_digest(custom_id := line.custom_id))
        if len(seen) == known:
            return 0  # a duplicate: reported by the general path
        self.last_id = custom_id
        if inputs:
            self.embedding_inputs += inputs
        return est

    def plain_block(self, lines: list[bytes], sizes: list[int]) -> list[int] | None:
        """`plain` of every line of a block (nightbatch.jsonl.LineBlock, its lines without a CR), with no
        Python code run per line but an estimate: their estimated tokens if each is a plain line of the
        batch's model that `plain` takes, their custom_ids recorded; else None, nothing recorded, and the
        caller reads the block line by line. The decoder of the batch's plain line checks its url and model as
        literals, so one typed decode, mapped over the block, checks each line as `plain` does."""
        decode = self._decode_line
        if decode is None or self._embeddings or not lines or max(sizes) >= self.fast_max_bytes or (
                max(sizes) > self.settings.validation.max_line_bytes):
            return None
        custom_ids: list[str] = []
        max_tokens: list[int | None] = []
        max_completion_tokens: list[int | UnsetType | None] = []
        try:
            # A few hundred lines at a time: thousands of decoded lines alive at once would have the garbage
            # collector walk them again and again (their lists are tracked), which costs more than the decode.
            for at in range(0, len(lines), _DECODE_RUN):
                decoded = list(map(decode, lines[at:at + _DECODE_RUN]))
                custom_ids += map(_CUSTOM_ID, decoded)
                max_tokens += map(_MAX_TOKENS, decoded)
                max_completion_tokens += map(_MAX_COMPLETION_TOKENS, decoded)
        except (msgspec.MsgspecError, RecursionError):
            return None
        digests = custom_id_digests(custom_ids)
        seen = self.seen
        if not seen.isdisjoint(digests):
            return None  # a duplicate of an earlier line (or two custom_ids of one digest): `general` reports it
        known = len(seen)
        seen.update(digests)
        if len(seen) - known < len(digests):  # two lines of the block share one: none was in `seen` before
            seen.difference_update(digests)
            return None
        self.block_ids = custom_ids
        # `plain`'s estimate, _output_cap inlined (a call per line was a third of plain_block's profiled CPU): one
        # cap for the whole block (the common batch: no max_completion_tokens, one max_tokens) costs one addition.
        caps = max_tokens if max_completion_tokens.count(UNSET) == len(lines) else [
            m if c is UNSET else c for m, c in zip(max_tokens, max_completion_tokens, strict=True)]
        out = self._default_out
        if caps.count(caps[0]) == len(caps):
            return estimate_tokens_each(sizes, plus=cap if (cap := caps[0]) is not None and cap > 0 else out)
        return [est + (cap if cap is not None and cap > 0 else out)
                for est, cap in zip(estimate_tokens_each(sizes), caps, strict=True)]

    def _check(self, number: int, data: bytes | None, size: int) -> RequestLine:
        s = self.settings
        if data is None:
            raise LineInvalid("line_too_long", f"Line {number} is {size} bytes, over the limit of "
                              f"{s.validation.max_line_bytes} bytes per line.")
        try:
            obj = loads(data)
        except UndecodableLine as e:
            raise LineInvalid(e.code, e.message) from None
        if not isinstance(obj, dict):
            raise LineInvalid("invalid_json_line", "This line is not a JSON object.")
        for name in ("custom_id", "method", "url", "body"):
            if name not in obj:
                raise LineInvalid("missing_required_parameter", f"Missing required parameter: '{name}'.", name)
        custom_id = obj["custom_id"]
        if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
            raise LineInvalid("invalid_request", f"'custom_id' must be a non-empty string of at most "
                              f"{MAX_CUSTOM_ID} characters.", "custom_id")
        if obj["method"] != "POST":
            raise LineInvalid("invalid_method", f"Invalid method {echo(obj['method'])}: only 'POST' is supported.",
                              "method")
        if obj["url"] != self.endpoint:
            raise LineInvalid("invalid_url", "The URL provided for this request does not match the batch "
                              f"endpoint '{self.endpoint}'.", "url")
        body = obj["body"]
        if not isinstance(body, dict):
            raise LineInvalid("invalid_request", "'body' must be a JSON object.", "body")
        est = self._check_body(body, len(data))
        digest = custom_id_digest(custom_id)
        if digest in self.seen:
            raise LineInvalid("duplicate_custom_id", f"The custom_id '{custom_id}' for this request is a "
                              "duplicate of another request. The custom_id parameter must be unique for each "
                              "request in a batch.", "custom_id")
        self.seen.add(digest)
        return RequestLine(number, custom_id, body, est, data, body["model"])

    def _check_model(self, model: str) -> ModelSpec:
        known = self._specs.get(model)
        if known is not None:
            return known
        models = self.settings.serving.models
        spec = served_model(models, model)
        if spec is None or not spec.serves(self.endpoint):
            served = ", ".join(name for m in models if m.serves(self.endpoint)
                               for name in (m.name, *m.lora_modules))
            raise LineInvalid("model_not_found", f"The provided model {echo(model)} is not supported by the Batch "
                              f"API for {self.endpoint}. Served models: {served or 'none'}.", "body.model")
        self._specs[model] = spec
        return spec

    def _may_mix(self, spec: ModelSpec) -> bool:
        """Another `model` than the batch's first line's: on a deployment that allows multi-model batches,
        or an adapter of the same served model (or that model itself), which the same engine serves."""
        return self.settings.validation.multi_model_batches or (self.spec is not None and spec.name == self.spec.name)

    def _check_body(self, body: dict[str, Any], line_bytes: int) -> int:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise LineInvalid("invalid_request", "Model parameter is required.", "body.model")
        # The batch's model was checked on its first line.
        spec = self.spec if model == self.model and self.spec is not None else self._check_model(model)
        if self.model is None:
            self.model, self.spec = model, spec
            if self.endpoint in _BODIES:
                self._decode_line = _line_decoder(self.endpoint, model)
        elif model != self.model and not self._may_mix(spec):
            raise LineInvalid("mismatched_model", f"The model {echo(model)} for this request does not match the "
                              "rest of the batch. Each batch must contain requests for a single model.",
                              "body.model")
        if body.get("stream"):
            raise LineInvalid("streaming_unsupported", "Streaming is not supported in the Batch API.",
                              "body.stream")
        max_out = body.get("max_completion_tokens", body.get("max_tokens"))
        out = max_out if isinstance(max_out, int) and max_out > 0 else self.settings.serving.default_max_tokens
        # Every image (video, audio) the line names, on every wire, at any depth (validation/media.py).
        check_references(self.settings, self.endpoint, body, self.file_images)
        if self.endpoint == "/v1/chat/completions":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise LineInvalid("invalid_request", "Messages parameter is required.", "body.messages")
            check_tools(spec, body)
            check_template_kwargs(body)
            return estimate_tokens(line_bytes) + out * _choices(self.settings, body)
        if self.endpoint == MESSAGES_ENDPOINT:
            return estimate_tokens(line_bytes) + check_messages(spec, body)
        if self.endpoint == "/v1/responses":
            out = check_responses(spec, body, self.settings.serving.default_max_tokens)
            return estimate_tokens(line_bytes) + out
        if self.endpoint in SCORE_ENDPOINTS:
            return check_scoring(self.settings, spec, self.endpoint, body, line_bytes)
        if self.endpoint == "/v1/completions":
            if "prompt" not in body:
                raise LineInvalid("invalid_request", "Prompt parameter is required.", "body.prompt")
            return estimate_tokens(line_bytes) + out * _choices(self.settings, body)
        inputs = body.get("input")
        if inputs is None or inputs == "" or inputs == []:
            raise LineInvalid("invalid_request", "Input parameter is required.", "body.input")
        n = len(inputs) if isinstance(inputs, list) and inputs and not isinstance(inputs[0], int) else 1
        cap = self.settings.validation.max_embedding_inputs_per_request
        if cap and n > cap:
            raise LineInvalid("too_many_inputs", f"This request has {n} inputs; at most {cap} are allowed per "
                              "embeddings request.", "body.input")
        self.embedding_inputs += n
        if self.embedding_inputs > self.settings.validation.max_embedding_inputs:
            raise LineInvalid("too_many_inputs", "The batch has more than "
                              f"{self.settings.validation.max_embedding_inputs} embedding inputs across its requests.",
                              "body.input")
        return estimate_tokens(line_bytes)


def _choices(settings: Settings, body: dict[str, Any]) -> int:
    """How many completions one request asks for: `n` (and `best_of`, which the engine generates and then
    discards) multiply the GPU work, so they multiply the token estimate the queue limits count."""
    if "n" not in body and "best_of" not in body:
        return 1  # the common line: checked without a call per parameter
    n, best_of = _choices_param(body, "n"), _choices_param(body, "best_of")
    cap = settings.validation.max_choices_per_request
    if cap and max(n, best_of) > cap:
        name = "n" if n >= best_of else "best_of"
        raise LineInvalid("invalid_value", f"Invalid '{name}': {max(n, best_of)}. At most {cap} completions per "
                          "request on this deployment.", f"body.{name}")
    return max(n, best_of)


def _choices_param(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if value is None:
        return 1
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise LineInvalid("invalid_value", f"Invalid '{name}': expected an integer of at least 1.", f"body.{name}")
    return value


def line_error(number: int | None, err: LineInvalid) -> BatchError:
    code, message, param = err.error
    return BatchError(code=code, message=message, param=param, line=number)
