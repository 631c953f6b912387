"""What the UI shows of asset values: tables and markdown, attached as metadata."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import dagster as dg

from ..domain.models import TurnResult

TURN_TABLE_COLUMNS = [
    "agent_id",
    "kind",
    "round",
    "target_agent_id",
    "status",
    "tokens_in",
    "tokens_out",
    "queue_ms",
    "first_token_ms",
    "latency_ms",
    "attempts",
    "error_type",
]


def _cell(value: object) -> str | float | None:
    if value is None or (isinstance(value, float) and value != value):  # None and NaN: empty
        return None
    return round(value, 3) if isinstance(value, float) else str(value)


def table(rows: Sequence[Mapping[str, object]], columns: Sequence[str]) -> dg.MetadataValue:
    """A Dagster table preview of some columns of some rows."""
    present = [c for c in columns if any(c in row for row in rows)]
    floats = {c for c in present if any(isinstance(row.get(c), float) for row in rows)}
    schema = dg.TableSchema(
        columns=[dg.TableColumn(c, "float" if c in floats else "string") for c in present]
    )
    records = [dg.TableRecord({c: _cell(row.get(c)) for c in present}) for row in rows]
    return dg.MetadataValue.table(records=records, schema=schema)


def turns_metadata(results: Sequence[TurnResult]) -> dict[str, dg.MetadataValue]:
    """The turns as a table, their text as markdown, and the tokens they produced."""
    rows = [r.model_dump(mode="json") for r in results]
    return {
        "turns": table(rows, TURN_TABLE_COLUMNS) if rows else dg.MetadataValue.text("none"),
        "preview": turns_markdown(results),
        "tokens_out": dg.MetadataValue.int(sum(r.tokens_out for r in results)),
    }


def turns_markdown(results: Sequence[TurnResult], limit_chars: int = 4_000) -> dg.MetadataValue:
    parts = []
    for r in results:
        target = f" on {r.target_agent_id}" if r.target_agent_id else ""
        head = f"### {r.agent_id} · {r.kind.value}{target} · round {r.round} · {r.status.value}"
        body = r.content[:limit_chars] if r.content else f"_{r.error_type}: {r.error}_"
        parts.append(f"{head}\n\n{body}")
    return dg.MetadataValue.md("\n\n---\n\n".join(parts) or "_no turns_")
