"""`planning.plan.approved` messages -> deliberation tasks, or a precise reason to reject them."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..domain.models import STORY_FIELDS, Role, Task, flat_form
from ..names import TAG_CAUSATION, TAG_CORRELATION, TAG_EVENT_SEQ, TAG_PLAN, TAG_ROLE, TAG_STORY
from .models import EventEnvelope, PlanApproved, PlanningRejected, utc_now
from .streams import PLAN_APPROVED

MAX_MESSAGE_BYTES = 256 * 1024
# A dead letter keeps this much of the original (JSON escapes can grow text up to 6x, base64 4/3),
# at most this much of the reason, and headers up to these bounds; all of it well under the 1 MiB
# default max_payload. Size and sha256 always describe the whole original.
DEAD_LETTER_ORIGINAL_BYTES = 64 * 1024
DEAD_LETTER_REASON_CHARS = 2_000
DEAD_LETTER_HEADERS = 16
DEAD_LETTER_HEADER_CHARS = 256
MINIMAL_REASON_CHARS = 300
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")
# A \uD800-\uDFFF escape: JSON text may spell a lone surrogate, which no UTF-8 store accepts.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class InvalidEvent(ValueError):
    """The message cannot start deliberations; the text says why."""


# What a refusal's reason begins with (or holds), as a bounded class: the `reason` label of the
# refused-plans metric. Anything else names a field the schema refused.
_REFUSAL_CLASSES = (
    ("message is ", "too_large"),
    ("not JSON", "not_json"),
    ("not a JSON object", "not_json"),
    ("a string holds a lone", "not_json"),
    ("invalid envelope", "envelope"),
    ("event_type ", "event_type"),
    ("cannot be read", "unreadable"),
    ("tasks: task ids repeat", "duplicate_tasks"),
)


def refusal_class(reason: str) -> str:
    """The class of an `InvalidEvent`'s text: too_large, not_json, envelope, event_type,
    unreadable, duplicate_tasks, unprintable or invalid_field."""
    if "control or unprintable characters" in reason:
        return "unprintable"
    return next((cls for start, cls in _REFUSAL_CLASSES if reason.startswith(start)), "invalid_field")


class StreamMessage(BaseModel):
    """A message read from a stream by sequence."""

    model_config = ConfigDict(frozen=True)

    stream: str = Field(description="Stream name.")
    seq: int = Field(description="Stream sequence.")
    subject: str = Field(description="Subject.")
    data: bytes = Field(description="Body.")
    headers: dict[str, str] = Field(default_factory=dict, description="NATS headers.")
    msg_id: str | None = Field(default=None, description="Its Nats-Msg-Id, a hash when not UTF-8.")


class PlannedDeliberation(BaseModel):
    """One deliberation to run: its partition key, run key, job config and run tags."""

    model_config = ConfigDict(frozen=True)

    task_id: str = Field(description="Partition key.")
    run_key: str = Field(description="Idempotency key + task id: a replay never starts a second run.")
    task_config: dict = Field(description="The task's fields as the plan gave them: the run's config.")
    role: str = Field(description="Council role (the run queue limits per role).")
    story_id: str = Field(description="Story.")
    plan_id: str = Field(description="Plan.")
    correlation_id: str = Field(description="Correlation id of the planning event.")
    idempotency_key: str = Field(description="Idempotency key of the planning event.")
    stream_seq: int = Field(description="Stream sequence of the planning event.")

    def run_tags(self) -> dict[str, str]:
        return {
            TAG_ROLE: self.role,
            TAG_STORY: self.story_id,
            TAG_PLAN: self.plan_id,
            TAG_CORRELATION: self.correlation_id,
            TAG_CAUSATION: self.idempotency_key,
            TAG_EVENT_SEQ: str(self.stream_seq),
        }


def derived_task_id(plan_id: str, role: str, index: int | None = None) -> str:
    """A partition key from plan and role (and position in `tasks[]`), the same on every replay."""
    parts = [plan_id, role.lower()] + ([] if index is None else [str(index)])
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:8]
    readable = "-".join([_UNSAFE.sub("_", plan_id)[:80], *parts[1:]])
    return f"{readable}-{digest}"


def _reason(exc: ValidationError, at: str = "", flat: bool = False) -> str:
    """Each error as `path.field: message (got value)`, its path under `at` (e.g. `payload.tasks.0`);
    values of containers are left out. `flat`: a Task's errors, its constraints named as in its
    flat form (`rubric`, not `constraints.rubric`)."""
    parts = []
    for err in exc.errors():
        loc = (
            err["loc"][1:]
            if flat and err["loc"][:1] == ("constraints",) and len(err["loc"]) > 1
            else err["loc"]
        )
        where = ".".join([at] * bool(at) + [str(p) for p in loc]) or "payload"
        value = err.get("input")
        got = "" if isinstance(value, dict | list) or "missing" in err["type"] else f" (got {value!r:.80})"
        parts.append(f"{where}: {err['msg']}{got}")
    return "; ".join(parts)


def run_key(idempotency_key: str, task_id: str) -> str:
    """`{key}:{task id}` with `%` and `:` escaped in both parts, so no two pairs give one run key."""

    def escape(part: str) -> str:
        return part.replace("%", "%25").replace(":", "%3A")

    return f"{escape(idempotency_key)}:{escape(task_id)}"


def _parse(data: bytes) -> object:
    try:
        body = json.loads(data)
    except RecursionError as exc:
        raise InvalidEvent("not JSON this system can read: nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer over 4,300 digits
        raise InvalidEvent(f"not JSON: {exc}") from exc
    if _SURROGATE_ESCAPE.search(data):
        try:
            json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise InvalidEvent("a string holds a lone UTF-16 surrogate (a \\udXXX escape), not text") from exc
    return body


def _identifier(name: str, value: str) -> None:
    """Keys and ids become run keys and run tags in Dagster's storage: printable text only."""
    if not value.isprintable():
        raise InvalidEvent(f"{name}: control or unprintable characters are not allowed (got {value!r:.80})")


def _envelope(message: StreamMessage) -> tuple[EventEnvelope, bool]:
    """The message's envelope, wrapping a legacy flat payload in one; True when it was enveloped."""
    if len(message.data) > MAX_MESSAGE_BYTES:
        raise InvalidEvent(f"message is {len(message.data)} bytes, over the {MAX_MESSAGE_BYTES}-byte limit")
    body = _parse(message.data)
    if not isinstance(body, dict):
        raise InvalidEvent(f"not a JSON object: got {type(body).__name__}")
    if "payload" in body and "event_type" in body:
        try:
            envelope = EventEnvelope.model_validate(body)
        except ValidationError as exc:
            raise InvalidEvent(f"invalid envelope: {_reason(exc)}") from exc
        if envelope.event_type != PLAN_APPROVED:
            raise InvalidEvent(
                f"event_type {envelope.event_type!r} on {message.subject}, expected {PLAN_APPROVED}"
            )
        _identifier("idempotency_key", envelope.idempotency_key)
        _identifier("correlation_id", envelope.correlation_id)
        return envelope, True
    # Legacy flat payload: no envelope, so the key is the publisher's Nats-Msg-Id or the body's hash.
    key = (
        message.msg_id
        or "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]
    )
    _identifier("Nats-Msg-Id", key)
    return EventEnvelope(
        event_type=PLAN_APPROVED, idempotency_key=key, correlation_id=key, payload=body
    ), False


def plan_deliberations(message: StreamMessage) -> list[PlannedDeliberation]:
    """The deliberations an approved plan asks for; raises InvalidEvent naming what is wrong, for
    any message whatever its bytes (an unforeseen failure is an InvalidEvent too, never a crash)."""
    try:
        return _plan(message)
    except InvalidEvent:
        raise
    except Exception as exc:  # one message must never stop the sensor
        raise InvalidEvent(f"cannot be read: {type(exc).__name__}: {exc}"[:DEAD_LETTER_REASON_CHARS]) from exc


def _task(task_id: str, fields: dict[str, Any], at: str) -> Task:
    """The one validation of a planned task: the domain Task from its flat fields (errors under `at`)."""
    try:
        return Task.from_fields(task_id, fields)
    except ValidationError as exc:
        raise InvalidEvent(_reason(exc, at, flat=True)) from exc


def _planned_task(
    plan_id: str, index: int, given: dict[str, Any], story: dict[str, Any], at: str
) -> tuple[Task, dict[str, Any]]:
    """An explicit task of a plan (its flat form or the old system's shape) as the Task and the
    run's config: the fields the plan gave, in their flat form (a field it left out takes the code
    location's default, the launchpad config's, e.g. the deadline of DELIBERATION_TIMEOUT)."""
    own = {k: v for k, v in given.items() if k != "task_id"}
    named = [k for k in STORY_FIELDS if k in own]
    if named:
        raise InvalidEvent(f"{at}.{named[0]}: the plan's field, a task does not give its own")
    task_id = given.get("task_id")
    if task_id is None:  # derived from the role the task names (a role no council has: the Task says so)
        role = own.get("role")
        task_id = derived_task_id(
            plan_id, role if isinstance(role, str) and role in Role.__members__ else "", index
        )
    task = _task(task_id, {**own, **story}, at)
    given_fields = flat_form(own)  # the names the plan gave, in the flat form (valid: the task is)
    return task, {**{k: v for k, v in task.fields().items() if k in given_fields}, **story}


def _plan(message: StreamMessage) -> list[PlannedDeliberation]:
    envelope, enveloped = _envelope(message)
    try:
        plan = PlanApproved.model_validate(envelope.payload)
    except ValidationError as exc:
        raise InvalidEvent(_reason(exc, "payload" if enveloped else "")) from exc
    _identifier("story_id", plan.story_id)
    _identifier("plan_id", plan.plan_id)

    story = plan.model_dump(mode="json", include=set(STORY_FIELDS), exclude_defaults=True)
    story.update(story_id=plan.story_id, plan_id=plan.plan_id)
    if plan.tasks:
        at = "payload." if enveloped else ""
        tasks = [
            _planned_task(plan.plan_id, i, given, story, f"{at}tasks.{i}")
            for i, given in enumerate(plan.tasks)
        ]
    else:
        description = f"Implement plan {plan.plan_id} for story {plan.story_id}"
        tasks = []
        for role in dict.fromkeys(plan.roles):
            task_id, fields = (
                derived_task_id(plan.plan_id, role.value),
                {"description": description, "role": role.value, **story},
            )
            tasks.append((_task(task_id, fields, f"task {task_id}"), fields))

    planned = [
        PlannedDeliberation(
            task_id=task.task_id,
            run_key=run_key(envelope.idempotency_key, task.task_id),
            task_config=config,
            role=task.role.value,
            story_id=plan.story_id,
            plan_id=plan.plan_id,
            correlation_id=envelope.correlation_id,
            idempotency_key=envelope.idempotency_key,
            stream_seq=message.seq,
        )
        for task, config in tasks
    ]
    if len({p.task_id for p in planned}) < len(planned):
        raise InvalidEvent("tasks: task ids repeat within the plan")
    return planned


def _original(data: bytes) -> tuple[str | None, str | None]:
    """The first DEAD_LETTER_ORIGINAL_BYTES of the body: as text when the body is UTF-8, else base64."""
    kept = data[:DEAD_LETTER_ORIGINAL_BYTES]
    try:
        data.decode()
    except UnicodeDecodeError:
        return None, base64.b64encode(kept).decode()
    return kept.decode("utf-8", "ignore"), None  # "ignore" only drops a character cut in two


def rejection(message: StreamMessage, reason: str) -> PlanningRejected:
    """The dead-letter payload: where and why, the original's size and sha256, and the original
    itself cut to DEAD_LETTER_ORIGINAL_BYTES (text when UTF-8, else base64), so it stays sendable."""
    text, b64 = _original(message.data)
    headers = {
        k[:DEAD_LETTER_HEADER_CHARS]: v[:DEAD_LETTER_HEADER_CHARS]
        for k, v in list(message.headers.items())[:DEAD_LETTER_HEADERS]
    }
    return PlanningRejected(
        stream=message.stream,
        stream_sequence=message.seq,
        subject=message.subject,
        reason=reason[:DEAD_LETTER_REASON_CHARS],
        original_size=len(message.data),
        original_sha256=hashlib.sha256(message.data).hexdigest(),
        original_truncated=len(message.data) > DEAD_LETTER_ORIGINAL_BYTES,
        original_text=text,
        original_base64=b64,
        original_headers=headers,
    )


def minimal_rejection(message: StreamMessage, reason: str) -> PlanningRejected:
    """A dead letter small enough for any server: where, a short reason, size and sha256."""
    return PlanningRejected(
        stream=message.stream,
        stream_sequence=message.seq,
        subject=message.subject[:DEAD_LETTER_HEADER_CHARS],
        reason=reason[:MINIMAL_REASON_CHARS],
        original_size=len(message.data),
        original_sha256=hashlib.sha256(message.data).hexdigest(),
        original_truncated=True,
    )


def single_task_plan(
    task_id: str, task: dict, story_id: str, plan_id: str, approved_by: str, idempotency_key: str
) -> EventEnvelope:
    """An enveloped approved plan with one explicit task, given in its flat form (what
    `fleet deliberate` publishes)."""
    return EventEnvelope(
        event_type=PLAN_APPROVED,
        idempotency_key=idempotency_key,
        correlation_id=task_id,
        producer="fleet-cli",
        payload=PlanApproved(
            story_id=story_id,
            plan_id=plan_id,
            approved_by=approved_by,
            roles=[task["role"]],
            tasks=[{"task_id": task_id, **task}],
            approved_at=utc_now(),
        ).model_dump(mode="json", exclude_none=True),
    )
