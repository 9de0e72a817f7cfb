"""The scheduling figures as text and for metrics.json: one merge per line, the end-of-run table, the report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def format_row(row: Mapping[str, float], world: int) -> str:
    """One merge interval on one line: per worker b, s, n, p, updates (and idle when known)."""
    parts = []
    for rank in range(world):
        text = (f"w{rank}: b={row.get(f'b/{rank}', 0):.0f} s={row.get(f's/{rank}', 0):.1f}/s "
                f"n={row.get(f'n/{rank}', 0):.0f} p={row.get(f'p/{rank}', 0):.2f} "
                f"u={row.get(f'updates/{rank}', 0):.0f}")
        if f"idle/{rank}" in row:
            text += f" idle={row[f'idle/{rank}'] * 1000:.0f}ms"
        parts.append(text)
    merge = row.get("merge_time")
    return " | ".join(parts) + (f" | merge {merge * 1000:.0f}ms" if merge is not None else "")


def slowdown_note(slowdowns: list[float]) -> str:
    """The note :func:`summarize` adds for a simulated slowdown ("" when there is none)."""
    if all(f == 1.0 for f in slowdowns):
        return ""
    return "simulated heterogeneity: slowdown per worker " + ", ".join(f"x{f:g}" for f in slowdowns)


def _worker_totals(rows: list[Mapping[str, float]], rank: int) -> dict[str, float]:
    samples = sum(row.get(f"n/{rank}", 0.0) for row in rows)
    updates = sum(row.get(f"updates/{rank}", 0.0) for row in rows)
    last = rows[-1] if rows else {}
    return {"samples": samples, "updates": updates, "mean_batch": samples / max(updates, 1.0),
            "last_batch": last.get(f"b_next/{rank}", last.get(f"b/{rank}", 0.0)), "speed": last.get(f"s/{rank}", 0.0),
            "idle_s": sum(row.get(f"idle/{rank}", 0.0) for row in rows),
            "merge_s": sum(row.get(f"merge_time/{rank}", row.get("merge_time", 0.0)) for row in rows),
            "active": bool(last.get(f"active/{rank}", 1.0))}


def scheduler_report(rows: list[Mapping[str, float]], world: int, name: str, devices: list[str],
                     slowdowns: list[float], rows_are_merges: bool = False) -> dict[str, Any]:
    """The scheduling figures of a run for metrics.json: ``strategy``, ``merges`` (rows where ``rows_are_merges``, else
    the rows' ``averages/0``), ``simulated_slowdown`` and per worker its rank, device, samples, updates, batches, speed,
    idle and merge seconds and ``active``."""
    merges = len(rows) if rows_are_merges else int(sum(row.get("averages/0", 0.0) for row in rows))
    workers = []
    for rank in range(world):
        totals = _worker_totals(rows, rank)
        active = totals.pop("active")
        workers.append({"rank": rank, "device": devices[rank] if rank < len(devices) else "?",
                        **{key: round(float(value), 4) for key, value in totals.items()}, "active": active})
    return {"strategy": name, "merges": merges,
            "simulated_slowdown": slowdowns if any(s != 1.0 for s in slowdowns) else None, "workers": workers}


def summarize(rows: list[Mapping[str, float]], world: int, name: str = "adaptive", note: str = "") -> str:
    """End-of-run table per worker: samples, share, updates, mean batch, last speed, idle and merge time."""
    if not rows:
        return f"{name}: no scheduling rows recorded"
    lines = [f"scheduler {name}: {len(rows)} rows, {world} workers" + (f" ({note})" if note else ""),
             f"{'worker':>6} {'samples':>9} {'share':>6} {'updates':>8} {'mean b':>7} {'last b':>7} "
             f"{'speed/s':>9} {'idle s':>8} {'merge s':>8}"]
    totals = [_worker_totals(rows, rank) for rank in range(world)]
    everyone = sum(t["samples"] for t in totals) or 1.0
    for rank, t in enumerate(totals):
        lines.append(f"{rank:>6} {t['samples']:>9.0f} {t['samples'] / everyone:>6.2f} {t['updates']:>8.0f} "
                     f"{t['mean_batch']:>7.1f} {t['last_batch']:>7.0f} {t['speed']:>9.1f} {t['idle_s']:>8.2f} "
                     f"{t['merge_s']:>8.2f}" + ("" if t["active"] else "  (left out)"))
    return "\n".join(lines)
