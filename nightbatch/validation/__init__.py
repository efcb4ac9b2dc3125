"""Validation of batch input lines: line checks, request checks, scoring bodies."""
