"""Critique and revision time to first token, with reviews laid out as a continuation of their
proposal's conversation and sent to the llama.cpp slot that wrote it, against the layout before
(issue 25: the task and the one proposal in a fresh prompt, the slot left to llama.cpp).

    .venv/bin/python benchmarks/review_prefix.py [--trials 6] [--agents 3] [--json]

A llama.cpp server of `make dev`'s kind (SmolLM2-135M, 1 thread, 3 slots) is started for the run;
turns go through the real admission queue (dispatch/admission.py, in this process). Each trial
writes a council's proposals, then its critiques and revisions in one of the two layouts; the
layouts alternate trial by trial, so load on the machine hits both alike. Reported: median time
to first token per kind and layout, and the prompt tokens per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from fleet_pipelines import stack
from fleet_pipelines.dispatch.admission import EngineQueue, Submission
from fleet_pipelines.domain import prompts
from fleet_pipelines.domain.councils import CouncilSettings, build_council
from fleet_pipelines.domain.deliberation import critique_requests, proposal_requests, revision_requests
from fleet_pipelines.domain.models import Message, Role, Task, TurnKind, TurnRequest, TurnResult
from fleet_pipelines.llm.engine import EngineSettings
from fleet_pipelines.llm.local_server import MODEL_NAME

DESCRIPTION = "Write a Python function merge_intervals(intervals) that merges overlapping intervals."


def before_layout(request: TurnRequest, task: Task, council, current: dict[str, TurnResult]) -> TurnRequest:
    """The same turn as prompted before issue 25: a fresh system + user prompt holding the task and
    only the proposal under review (critique) or the author's own one and its critiques (revision)."""
    user = request.messages[-1].content
    author = request.target_agent_id or request.agent_id
    spec = next(a for a in council if a.agent_id == request.agent_id)
    if request.kind is TurnKind.CRITIQUE:
        ask = user.split("Critique the proposal above: ", 1)[1]
        text = f"Here is the proposal of {author}:\n\n{current[author].content}\n\nCritique it: {ask}"
    else:
        text = f"Your current proposal:\n\n{current[author].content}\n\n" + user.replace(
            "Your peers critiqued your proposal above:", "Your peers critiqued it:"
        )
    block = prompts.proposal_messages(task, spec)[1].content.split("\n\nWrite your proposal with")[0]
    messages = [
        Message(role="system", content=prompts.system_prompt(task, spec)),
        Message(role="user", content=f"{block}\n\n{text}"),
    ]
    return request.model_copy(update={"messages": messages})


async def run_phase(queue: EngineQueue, requests: list[TurnRequest], pin: bool) -> list[TurnResult]:
    queue.scheduler.pin_slots = pin
    ids = [
        f"{r.task_id}/{r.kind.value}/{r.agent_id}/{r.target_agent_id}/{time.monotonic_ns()}" for r in requests
    ]
    deadline = time.time() + 600  # one deadline for the phase, as a run gives its turns
    await queue.submit([Submission(i, r, deadline) for i, r in zip(ids, requests, strict=True)])
    await asyncio.gather(*(queue._turns[i].task for i in ids))  # each turn's run to its result
    return [queue._turns[i].result for i in ids]


async def trial(
    queue: EngineQueue, index: int, agents: int, after: bool, settings: CouncilSettings
) -> list[TurnResult]:
    task = Task(
        task_id=f"prefix-{index}", description=DESCRIPTION, role=Role.DEV, num_agents=agents, rounds=1
    )
    council = build_council(task.role, agents, settings)
    proposals = await run_phase(queue, proposal_requests(task, council, settings), pin=True)
    current = {p.agent_id: p for p in proposals if p.ok}
    critiques = critique_requests(task, council, settings, 1, current)
    if not after:
        critiques = [before_layout(r, task, council, current) for r in critiques]
    done = await run_phase(queue, critiques, pin=after)
    revisions = revision_requests(task, council, settings, 1, current, done)
    if not after:
        revisions = [before_layout(r, task, council, current) for r in revisions]
    return [*done, *await run_phase(queue, revisions, pin=after)]


async def main_async(args: argparse.Namespace) -> dict:
    logs = Path(tempfile.mkdtemp(prefix="fleet-prefix-"))
    port = stack.free_port()
    server = stack.start_model_server(logs, port, parallel=3)
    try:
        queue = EngineQueue(EngineSettings(base_url=f"http://127.0.0.1:{port}/v1", model=MODEL_NAME))
        assert queue.pin_slots, "llama.cpp's /props did not answer: slots cannot be pinned"
        settings = CouncilSettings()
        samples: dict[str, list[TurnResult]] = {"before": [], "after": []}
        for index in range(args.trials):
            after = index % 2 == 1
            samples["after" if after else "before"] += await trial(queue, index, args.agents, after, settings)
    finally:
        server.stop()
    report: dict = {"load_average": os.getloadavg()[0], "trials": args.trials, "agents": args.agents}
    for layout, results in samples.items():
        for kind in (TurnKind.CRITIQUE, TurnKind.REVISE):
            done = [r for r in results if r.kind is kind and r.ok]
            report[f"{kind.value}_{layout}"] = {
                "turns": len(done),
                "failed": sum(r.kind is kind and not r.ok for r in results),
                "ttft_ms_median": round(statistics.median(r.first_token_ms for r in done)) if done else None,
                "prompt_tokens_median": statistics.median(r.tokens_in for r in done) if done else None,
            }
    for kind in (TurnKind.CRITIQUE, TurnKind.REVISE):
        before, after = report[f"{kind.value}_before"], report[f"{kind.value}_after"]
        if before["ttft_ms_median"] and after["ttft_ms_median"] is not None:
            report[f"{kind.value}_ttft_after_over_before"] = round(
                after["ttft_ms_median"] / before["ttft_ms_median"], 2
            )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--trials", type=int, default=6, help="councils, layouts alternating (even: as many each)"
    )
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    print(json.dumps(report, indent=2) if args.json else "\n".join(f"{k}: {v}" for k, v in report.items()))


if __name__ == "__main__":
    main()
