"""Domain objects <-> the DataFrames stored as asset values, and their UI previews."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import dagster as dg
import pandas as pd

from ..domain.decision import Decision, RankedProposal
from ..domain.models import Task, TurnResult
from ..domain.scoring import ProposalScore

TURN_TABLE_COLUMNS = [
    "agent_id",
    "kind",
    "round",
    "target_agent_id",
    "status",
    "tokens_in",
    "tokens_out",
    "latency_ms",
    "attempts",
    "error_type",
]


def _records(df: pd.DataFrame) -> list[dict]:
    return df.astype(object).where(df.notna(), None).to_dict("records")


def task_to_frame(task: Task) -> pd.DataFrame:
    row = task.model_dump(mode="json")
    row["constraints"] = json.dumps(row["constraints"])
    return pd.DataFrame([row])


def task_from_frame(df: pd.DataFrame) -> Task:
    row = _records(df)[0]
    row["constraints"] = json.loads(row["constraints"])
    return Task.model_validate(row)


def turns_to_frame(results: Iterable[TurnResult]) -> pd.DataFrame:
    rows = [r.model_dump(mode="json") for r in results]
    return pd.DataFrame(rows, columns=list(TurnResult.model_fields))


def turns_from_frame(df: pd.DataFrame) -> list[TurnResult]:
    return [TurnResult.model_validate(row) for row in _records(df)]


def scores_to_frame(
    scores: Sequence[ProposalScore], ranking: Sequence[RankedProposal], finals: dict[str, TurnResult]
) -> pd.DataFrame:
    ranks = {r.agent_id: r.rank for r in ranking}
    rows = []
    for s in scores:
        row: dict = {"agent_id": s.agent_id, "rank": ranks.get(s.agent_id), "score": s.score}
        for check in s.checks:
            row[f"check_{check.name}"] = check.value
        row["code_blocks"] = s.code_blocks
        row["evidence"] = json.dumps([c.model_dump() for c in s.checks])
        row["requirements"] = json.dumps([v.model_dump() for v in s.requirements])
        final = finals.get(s.agent_id)
        row["final_round"] = final.round if final else None
        row["content"] = final.content if final else ""
        rows.append(row)
    if not rows:  # no usable proposal: an empty frame that still has the columns readers use
        return pd.DataFrame(columns=["agent_id", "rank", "score", "evidence", "requirements", "content"])
    return pd.DataFrame(rows).sort_values("rank", na_position="last").reset_index(drop=True)


def decision_to_frame(task: Task, decision: Decision, winner_content: str) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "task_id": task.task_id,
                "story_id": task.story_id,
                "plan_id": task.plan_id,
                "status": decision.status.value,
                "winner_id": decision.winner_id,
                "winner_content": winner_content,
                "ranking": json.dumps([r.model_dump() for r in decision.ranking]),
                "reasons": json.dumps(decision.reasons),
                "quorum": decision.quorum,
                "usable_agents": decision.usable_agents,
                "failed_agents": json.dumps(decision.failed_agents),
                "timed_out_agents": json.dumps(decision.timed_out_agents),
            }
        ]
    )


def table(df: pd.DataFrame, columns: Sequence[str]) -> dg.MetadataValue:
    """A Dagster table preview of some columns of a frame."""
    present = [c for c in columns if c in df.columns]
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn(c, "float" if pd.api.types.is_float_dtype(df[c]) else "string") for c in present
        ]
    )
    records = [
        dg.TableRecord(
            {
                c: (None if v is None else (round(v, 3) if isinstance(v, float) else str(v)))
                for c, v in row.items()
            }
        )
        for row in _records(df[present])
    ]
    return dg.MetadataValue.table(records=records, schema=schema)


def turns_markdown(results: Sequence[TurnResult], limit_chars: int = 4_000) -> dg.MetadataValue:
    parts = []
    for r in results:
        target = f" on {r.target_agent_id}" if r.target_agent_id else ""
        head = f"### {r.agent_id} · {r.kind.value}{target} · round {r.round} · {r.status.value}"
        body = r.content[:limit_chars] if r.content else f"_{r.error_type}: {r.error}_"
        parts.append(f"{head}\n\n{body}")
    return dg.MetadataValue.md("\n\n---\n\n".join(parts) or "_no turns_")
