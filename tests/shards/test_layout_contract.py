"""The hand-off contract (nightbatch.layout) is the only code that names S3 keys or the objects between steps."""

from __future__ import annotations

import re
from pathlib import Path

from nightbatch import layout
from nightbatch.files.sources import InputPart, InputSource
from nightbatch.shards.index import (
    LineIndex,
    SegmentEntry,
    SegmentIndex,
    line_index_line,
    packed_ref,
    read_line_indexes,
    read_segments,
    split_ref,
    write_line_index_pack,
    write_segment_index,
)
from nightbatch.shards.spec import ShardSpec, read_shard, shard_spec, write_shard
from nightbatch.wiring import Services
from tests.support.older_formats import line_index_key, read_line_index, segment_key, write_line_index

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("nightbatch", "gpu_worker", "functions", "infra")
# A string literal that starts a key under one of our prefixes, or names a hand-off object or folder (a module's
# path, nightbatch/shards/..., is no key).
KEY_LITERAL = re.compile(
    r"""f?["'](?:files|batches|uploads)/"""
    r"""|acct-|_done\.json|progress-\{|manifest\.json|index\.json"""
    r"""|(?:["']|(?<!nightbatch)/)(?:shards|results|segments|parts)/"""
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
    assert not KEY_LITERAL.search('"""Read through nightbatch/shards/lines.py."""')


def test_keys_and_names_agree_with_their_patterns() -> None:
    spec = ShardSpec(batch_id="b", shard_id="00000", endpoint="/v1/chat/completions", model="m",
                     segments=[segment_key("b", 0)], lines=3, est_tokens=9)
    assert ShardSpec.model_validate_json(spec.model_dump_json()) == spec
    assert layout.shard_key("b", "00000").startswith(layout.batch_prefix("b"))
    assert layout.results_prefix("b", "00000").startswith(layout.all_results_prefix("b"))
    assert layout.ACCOUNTING_RE.match(layout.accounting_key("", "ab12"))
    assert layout.PROGRESS_RE.match(layout.progress_key("", "ab12"))
    assert layout.CHECKPOINT_RE.match(layout.checkpoint_key("", 3, "ab12"))
    assert layout.done_key("b", "1") == layout.results_prefix("b", "1") + layout.DONE_NAME


# As 0.1.x wrote them (version 1: segments were copies of the lines).
V1_SHARD = (b'{"version":1,"batch_id":"b","shard_id":"00000","endpoint":"/v1/chat/completions","model":"m",'
            b'"segments":["batches/b/segments/000000.jsonl"],"lines":3,"est_tokens":9}')
V1_INDEX = b'[{"key":"batches/b/segments/000000.jsonl","lines":3,"est":9,"group":0}]'


def test_the_previous_version_of_each_record_still_reads(services: Services) -> None:
    blobs = services.adapters.blobs
    blobs.put_bytes(layout.shard_key("b", "00000"), V1_SHARD)
    blobs.put_bytes(layout.segment_index_key("b"), V1_INDEX)
    spec = read_shard(blobs, "b", "00000")
    assert spec is not None and (spec.version, spec.segments, spec.input) == (
        1, ["batches/b/segments/000000.jsonl"], None)
    index = read_segments(blobs, "b")
    assert index.version == 1 and index.input is None and index.segments[0].lines == 3
    # Plan over a version 1 index (Validate of 0.1.x) writes a version 1 shard.
    assert shard_spec(index, index.segments, batch_id="b", shard_id="00001").segments == spec.segments


def test_version_2_records_round_trip(services: Services) -> None:
    blobs = services.adapters.blobs
    source = InputSource(key=layout.file_key("file-x"), bytes=10,
                                parts=[InputPart(key=layout.part_key("u", "p1"), bytes=10)])
    entry = SegmentEntry(key=line_index_key("b", 0), lines=2, est=7, group=1, bytes=9)
    write_segment_index(blobs, "b", SegmentIndex(input=source, segments=[entry]))
    index = read_segments(blobs, "b")
    assert (index.version, index.input, index.segments) == (2, source, [entry])
    spec = shard_spec(index, index.segments, batch_id="b", shard_id="00000", model="m")
    assert (spec.version, spec.indexes, spec.segments, spec.lines, spec.est_tokens) == (2, [entry.key], [], 2, 7)
    write_shard(blobs, spec)
    assert read_shard(blobs, "b", "00000") == spec
    lines = LineIndex(runs=[(1, 0, 4), (3, 6, 9)], est=[3, 4])
    write_line_index(blobs, entry.key, lines)
    assert read_line_index(blobs, entry.key) == lines


def test_packed_line_indexes_are_read_by_range_neighbours_in_one_get(services: Services) -> None:
    blobs = services.adapters.blobs
    indexes = [LineIndex(runs=[(n, 10 * n, 10 * n + 9)], est=[n]) for n in range(1, 6)]
    key = layout.line_index_pack_key("b", 0)
    data, refs = b"", []
    for index in indexes:
        line = line_index_line(index)
        refs.append(packed_ref(key, len(data), len(data) + len(line)))
        data += line
    write_line_index_pack(blobs, key, data)
    own = line_index_key("b", 7)  # a segment of 0.1.x: an object of its own
    write_line_index(blobs, own, indexes[0])
    assert split_ref(refs[1]) == (key, len(data) // 5, 2 * len(data) // 5) and split_ref(own) is None
    gets: list[str] = []
    blobs.client.meta.events.register("before-parameter-build.s3.GetObject",
                                      lambda params, **_: gets.append(params["Key"]))
    order = [refs[0], refs[1], refs[2], own, refs[4], refs[3]]
    assert list(read_line_indexes(blobs, order)) == [indexes[0], indexes[1], indexes[2], indexes[0],
                                                           indexes[4], indexes[3]]
    # refs 0-2 are neighbours: one GET; the object of its own; 4 then 3 are not in order: one GET each.
    assert gets == [key, own, key, key]
    gets.clear()
    assert list(read_line_indexes(blobs, refs, max_read=len(data) // 2)) == indexes
    assert len(gets) == 3  # two indexes a GET at most
    assert read_line_index(blobs, refs[3]) == indexes[3]
