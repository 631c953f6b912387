"""The same-work yardstick of benchmarks/load.py: what the engine was asked, recorded on its way
there, then replayed straight at the same engine with nothing of the product in between.

`Recorder` is an HTTP pass-through in front of the engine (the product's FLEET_LLM_BASE_URL points
at it): it forwards every request, with a sampling seed of its own content added (`seeded`), and
keeps, for each chat completion, its body (messages, sampling, `max_tokens`, llama.cpp's
`id_slot`), when it was sent, its first token and its end, and the reply's text and token counts.
Which earlier turns a request reads is found from the text: a request reads every earlier reply
that its messages quote.

`replay` sends the recorded bodies again with a minimal driver: each request the moment every
request it reads has finished, at most `slots` at once (the engine's slot count), earliest
recorded first; a request pinned to a slot (`id_slot`) waits for that slot, as the product's
admission queue does. Its wall time over the product's is `goodput_same_work`.

Each request is made to decode as many tokens as the product's reply did (`same_work_body`): the
model samples another text each time, and a replay whose replies run longer or shorter than the
product's is other work (two runs' replays differed by 113 s while their products differed by
29 s). A free-text request gets `max_tokens` = the product's completion tokens, `ignore_eos` and
no stop strings; a request under a JSON schema or with tools keeps its constraint (its grammar
has to end where the schema does), capped at the product's count. `work_match` in load.py's
summary is the replay's completion tokens over the product's.

Both clients open a connection per request (`force_close`): llama.cpp's server answers a streamed
completion with `Keep-Alive: timeout=5, max=100` and then closes the connection right after the
last chunk, so a pooled connection reused at once (a request sent the moment the one it reads
ended, which is how the replay sends) is written into a closing socket and fails.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
import zlib
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

CHAT = "/v1/chat/completions"


@dataclass
class Call:
    """One chat completion as the engine saw it."""

    body: dict
    sent: float  # time.time()
    first_token: float | None = None
    ended: float | None = None
    text: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    reads: list[int] = field(default_factory=list)  # indexes of the earlier calls it quotes

    @property
    def kind(self) -> str:
        """propose / critique / revise / judge, from the layout domain/prompts.py and scoring give
        each: a judge turn asks for JSON, a proposal is a fresh two-message prompt, a revision
        answers the critiques."""
        messages = self.body.get("messages", [])
        if self.body.get("response_format"):
            return "judge"
        if len(messages) <= 2:
            return "propose"
        return "revise" if messages[-1]["content"].startswith("Your peers critiqued") else "critique"

    @property
    def service_s(self) -> float:
        return (self.ended or self.sent) - self.sent

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent


async def _read_stream(response: aiohttp.ClientResponse, call: Call, forward=None) -> None:
    """Reads an OpenAI server-sent-event stream into `call` (first token, text, usage)."""
    buffer = b""
    async for chunk in response.content.iter_any():
        if forward is not None:
            await forward(chunk)
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage")
            if usage:
                call.tokens_in, call.tokens_out = (
                    usage.get("prompt_tokens", 0),
                    usage.get("completion_tokens", 0),
                )
            for choice in event.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    call.first_token = call.first_token or time.time()
                    call.text += text
    call.ended = time.time()


def seeded(body: dict) -> dict:
    """The request with a sampling seed of its own content, unless it names one: llama.cpp seeds
    sampling per request, so the same prompt samples the same way in every run. Its logits may
    still differ by rounding: a prompt that extends a slot's cached prefix (a revision in its
    proposal's slot), or one prefilled beside other slots' requests, is computed in other chunks
    than in another run, and a near-tie (most often in a greedy judge) can flip its reply. At K=4,
    2 agents, 0 rounds, 1 to 5 of 16 replies differed between runs (docs/benchmarks.md, issue 43):
    `load.py`'s `work_digest` says whether two runs did the same work, `--calls` which replies did
    not."""
    if "seed" in body:
        return body
    content = json.dumps(body.get("messages", []), sort_keys=True).encode()
    return {**body, "seed": zlib.crc32(content)}


class Recorder:
    """The pass-through: `start()` returns its base URL (…/v1); `calls` fills as the product runs;
    each chat completion goes on `seeded` (above)."""

    def __init__(self, engine_url: str):
        self.upstream = engine_url.rstrip("/").removesuffix("/v1")
        self.calls: list[Call] = []
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> str:
        ready = threading.Event()
        port: list[int] = []

        async def serve() -> None:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._forward)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port.append(site._server.sockets[0].getsockname()[1])
            ready.set()

        threading.Thread(target=self._loop.run_forever, name="recorder", daemon=True).start()
        asyncio.run_coroutine_threadsafe(serve(), self._loop)
        ready.wait(30)
        return f"http://127.0.0.1:{port[0]}/v1"

    def stop(self) -> None:
        async def close() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            if self._session is not None:
                await self._session.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        call = None
        if request.path == CHAT and request.method == "POST":
            call = Call(body=seeded(json.loads(body)), sent=time.time())
            body = json.dumps(call.body).encode()
            self.calls.append(call)
        if self._session is None:  # one connection pool, in the recorder's loop
            timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
            self._session = aiohttp.ClientSession(
                timeout=timeout, auto_decompress=False, connector=aiohttp.TCPConnector(force_close=True)
            )
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            for k, v in upstream.headers.items():
                if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                    response.headers[k] = v
            await response.prepare(request)
            if call is not None and upstream.status == 200:
                await _read_stream(upstream, call, response.write)
            else:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            await response.write_eof()
            return response


QUOTE_CHARS = 300  # a reply is quoted when its first characters are (the judge cuts long ones)


def link_reads(calls: list[Call]) -> None:
    """Sets each call's `reads`: the earlier calls, finished before it was sent, whose reply its
    messages quote."""
    for i, call in enumerate(calls):
        prompt = "\n".join(str(m.get("content", "")) for m in call.body.get("messages", []))
        call.reads = [
            j
            for j, earlier in enumerate(calls[:i])
            if earlier.text.strip()
            and earlier.ended is not None
            and earlier.ended <= call.sent
            and earlier.text.strip()[:QUOTE_CHARS] in prompt
        ]


def same_work_body(call: Call) -> dict:
    """The recorded request, set to decode as many tokens as the product's reply did (above)."""
    body = dict(call.body)
    if call.tokens_out <= 0:  # no usage reported: as it was
        return body
    body.pop("max_completion_tokens", None)
    body["max_tokens"] = call.tokens_out
    if not body.get("response_format") and not body.get("tools"):
        body["ignore_eos"] = True  # llama.cpp's: decode to max_tokens whatever the model samples
        body.pop("stop", None)
    return body


async def _replay(engine_url: str, calls: list[Call], slots: int) -> tuple[list[Call], float]:
    base = engine_url.rstrip("/").removesuffix("/v1")
    done = [asyncio.Event() for _ in calls]
    capacity = asyncio.Semaphore(slots)
    slot_locks = [asyncio.Lock() for _ in range(slots)]
    replayed: list[Call] = [Call(body=same_work_body(c), sent=0.0, reads=c.reads) for c in calls]
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)

    connector = aiohttp.TCPConnector(force_close=True)  # see the module's docstring
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def one(i: int) -> None:
            for j in calls[i].reads:
                await done[j].wait()
            slot = calls[i].body.get("id_slot")
            lock = slot_locks[slot] if isinstance(slot, int) and 0 <= slot < slots else None
            async with capacity:
                if lock is not None:
                    await lock.acquire()
                try:
                    replayed[i].sent = time.time()
                    async with session.post(base + CHAT, json=replayed[i].body) as response:
                        response.raise_for_status()
                        await _read_stream(response, replayed[i])
                finally:
                    if lock is not None:
                        lock.release()
            done[i].set()

        # Earliest recorded first: tasks are created in that order and wait in it.
        start = time.time()
        await asyncio.gather(*(one(i) for i in range(len(calls))))
        return replayed, time.time() - start


def replay(engine_url: str, calls: list[Call], slots: int) -> tuple[list[Call], float]:
    """The recorded calls sent again straight to the engine; (the replayed calls, wall seconds)."""
    return asyncio.run(_replay(engine_url, calls, slots))


def by_kind(calls: list[Call]) -> dict[str, dict[str, float | int | None]]:
    """Per kind: turns, median time to first token, tokens per second of service."""
    out: dict[str, dict[str, float | int | None]] = {}
    for kind in ("propose", "critique", "revise", "judge"):
        of_kind = [c for c in calls if c.kind == kind and c.ended is not None]
        if not of_kind:
            continue
        ttfts = [c.ttft_s for c in of_kind if c.ttft_s is not None]
        service = sum(c.service_s for c in of_kind)
        out[kind] = {
            "turns": len(of_kind),
            "ttft_s_median": round(statistics.median(ttfts), 2) if ttfts else None,
            "slot_tok_s": round(sum(c.tokens_out for c in of_kind) / service, 1) if service else None,
            "prompt_tokens_median": statistics.median(c.tokens_in for c in of_kind),
        }
    return out


def busy_intervals(calls: list[Call]) -> list[tuple[float, float]]:
    """When at least one call was in the engine, as merged (start, end) intervals."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted((c.sent, c.ended or c.sent) for c in calls):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def idle_within(busy: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] when no call was in the engine."""
    covered = sum(max(0.0, min(e, end) - max(s, start)) for s, e in busy)
    return max(0.0, end - start - covered)
