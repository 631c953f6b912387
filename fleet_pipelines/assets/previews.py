"""What the UI shows of asset values: tables and markdown, attached as metadata."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import dagster as dg

from ..domain.context import StoryContext
from ..domain.councils import Convened
from ..domain.decision import Decision, rank
from ..domain.deliberation import current_versions
from ..domain.models import AgentSpec, TurnKind, TurnResult
from ..domain.prompts import feedback_block
from ..domain.scoring import CheckResult, ProposalScore
from ..domain.workspace import Workspace, extract_patch, rationale_of

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


def council_metadata(convened: Convened) -> dict[str, dg.RawMetadataValue]:
    """What the UI shows of the council a run used."""
    return {
        "council": dg.MetadataValue.json(convened.summary()),
        "councils_file": convened.file or "none (built-in councils)",
        "councils_file_version": convened.version or "none",
    }


def feedback_markdown(
    history: Sequence[TurnResult],
    proposals: Sequence[TurnResult],
    shown: Sequence[tuple[str, list[CheckResult]]],
) -> dg.MetadataValue:
    """What each author was shown of its own code's checks before revising, by the version checked."""
    versions = {t.content: t for t in [*proposals, *history] if t.kind is not TurnKind.CRITIQUE}
    sections = []
    for text, checks in shown:
        turn = versions.get(text)
        where = f"{turn.agent_id}, version of round {turn.round}" if turn else "a proposal"
        sections.append(f"### {where}\n\n{feedback_block(checks) or '_no check applied_'}")
    return dg.MetadataValue.md(
        "\n\n".join(sections) or "_no execution feedback (off for this role, or no review round)_"
    )


def scores_metadata(
    scored: Sequence[ProposalScore], history: Sequence[TurnResult], agents: Sequence[AgentSpec]
) -> dict[str, dg.MetadataValue]:
    """The ranking with every check's value, the leading proposal, the evidence and the critiques."""
    if not scored:
        return {"scores": dg.MetadataValue.text("no usable proposal")}
    finals = current_versions(history)
    ranking = rank(
        {s.agent_id: s.score for s in scored}, agents, {s.agent_id: s.value("judge") for s in scored}
    )
    by_agent = {s.agent_id: s for s in scored}
    rows = [
        {
            "rank": r.rank,
            "agent_id": r.agent_id,
            "score": by_agent[r.agent_id].score,
            **{f"check_{c.name}": c.value for c in by_agent[r.agent_id].checks},
            "code_blocks": by_agent[r.agent_id].code_blocks,
            "final_round": finals[r.agent_id].round,
        }
        for r in ranking
    ]
    top = finals[ranking[0].agent_id]
    check_columns = [f"check_{c.name}" for c in scored[0].checks]
    critiques = [
        f"### {c.agent_id} on {s.agent_id} (round {c.round})\n\n{c.content[:1_500]}"
        for s in scored
        for c in history
        if c.kind is TurnKind.CRITIQUE and c.ok and c.target_agent_id == s.agent_id
    ]
    return {
        "scores": table(rows, ["rank", "agent_id", "score", *check_columns, "code_blocks", "final_round"]),
        "winner_proposal": dg.MetadataValue.md(f"## {top.agent_id}\n\n{top.content}"),
        "evidence": dg.MetadataValue.json({s.agent_id: [c.model_dump() for c in s.checks] for s in scored}),
        "critiques_received": dg.MetadataValue.md("\n\n".join(critiques) or "_no critiques_"),
    }


def decision_metadata(decision: Decision) -> dict[str, dg.RawMetadataValue]:
    ranking = "\n".join(f"{r.rank}. {r.agent_id} — {r.score:.3f}" for r in decision.ranking)
    return {
        "status": decision.status.value,
        "winner": decision.winner_id or "none",
        "ranking": dg.MetadataValue.md(ranking or "_none_"),
        "reasons": dg.MetadataValue.md("\n".join(f"- {r}" for r in decision.reasons)),
        **(
            {
                "winning_patch": dg.MetadataValue.md(f"```diff\n{decision.winner_patch}```"),
                "base_commit": decision.base_commit,
            }
            if decision.winner_patch
            else {}
        ),
    }


def patches_markdown(finals: Mapping[str, TurnResult]) -> dg.MetadataValue:
    """Each final proposal's rationale and its patch as a diff block (a repository task)."""
    sections = []
    for agent_id, final in finals.items():
        patch = extract_patch(final.content)
        diff = f"```diff\n{patch}```" if patch else "_no unified diff_"
        sections.append(
            f"### {agent_id} (round {final.round})\n\n{rationale_of(final.content)[:1_500]}\n\n{diff}"
        )
    return dg.MetadataValue.md("\n\n".join(sections) or "_no proposal_")


def story_context_metadata(
    built: StoryContext, events_note: str, prior_decisions: int
) -> dict[str, dg.RawMetadataValue]:
    """The story context's sources, what was dropped to fit, and the text the prompts show."""
    rows = [{"kind": e.kind, "source": e.source, "chars": len(e.text)} for e in built.entries]
    return {
        "story_id": built.story_id or "none",
        "sources": table(rows, ["kind", "source", "chars"]),
        "context_events": events_note,
        "prior_decisions": prior_decisions,
        "dropped_for_size": dg.MetadataValue.md("\n".join(f"- {d}" for d in built.dropped) or "_none_"),
        "context": dg.MetadataValue.md(built.render() or "_no story context_"),
    }


def events_metadata(pending: int, unreachable: str | None) -> dict[str, dg.RawMetadataValue]:
    """Whether the run's events are all published, or how many wait in the outbox and why."""
    if not pending:
        return {"events_pending": 0, "events": "all published"}
    why = unreachable or "NATS unreachable"
    return {"events_pending": pending, "events": f"{pending} events pending: {why}; sent when it is back"}


def baseline_md(workspace: Workspace) -> str:
    base = workspace.baseline
    if base is None:
        return "_no baseline_"
    counts = f"{base.passed} passed, {base.failed} failing, {base.skipped} skipped" if base.counted else ""
    lines = [f"**{base.status}** {counts} — `{base.ran}` ({base.duration_s:.2f} s)"]
    if base.failing:
        lines.append("Failing: " + ", ".join(f"`{f}`" for f in base.failing))
    if base.first_failure:
        lines.append(f"```\n{base.first_failure}\n```")
    return "\n\n".join(lines)


def workspace_metadata(ready: Workspace) -> dict[str, dg.RawMetadataValue]:
    """A repository task's checkout: where it came from, its file index, baseline and dependencies."""
    rows = [f.model_dump() for f in ready.files]
    return {
        "repository": ready.url,
        "ref": ready.ref,
        "commit": ready.commit,
        "files": ready.file_count,
        "bytes": ready.total_bytes,
        "file_index": table(rows, ["path", "size", "language"]),
        "baseline": dg.MetadataValue.md(baseline_md(ready)),
        "skipped": dg.MetadataValue.md("\n".join(f"- {s}" for s in ready.skipped) or "_nothing_"),
        "dependencies": dg.MetadataValue.md("\n".join(f"- `{d}`" for d in ready.dependencies) or "_none_"),
        "test_dependencies": dg.MetadataValue.md(
            "\n".join(f"- `{d}`" for d in ready.test_dependencies)
            or (f"_left out_: {ready.test_dependencies_error}" if ready.test_dependencies_error else "_none_")
        ),
        "own_removed": dg.MetadataValue.md(
            ", ".join(f"`{n}`" for n in ready.own_removed) or "_none_: the tests import the repository's code"
        ),
        "generated": dg.MetadataValue.md("\n".join(f"- {g}" for g in ready.generated) or "_none_"),
        "path": dg.MetadataValue.path(ready.path),
    }
