"""The `nightbatch` command line: batches, keys, the doctor and the connection they share."""
