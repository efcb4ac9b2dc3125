"""The doctor's report for people: one line per check and per phase, remedies indented under what stalled."""

from __future__ import annotations

import textwrap

from nightbatch.cli.doctor.report import Check, Phase, Report

MARK = {"ok": "✓", "warn": "!", "stalled": "✗", "failed": "✗", "skipped": "-", "pending": "·"}
NAME_WIDTH = 14


def _seconds(value: float | None) -> str:
    return f"{value:7.1f}s" if value is not None else " " * 8


def _remedy(remedy: str) -> list[str]:
    if not remedy:
        return []
    return textwrap.wrap(remedy, width=110, initial_indent="      → ", subsequent_indent="        ",
                         break_on_hyphens=False, break_long_words=False)


def _check(c: Check) -> list[str]:
    return [f"  {MARK[c.status]} {c.name:<{NAME_WIDTH}} {c.detail}".rstrip(), *_remedy(c.remedy)]


def _phase(p: Phase) -> list[str]:
    detail = "not reached" if p.status == "pending" else p.detail
    line = f"  {MARK[p.status]} {p.name:<{NAME_WIDTH}} {_seconds(p.at)} {_seconds(p.took)}  {detail}"
    return [line.rstrip(), *_remedy(p.remedy)]


def render(report: Report) -> str:
    where = f" (stack {report.stack})" if report.stack else ""
    out = [f"nightbatch doctor: {report.base_url}{where}", ""]
    out += [line for c in report.checks for line in _check(c)]
    for probe in report.probes:
        out += ["", f"{probe.model} {probe.endpoint}  {probe.batch_id or ''}  {probe.status or ''}".rstrip(),
                f"    {'phase':<{NAME_WIDTH}} {'at':>8} {'took':>8}"]
        out += [line for p in probe.phases.values() for line in _phase(p)]
    failing = sum(c.status not in ("ok", "warn", "skipped") for c in report.checks) + sum(
        not p.passed for p in report.probes)
    out += ["", "All checks passed." if report.passed else f"{failing} problem(s) found: see the → lines above."]
    return "\n".join(out)
