"""What Validate and Plan hand the worker and Finalize: the segment index and its line-index packs, the shard
specs and manifest, and the one reader of a shard's lines."""
