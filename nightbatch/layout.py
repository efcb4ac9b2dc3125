"""The hand-off contract: every S3 key we make, and every record that crosses between steps.

Validate writes the segment index (each segment a line index: ranges of the input object, not a copy of its
lines), Plan the shard specs and the Map's manifest, the worker its
checkpoints, one accounting record per attempt and the done marker; Finalize reads them all. Each is written
and read only through this module (a test greps for key literals elsewhere). Keys are built from ids we
minted, never from user strings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, TypeAdapter

from nightbatch.files.sources import InputSource

if TYPE_CHECKING:  # infra/ reads the prefixes without the AWS adapters
    from nightbatch.storage import BlobStore as Blobs

# <seq:06d>-<attempt hex>.jsonl; the attempt part keeps a zombie attempt from overwriting another's object.
CHECKPOINT_RE = re.compile(r"^(\d{6,})-([0-9a-f]+)\.jsonl$")
DONE_NAME = "_done.json"
ACCOUNTING_RE = re.compile(r"^acct-([0-9a-f]+)\.json$")
# The dashboard's chart: cumulative counts over time, beside the checkpoints (gpu_worker.checkpoints).
PROGRESS_RE = re.compile(r"^progress-([0-9a-f]+)\.json$")
# The top-level prefixes; infra/ scopes IAM grants and lifecycle rules to them.
FILES_PREFIX = "files/"
BATCHES_PREFIX = "batches/"
UPLOADS_PREFIX = "uploads/"
# The object tag Validate sets on every object a batch's shards read: its input, or an Upload's parts and then
# the object composed from them (pipeline/validate.py, files/assembly.py), and the files its lines name as images
# (files/service.py: FileService.images). The GPU worker may read files/ and
# uploads/ only through it (an s3:ExistingObjectTag condition, infra/access.py), not every tenant's files.
INPUT_TAG_KEY = "nightbatch-input"
INPUT_TAGS = {INPUT_TAG_KEY: "batch"}
# The bucket's lifecycle deletes objects under files/ and batches/ this many days after they were written
# (infra/storage.py); a batch's input older than that by the batch's end is written again (pipeline/validate.py).
OBJECT_EXPIRY_DAYS = 31


# -- keys ----------------------------------------------------------------------------------------------------


def file_key(file_id: str) -> str:
    return f"{FILES_PREFIX}{file_id}"


def upload_prefix(upload_id: str) -> str:
    return f"{UPLOADS_PREFIX}{upload_id}/"


def parts_prefix(upload_id: str) -> str:
    return f"{upload_prefix(upload_id)}parts/"


def part_key(upload_id: str, part_id: str) -> str:
    return f"{parts_prefix(upload_id)}{part_id}"


def batch_prefix(batch_id: str) -> str:
    return f"{BATCHES_PREFIX}{batch_id}/"


def segments_prefix(batch_id: str) -> str:
    return f"{batch_prefix(batch_id)}segments/"


def segment_key(batch_id: str, n: int) -> str:
    return f"{segments_prefix(batch_id)}{n:06d}.jsonl"


def line_index_key(batch_id: str, n: int) -> str:
    """One segment's LineIndex, an object of its own (version 2; version 1 segments were copies of the lines, at
    segment_key). Validate now packs them: line_index_pack_key."""
    return f"{segments_prefix(batch_id)}{n:06d}.idx.json"


def line_index_pack_key(batch_id: str, n: int) -> str:
    """Many segments' LineIndexes, one JSON line each: a segment names its own by `packed_ref`."""
    return f"{segments_prefix(batch_id)}pack-{n:06d}.idx.jsonl"


def packed_ref(key: str, start: int, end: int) -> str:
    """A segment's reference to its LineIndex, the bytes [start, end) of the pack object `key` (a key of ours never
    holds '#'); a reference without '#' is an object of its own (line_index_key, or a version 1 segment)."""
    return f"{key}#{start}-{end}"


def split_ref(ref: str) -> tuple[str, int, int] | None:
    """(pack key, start, end) of a `packed_ref`; None for an object of its own."""
    key, sep, span = ref.partition("#")
    if not sep:
        return None
    start, _, end = span.partition("-")
    return key, int(start), int(end)


def segment_index_key(batch_id: str) -> str:
    return f"{segments_prefix(batch_id)}index.json"


def shard_key(batch_id: str, shard_id: str) -> str:
    return f"{batch_prefix(batch_id)}shards/{shard_id}.json"


def manifest_key(batch_id: str) -> str:
    return f"{batch_prefix(batch_id)}manifest.json"


def all_results_prefix(batch_id: str) -> str:
    return f"{batch_prefix(batch_id)}results/"


def results_prefix(batch_id: str, shard_id: str) -> str:
    return f"{all_results_prefix(batch_id)}{shard_id}/"


def checkpoint_key(prefix: str, seq: int, attempt: str) -> str:
    return f"{prefix}{seq:06d}-{attempt}.jsonl"


def is_checkpoint(prefix: str, key: str) -> bool:
    return CHECKPOINT_RE.fullmatch(key[len(prefix):]) is not None


def checkpoint_summary_key(checkpoint: str) -> str:
    """The summary beside a checkpoint (`<seq>-<attempt>.summary.json`); CHECKPOINT_RE does not match it."""
    return checkpoint.removesuffix(".jsonl") + ".summary.json"


def done_key(batch_id: str, shard_id: str) -> str:
    """The done marker beside the shard's results."""
    return results_prefix(batch_id, shard_id) + DONE_NAME


def accounting_key(prefix: str, attempt: str) -> str:
    return f"{prefix}acct-{attempt}.json"


CAPACITY_PREFIX = "capacity-"


def capacity_key(prefix: str, attempt: int) -> str:
    """Capacity's decision for one attempt of a shard (nightbatch.pipeline.capacity)."""
    return f"{prefix}{CAPACITY_PREFIX}{attempt:02d}.json"


def progress_key(prefix: str, attempt: str) -> str:
    return f"{prefix}progress-{attempt}.json"


def worker_settings_key(batch_id: str) -> str:
    """The deployment's settings for the batch's SageMaker jobs (nightbatch/settings/document.py)."""
    return f"{batch_prefix(batch_id)}worker-settings.json"


def training_output_prefix(batch_id: str) -> str:
    """Where SageMaker puts its (empty) model artifacts of the batch's training jobs."""
    return f"{batch_prefix(batch_id)}training-jobs/"


def output_key(batch_id: str) -> str:
    return f"{batch_prefix(batch_id)}output.jsonl"


def error_key(batch_id: str) -> str:
    return f"{batch_prefix(batch_id)}errors.jsonl"


def message_results_key(batch_id: str) -> str:
    """A Message Batch's results in Anthropic's shape, written once from its output and error files
    (nightbatch/messages/results.py), so the API can hand them out as an object, past its response limit."""
    return f"{batch_prefix(batch_id)}message-results.jsonl"


# -- records -------------------------------------------------------------------------------------------------


class SegmentEntry(BaseModel):
    """One segment Validate wrote: its key, how many lines, their estimated tokens (Plan groups by these).

    Version 2 (`bytes` > 0 or in an index with `input`): `key` references its LineIndex, a range of a pack
    (`packed_ref`) or an object of its own; version 1: a copy of the lines."""

    key: str
    lines: int
    est: int
    group: int = 0  # prefix group (nightbatch/pipeline/prefixes.py); 0: lines in input order
    bytes: int = 0  # input bytes the segment's ranges span (version 2)
    model: str = ""  # the lines' `body.model` (a served model or a LoRA adapter); "": the batch's model


class SegmentIndex(BaseModel):
    """`segments/index.json`. Version 2: the input and the segments (LineIndex keys). Version 1 was a bare JSON
    list of SegmentEntry whose keys were copies of the lines; `read_segments` reads both."""

    version: int = 2
    input: InputSource | None = None  # None: version 1
    segments: list[SegmentEntry] = []


class LineIndex(BaseModel):
    """A segment's lines as references into the input (version 2): `runs` of [first line number, start, end)
    byte ranges of the input, each a stretch of consecutive input lines of this segment (blank lines inside
    a run are skipped by the reader, as Validate skipped them), and `est`, the estimated tokens of each
    non-blank line in run order. The reader: nightbatch/pipeline/shard_lines.py.

    `ids` (each line's custom_id, in run order) and `counts` (each run's lines) are what Validate accepted, so
    a line is named, and ended, without its input: by Finalize when it got no result, by the worker when its
    input changed since (nightbatch/files/inputs.py). A run that has them holds no blank line and lies in one
    object of an in-place input, so its lines are numbered `first` to `first + count - 1`. A previous release's
    index has neither."""

    version: Literal[2] = 2
    runs: list[tuple[int, int, int]]
    est: list[int]
    ids: list[str] = []
    counts: list[int] = []

    def named(self) -> bool:
        return len(self.ids) == len(self.est) and len(self.counts) == len(self.runs)


class ShardSpec(BaseModel):
    """`shards/<shard_id>.json`, written by Plan, read by the worker and Finalize (through shard_lines).

    Version 2: `indexes` (LineIndex keys) into `input`. Version 1 (the previous release): `segments`, copies
    of the lines in segment_line form."""

    model_config = ConfigDict(extra="ignore")

    version: int = 1
    batch_id: str
    shard_id: str
    endpoint: str
    model: str
    segments: list[str] = []
    indexes: list[str] = []
    input: InputSource | None = None
    lines: int
    est_tokens: int = 0
    # Lines per `body.model` when they name more than `model` (its LoRA adapters); empty: all are `model`.
    models: dict[str, int] = {}
    # The batch's tenant: what the worker may read on its behalf (nightbatch/tenancy/scope.py). "": a spec
    # planned before specs named it; the worker reads the batch's tenant instead.
    tenant: str = ""


class ShardItem(BaseModel):
    """One item of the shard manifest that the Distributed Map iterates."""

    version: Literal[1] = 1
    batch_id: str
    shard_id: str
    # AWS: the ARN of the batch model's Batch job definition (empty locally).
    job_definition: str = ""
    # The shard's estimated tokens, so Capacity can weigh the remaining work from the manifest alone.
    est_tokens: int | None = None
    # The shard's lines (its spec's), so Finalize and the partial results read a spec only for its unrun lines.
    lines: int | None = None
    # Where Plan sends the shard first (the model's `gpuBackend`); with `both` Capacity may move it to SageMaker.
    backend: Literal["batch", "sagemaker"] = "batch"
    # The model's `gpuBackend` allows a move to SageMaker when Batch cannot place the shard.
    fallback: bool = False


class AttemptRecord(BaseModel):
    """`acct-<attempt>.json`: one attempt's GPU time, written whether or not it finished (Spot time counts)."""

    model_config = ConfigDict(extra="ignore")

    attempt: str = ""
    model_load_seconds: float = 0.0
    inference_seconds: float = 0.0
    idle_seconds: float = 0.0
    finished: bool = False
    phases: dict[str, Any] = {}  # nightbatch.phases: when each phase of the attempt ended
    # Where the attempt ran (gpu_worker/host.py), so Finalize prices it: AWS Batch at EC2 prices, SageMaker at
    # ml.* prices; the instance type and training job name when the host says (SageMaker does).
    backend: Literal["batch", "sagemaker"] = "batch"
    instance_type: str = ""
    training_job: str = ""
    shard_id: str = ""  # filled in on read, from the key


class DoneMarker(BaseModel):
    """`_done.json`: every line of the shard has a result. Token totals cover every attempt."""

    model_config = ConfigDict(extra="ignore")

    lines: int
    model_load_seconds: float = 0.0
    inference_seconds: float = 0.0
    idle_seconds: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    attempts: int = 1


class CheckpointSummary(msgspec.Struct, kw_only=True):
    """`<seq>-<attempt>.summary.json`, written by the worker after each checkpoint: what Finalize needs to count
    and place the checkpoint's lines without parsing them (nightbatch.results.lines.summarize_checkpoint).

    Line i of the checkpoint is its bytes [sum(lengths[:i]), sum(lengths[:i + 1])), compact JSON ended by a
    newline; custom_ids rather than digests, because our digest is keyed per process (nightbatch.ids). A reader
    that finds no summary, another version, or a size or ETag other than the checkpoint's parses the
    checkpoint: a summary is checked against the object it describes, not trusted.

    A msgspec struct, not a pydantic model: Finalize decodes one per checkpoint, a list of custom_ids and one of
    lengths per line, and msgspec does it in a third of the time (the JSON is the same; unknown fields ignored).
    """

    version: Literal[1] = 1
    size: int  # bytes of the checkpoint object it describes
    etag: str = ""  # its ETag, as the checkpoint's PUT answered (a previous release's summary has none)
    custom_ids: list[str]
    lengths: list[int]  # bytes of each line, its newline included
    failed: list[int] = []  # indices of the lines that are not successes (they go to the error file), ascending
    # The input line number of each line (the worker writes a checkpoint in input order, so they ascend): what
    # Finalize merges by for `output_order: "input"`. Empty: a previous release's summary.
    numbers: list[int] = []
    # Usage over the successful lines, as nightbatch.results.lines.Tally adds it up.
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    def consistent(self) -> bool:
        return (len(self.custom_ids) == len(self.lengths) and sum(self.lengths) == self.size
                and len(set(self.failed)) == len(self.failed) and all(0 <= i < len(self.lengths) for i in self.failed)
                and (not self.numbers or len(self.numbers) == len(self.lengths)))

    def numbered(self) -> bool:
        """Its lines carry their input line numbers: what Finalize's input-order merge streams."""
        return bool(self.numbers) and len(self.numbers) == len(self.lengths)

    def ascending(self) -> list[tuple[int, int]]:
        """The stretches [lo, hi) of its lines whose numbers ascend: one, or two once an attempt's last lines
        were appended to it (gpu_worker.checkpoints)."""
        cuts = [i for i, (a, b) in enumerate(pairwise(self.numbers), start=1) if a >= b]
        return list(pairwise([0, *cuts, len(self.numbers)]))


_SUMMARY = msgspec.json.Decoder(CheckpointSummary)
_SEGMENTS = TypeAdapter(list[SegmentEntry])
_MANIFEST = TypeAdapter(list[ShardItem])


# -- writers and readers -------------------------------------------------------------------------------------


def write_segment_index(blobs: Blobs, batch_id: str, index: SegmentIndex) -> None:
    blobs.put_bytes(segment_index_key(batch_id), index.model_dump_json().encode())


def read_segments(blobs: Blobs, batch_id: str) -> SegmentIndex:
    raw = blobs.get_bytes(segment_index_key(batch_id))
    if not raw:
        return SegmentIndex()
    if raw.lstrip()[:1] == b"[":  # version 1: a bare list
        return SegmentIndex(version=1, segments=_SEGMENTS.validate_json(raw))
    return SegmentIndex.model_validate_json(raw)


def write_line_index(blobs: Blobs, key: str, index: LineIndex) -> None:
    """A LineIndex as an object of its own (a previous release's Validate; tests)."""
    blobs.put_bytes(key, index.model_dump_json().encode(), content_type="application/json")


def line_index_line(index: LineIndex) -> bytes:
    """A LineIndex as a line of a pack (line_index_pack_key)."""
    return index.model_dump_json().encode() + b"\n"


def write_line_index_pack(blobs: Blobs, key: str, data: bytes) -> None:
    blobs.put_bytes(key, data, content_type="application/jsonl")


def read_line_index(blobs: Blobs, ref: str) -> LineIndex:
    """The LineIndex a segment references (its SegmentEntry.key): a range of a pack, or an object."""
    return next(read_line_indexes(blobs, [ref]))


def read_line_indexes(blobs: Blobs, refs: Iterable[str], *, max_read: int = 8 * 1024 * 1024) -> Iterator[LineIndex]:
    """The LineIndexes of `refs`, in order: neighbouring ranges of one pack (a shard's segments, mostly) read in
    one GET of up to `max_read` bytes, one LineIndex decoded at a time."""
    todo = iter(refs)
    ref = next(todo, None)
    while ref is not None:
        packed = split_ref(ref)
        if packed is None:
            raw = blobs.get_bytes(ref)
            if raw is None:
                raise FileNotFoundError(f"line index s3://{blobs.bucket}/{ref} does not exist")
            yield LineIndex.model_validate_json(raw)
            ref = next(todo, None)
            continue
        key, lo, hi = packed
        spans = [(lo, hi)]
        ref = next(todo, None)
        while ref is not None and (nxt := split_ref(ref)) is not None and nxt[0] == key and nxt[1] == hi and (
                nxt[2] - lo <= max_read):
            hi = nxt[2]
            spans.append((nxt[1], hi))
            ref = next(todo, None)
        data = blobs.get_range(key, lo, hi)
        if len(data) != hi - lo:
            raise ValueError(f"line index pack s3://{blobs.bucket}/{key} ends before byte {hi}")
        for start, end in spans:
            yield LineIndex.model_validate_json(data[start - lo:end - lo])


def shard_spec(index: SegmentIndex, segments: list[SegmentEntry], *, batch_id: str, shard_id: str,
               endpoint: str = "", model: str = "") -> ShardSpec:
    """The shard over `segments` of `index`: version 2 when the index points into the input; over a version 1
    index (Validate of the previous release), version 1, its segments being copies."""
    keys = [s.key for s in segments]
    spec = ShardSpec(batch_id=batch_id, shard_id=shard_id, endpoint=endpoint, model=model,
                     lines=sum(s.lines for s in segments), est_tokens=sum(s.est for s in segments))
    if index.input is not None:
        spec.version, spec.indexes, spec.input = 2, keys, index.input
    else:
        spec.segments = keys
    return spec


def write_shard(blobs: Blobs, spec: ShardSpec) -> None:
    blobs.put_bytes(shard_key(spec.batch_id, spec.shard_id), spec.model_dump_json().encode())


def read_shard(blobs: Blobs, batch_id: str, shard_id: str) -> ShardSpec | None:
    raw = blobs.get_bytes(shard_key(batch_id, shard_id))
    if raw is None:
        return None
    spec = ShardSpec.model_validate_json(raw)
    if spec.batch_id != batch_id or spec.shard_id != shard_id:
        raise ValueError(f"{shard_key(batch_id, shard_id)} describes {spec.batch_id}/{spec.shard_id}")
    return spec


def write_manifest(blobs: Blobs, batch_id: str, items: list[ShardItem]) -> str:
    key = manifest_key(batch_id)
    blobs.put_bytes(key, _MANIFEST.dump_json(items), content_type="application/json")
    return key


def read_manifest(blobs: Blobs, batch_id: str) -> list[ShardItem]:
    raw = blobs.get_bytes(manifest_key(batch_id))
    return _MANIFEST.validate_json(raw) if raw else []


def write_attempt(blobs: Blobs, prefix: str, record: AttemptRecord) -> None:
    blobs.put_bytes(accounting_key(prefix, record.attempt), record.model_dump_json().encode(),
                    content_type="application/json")


def attempt_keys(blobs: Blobs, prefix: str, listed: Iterable[str] | None = None) -> list[str]:
    """The attempt records under `prefix`; `listed`: its keys, if listed already (else listed here)."""
    keys = blobs.list_keys(prefix) if listed is None else (k for k in listed if k.startswith(prefix))
    return [k for k in keys if ACCOUNTING_RE.fullmatch(k.rsplit("/", 1)[-1])]


def read_attempts(blobs: Blobs, prefixes: Iterable[str], listed: Iterable[str] | None = None) -> Iterator[
        AttemptRecord]:
    keys = None if listed is None else list(listed)
    for prefix in prefixes:
        for key in attempt_keys(blobs, prefix, keys):
            rec = AttemptRecord.model_validate_json(blobs.get_bytes(key) or b"{}")
            rec.shard_id = key.rsplit("/", 2)[-2]
            yield rec


def write_checkpoint_summary(blobs: Blobs, checkpoint: str, summary: CheckpointSummary) -> None:
    blobs.put_bytes(checkpoint_summary_key(checkpoint), msgspec.json.encode(summary), content_type="application/json")


def read_checkpoint_summary(blobs: Blobs, checkpoint: str) -> CheckpointSummary | None:
    """None when there is none, or none this release can read (another version): the caller parses instead."""
    raw = blobs.get_bytes(checkpoint_summary_key(checkpoint))
    try:
        return None if raw is None else _SUMMARY.decode(raw)
    except msgspec.MsgspecError:
        return None


def write_done(blobs: Blobs, batch_id: str, shard_id: str, marker: DoneMarker) -> None:
    blobs.put_bytes(done_key(batch_id, shard_id), marker.model_dump_json().encode(),
                    content_type="application/json")
