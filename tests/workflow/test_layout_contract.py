"""The hand-off contract (nightbatch.layout) is the only code that names S3 keys or the objects between steps."""

from __future__ import annotations

import re
from pathlib import Path

from nightbatch import layout

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("nightbatch", "gpu_worker", "functions", "infra")
# A string literal that starts a key under one of our prefixes, or names a hand-off object or folder.
KEY_LITERAL = re.compile(
    r"""f?["'](?:files|batches|uploads)/"""
    r"""|acct-|_done\.json|progress-\{|manifest\.json|index\.json"""
    r"""|["'/](?:shards|results|segments|parts)/"""
)


def test_only_the_layout_module_names_s3_keys() -> None:
    offenders = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == ROOT / "nightbatch" / "layout.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if KEY_LITERAL.search(code):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == [], "S3 keys named outside nightbatch/layout.py:\n" + "\n".join(offenders)


def test_the_pattern_would_catch_a_key_literal() -> None:
    assert KEY_LITERAL.search('blobs.get_bytes(f"batches/{batch_id}/shards/{shard_id}.json")')
    assert KEY_LITERAL.search('key.startswith("acct-")')
    assert not KEY_LITERAL.search("layout.shard_key(batch_id, shard_id)")


def test_keys_and_names_agree_with_their_patterns() -> None:
    spec = layout.ShardSpec(batch_id="b", shard_id="00000", endpoint="/v1/chat/completions", model="m",
                            segments=[layout.segment_key("b", 0)], lines=3, est_tokens=9)
    assert layout.ShardSpec.model_validate_json(spec.model_dump_json()) == spec
    assert layout.shard_key("b", "00000").startswith(layout.batch_prefix("b"))
    assert layout.results_prefix("b", "00000").startswith(layout.all_results_prefix("b"))
    assert layout.ACCOUNTING_RE.match(layout.accounting_key("", "ab12"))
    assert layout.PROGRESS_RE.match(layout.progress_key("", "ab12"))
    assert layout.CHECKPOINT_RE.match(layout.checkpoint_key("", 3, "ab12"))
    assert layout.done_key("b", "1") == layout.results_prefix("b", "1") + layout.DONE_NAME
