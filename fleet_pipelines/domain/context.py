"""What a council knows of its story: the plan's story fields, `context.updated` events of the
story, and the decisions of the story's earlier deliberations. Bounded, each entry named by its
source, so the prompt and the UI say where every line came from.

Pure: the entries are gathered elsewhere (the `story_context` asset reads the CONTEXT stream and
Dagster's record of the story's decisions) and assembled here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_CONTEXT_CHARS = 6_000  # all entries of a story's context together
MAX_ENTRY_CHARS = 1_200  # one entry (a longer one is cut and says so)
MAX_WINNER_SUMMARY_CHARS = 600

ContextKind = Literal["story", "update", "decision"]


class ContextEntry(BaseModel):
    """One piece of a story's context and where it came from."""

    model_config = ConfigDict(frozen=True)

    kind: ContextKind = Field(
        description="story: the plan's story fields; update: a context event; "
        "decision: an earlier deliberation's decision."
    )
    source: str = Field(description="Where it came from: plan id, stream and sequence, task and run.")
    text: str


class StoryContext(BaseModel):
    """The bounded context of one story as the prompts show it; `dropped` entries did not fit."""

    model_config = ConfigDict(frozen=True)

    story_id: str | None = None
    entries: list[ContextEntry] = Field(default_factory=list)
    dropped: list[str] = Field(default_factory=list, description="Sources of entries left out for size.")

    def render(self) -> str:
        """The context as a prompt block; empty when there is none."""
        blocks = {"story": [], "update": [], "decision": []}
        for entry in self.entries:
            blocks[entry.kind].append(entry)
        parts = []
        if blocks["story"]:
            parts.append("Story:\n" + "\n".join(e.text for e in blocks["story"]))
        if blocks["update"]:
            parts.append(
                "Story context updates:\n" + "\n".join(f"- ({e.source}) {e.text}" for e in blocks["update"])
            )
        if blocks["decision"]:
            parts.append(
                "Decisions already taken for this story (stay consistent with them):\n"
                + "\n".join(f"- ({e.source}) {e.text}" for e in blocks["decision"])
            )
        return "\n\n".join(parts)


def _cut(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 14].rstrip() + " …[truncated]"


def story_entry(
    plan_id: str | None, title: str | None, description: str | None, criteria: Sequence[str]
) -> ContextEntry | None:
    """The plan's story fields as one entry; None when the plan carried none."""
    lines = []
    if title:
        lines.append(f"Title: {title}")
    if description:
        lines.append(f"Description: {description}")
    if criteria:
        lines.append("Acceptance criteria:\n" + "\n".join(f"- {c}" for c in criteria))
    if not lines:
        return None
    return ContextEntry(kind="story", source=f"plan {plan_id or '?'}", text="\n".join(lines))


def decision_text(winner_id: str | None, status: str, winner_summary: str, rationale: str) -> str:
    """How an earlier decision reads in a later prompt: who won, what it proposed, and why."""
    if not winner_id:
        return f"no winner ({status}): {rationale}"
    summary = _cut(" ".join(winner_summary.split()), MAX_WINNER_SUMMARY_CHARS)
    return f"{status}, winner {winner_id}: {summary} (why: {rationale})"


def assemble(
    story_id: str | None,
    story: ContextEntry | None,
    decisions: Sequence[ContextEntry],
    updates: Sequence[ContextEntry],
    max_chars: int = MAX_CONTEXT_CHARS,
) -> StoryContext:
    """The story's context within `max_chars`: the story fields first, then decisions, then context
    updates, each group newest first (entries arrive oldest first); what does not fit is dropped
    and named. Kept entries are shown in their original order."""
    candidates = [story] if story else []
    candidates += list(reversed(decisions)) + list(reversed(updates))
    kept: list[ContextEntry] = []
    dropped: list[str] = []
    used = 0
    for entry in candidates:
        entry = entry.model_copy(update={"text": _cut(entry.text, MAX_ENTRY_CHARS)})
        size = len(entry.text) + len(entry.source) + 8
        if used + size > max_chars:
            dropped.append(entry.source)
            continue
        kept.append(entry)
        used += size
    order = {id(e): i for i, e in enumerate(kept)}
    kept.sort(key=lambda e: (("story", "decision", "update").index(e.kind), -order[id(e)]))
    return StoryContext(story_id=story_id, entries=kept, dropped=dropped)
