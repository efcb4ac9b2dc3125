"""Test support shared across test directories: test doubles only."""
