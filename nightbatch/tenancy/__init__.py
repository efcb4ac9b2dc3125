"""Tenancy: API keys, per-tenant limits, idempotency and usage."""
