"""Identifiers in OpenAI's shapes: `file-…`, `batch_…`, `upload_…`, `part_…`, `batch_req_…`, `req_…`."""

from __future__ import annotations

import hashlib
import re
import secrets
import string

_B62 = string.digits + string.ascii_letters
# Every file id we mint (new_file_id, derived_id("file-", ...)): a line's image may name one (docs/USER_BUCKETS.md),
# and only a string of this shape is ever made into a key (layout.file_key) from a line.
_FILE_ID = re.compile(r"file-[0-9A-Za-z]{1,64}")


def _base62(n_chars: int) -> str:
    return "".join(secrets.choice(_B62) for _ in range(n_chars))


def new_file_id() -> str:
    return f"file-{_base62(24)}"


def is_file_id(value: object) -> bool:
    return isinstance(value, str) and _FILE_ID.fullmatch(value) is not None


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(16)}"


def new_upload_id() -> str:
    return f"upload_{secrets.token_hex(12)}"


def new_part_id() -> str:
    return f"part_{secrets.token_hex(12)}"


def new_request_id() -> str:
    return f"req_{secrets.token_hex(16)}"


def derived_id(prefix: str, *parts: str, length: int = 24) -> str:
    """A stable id derived from its parts, so a re-run (e.g. Finalize twice) names the same object."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    n = int.from_bytes(digest, "big")
    out = []
    for _ in range(length):
        n, r = divmod(n, 62)
        out.append(_B62[r])
    return prefix + "".join(out)


def batch_request_id(batch_id: str, custom_id: str) -> str:
    # Hex rather than base62: this runs once per result line.
    return "batch_req_" + hashlib.blake2b(f"{batch_id}\x1f{custom_id}".encode(), digest_size=16).hexdigest()


def custom_id_digest(custom_id: str) -> int:
    """The fixed-size (64-bit) key Validate and Finalize keep per custom_id to find duplicates in one run.

    Python's own string hash: keyed SipHash with a key drawn per process (unless PYTHONHASHSEED pins it), so
    nobody can craft two custom_ids that collide (an unkeyed 64-bit hash can be attacked by brute force), and
    cheaper per line than blake2b. Process-local: never stored or compared across processes."""
    return hash(custom_id)


def custom_id_digests(custom_ids: list[str]) -> list[int]:
    """custom_id_digest of each, without a Python call per line (Finalize digests a checkpoint at a time)."""
    return list(map(hash, custom_ids))
