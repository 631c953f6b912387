"""The outbox: events that could not be published when they were made, kept until NATS takes them.

A run whose NATS is unreachable (down, restarting, a partition) keeps deliberating: each batch of
events it cannot publish is written here as one file, `<outbox>/<run_id>/<time_ns>.json`, in the
order they were made, and sent later with the same idempotency keys (`Nats-Msg-Id`), by the run
itself when NATS is back or by the outbox sensor, so that nothing is lost and JetStream drops any
copy. A file is written whole (to a temporary name, then renamed) and is only ever removed or
replaced by what is left of it, so a reader never sees half a batch. The outbox lives under the
storage path (a local folder or `s3://…`), beside the asset values.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from pydantic import BaseModel, Field
from upath import UPath

from .models import EventEnvelope, LegacyEvent

Event = tuple[str, EventEnvelope | LegacyEvent]
_SUFFIX = ".json"


class KeptEvent(BaseModel):
    """One event as kept: its subject and either our envelope or the old system's body."""

    subject: str = Field(description="The subject it is published on.")
    envelope: EventEnvelope | None = Field(default=None, description="Our enveloped event.")
    legacy: LegacyEvent | None = Field(default=None, description="An event in the old system's form.")

    @classmethod
    def of(cls, event: Event) -> KeptEvent:
        subject, body = event
        if isinstance(body, EventEnvelope):
            return cls(subject=subject, envelope=body)
        return cls(subject=subject, legacy=body)

    def event(self) -> Event:
        body = self.envelope if self.envelope is not None else self.legacy
        if body is None:
            raise ValueError(f"kept event on {self.subject} has no body")
        return self.subject, body


class KeptBatch(BaseModel):
    run_id: str
    events: list[KeptEvent]


class Outbox:
    """Events kept under `<base_path>`, one folder per run."""

    def __init__(self, base_path: str):
        self.root = UPath(base_path)

    def keep(self, run_id: str, events: Sequence[Event]) -> int:
        """Writes the events as one batch of the run; returns how many were kept."""
        if not events:
            return 0
        batch = KeptBatch(run_id=run_id, events=[KeptEvent.of(e) for e in events])
        folder = self.root / run_id
        folder.mkdir(parents=True, exist_ok=True)
        self._write(folder / f"{time.time_ns():020d}{_SUFFIX}", batch)
        return len(events)

    def batches(self, run_id: str | None = None) -> list[UPath]:
        """The kept batches (of one run, or of all), oldest first."""
        if not self.root.exists():
            return []
        folders = [self.root / run_id] if run_id else [p for p in self.root.iterdir() if p.is_dir()]
        found = [
            p for folder in folders if folder.exists() for p in folder.iterdir() if p.name.endswith(_SUFFIX)
        ]
        return sorted(found, key=lambda p: p.name)

    def runs(self) -> list[str]:
        """Runs with kept events."""
        return sorted({p.parent.name for p in self.batches()})

    def read(self, path: UPath) -> KeptBatch:
        return KeptBatch.model_validate_json(path.read_text())

    def pending(self, run_id: str | None = None) -> int:
        """How many events are kept (of one run, or of all)."""
        return sum(len(self.read(p).events) for p in self.batches(run_id) if p.exists())

    def done(self, path: UPath, left: Sequence[KeptEvent] = ()) -> None:
        """The batch at `path` is sent, or all but `left`, which stay kept in its place."""
        if left:
            self._write(path, KeptBatch(run_id=path.parent.name, events=list(left)))
            return
        with contextlib.suppress(FileNotFoundError):  # sent meanwhile by another flush
            path.unlink()
        with contextlib.suppress(OSError):  # the run's last batch: its folder goes, unless one came
            if not any(True for _ in path.parent.iterdir()):
                path.parent.rmdir()

    @staticmethod
    def _write(path: UPath, batch: KeptBatch) -> None:
        text = batch.model_dump_json()
        if path.protocol in ("", "file", "local"):  # a rename is atomic on a local filesystem
            part = path.with_name(path.name + ".part")
            part.write_text(text)
            part.rename(path)
        else:  # an object store writes an object whole
            path.write_text(text)
