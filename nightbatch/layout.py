"""Every S3 key we make: the top-level prefixes, each hand-off object's key and the names that tell them apart in
a listing, and the tag and lifetime the bucket gives what is under them. Keys are built from ids we minted, never
from user strings; no other module names a key (a test greps for key literals elsewhere).

The objects themselves have owners of their own, each the one writer and reader of its type: the segment index,
line-index packs, shard specs and manifest (nightbatch/shards/), checkpoints' summaries (nightbatch/results/lines.py),
attempt records and done markers (nightbatch/batches/accounting.py), capacity decisions
(nightbatch/pipeline/capacity.py), progress samples (gpu_worker/checkpoints.py). Standard library only: infra/
reads the prefixes without the AWS adapters.
"""

from __future__ import annotations

import re

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


def line_index_pack_key(batch_id: str, n: int) -> str:
    """Many segments' LineIndexes, one JSON line each: a segment names its own by `packed_ref`."""
    return f"{segments_prefix(batch_id)}pack-{n:06d}.idx.jsonl"


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


def pace_key(batch_id: str, shard_id: str) -> str:
    """An endpoint shard's measured pace beside its results (nightbatch/shards/pace.py)."""
    return results_prefix(batch_id, shard_id) + "endpoint-pace.json"


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
