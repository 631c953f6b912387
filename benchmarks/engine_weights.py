"""The local engine's speed by weight format: the bundled Q4_1 file against a Q4_0 file derived from
it, in the same run, and how far their greedy replies agree.

    .venv/bin/pip install gguf      # the GGUF reader, writer and quantizer (not a dependency)
    .venv/bin/python benchmarks/engine_weights.py [--trials 3] [--json]

llama.cpp repacks Q4_0 weights for its AVX2/NEON kernels and has no such path for Q4_1, so a Q4_0
file of the same model reads and writes faster on these CPUs. The Q4_0 file is the Q4_1 weights
rounded once more (dequantized, then quantized with `gguf`'s own Q4_0 quantizer; every other
tensor and key copied), so it is another model as far as replies go. Each trial starts a server
of `make dev`'s kind (one thread, 3 slots) on each file in turn, the order alternating, and
measures: a fresh prompt of ~870 tokens (llama.cpp's own prompt tokens/s), one reply of 128
tokens (its decode tokens/s), three replies of 128 tokens at once (their tokens over the wall
time). Then greedy replies (temperature 0, 64 tokens) to a few tasks on both: the share of
each pair's text up to where the two first differ. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from fleet_pipelines import stack
from fleet_pipelines.llm.local_server import fetch_model

TASKS = [
    "Fix add in calc.py: it returns a - b, and tests/test_calc.py expects add(2, 3) == 5.",
    "Write a Python function is_palindrome(s) that ignores case and spaces.",
    "Write a Python function merge_intervals(intervals) that merges overlapping intervals.",
    "Review this function and name its bug: def mean(xs): return sum(xs) / len(xs) + 1",
]
FILLER = "A council of agents deliberates over a task, critiques each proposal and revises it. "


def requantize_q4_0(source: Path, target: Path) -> None:
    """`source` with its Q4_1 tensors as Q4_0; every other tensor and every key as they are."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(target, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer's own
        value_type, value = field.types[0], field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = int(gguf.LlamaFileType.MOSTLY_Q4_0)
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)
    q4_1, q4_0 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q4_0
    tensors = []
    for tensor in reader.tensors:
        data, qtype = tensor.data, tensor.tensor_type
        if qtype == q4_1:
            data, qtype = gguf.quants.quantize(gguf.quants.dequantize(data, q4_1), q4_0), q4_0
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, qtype)
        tensors.append(data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for data in tensors:
        writer.write_tensor_data(data, tensor_endianess=reader.endianess)
    writer.close()


def chat(client: httpx.Client, content: str, max_tokens: int, **extra) -> dict:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **extra}
    response = client.post("/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    return response.json()


def measure(model: Path, logs: Path, trial: int) -> dict:
    """One trial on `model`, on a server of its own."""
    port = stack.free_port()
    server = stack.start_model_server(logs, port, parallel=3, model_path=model)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            # A prompt no slot holds yet: the trial and the file lead it.
            prompt = f"{trial} {model.stem}. " + FILLER * 45 + "Summarise the above in one word."
            read = chat(client, prompt, 1)["timings"]
            one = chat(client, TASKS[1], 128, ignore_eos=True, seed=trial)["timings"]
            started = time.perf_counter()
            with ThreadPoolExecutor(3) as pool:
                replies = list(
                    pool.map(lambda t: chat(client, t, 128, ignore_eos=True, seed=trial), TASKS[1:4])
                )
            wall = time.perf_counter() - started
            greedy = [chat(client, t, 64, temperature=0)["choices"][0]["message"]["content"] for t in TASKS]
        return {
            "prompt_tokens": read["prompt_n"],
            "prompt_tps": read["prompt_per_second"],
            "decode_tps_1": one["predicted_per_second"],
            "decode_tps_3": sum(r["usage"]["completion_tokens"] for r in replies) / wall,
            "greedy": greedy,
        }
    finally:
        server.stop()


def agreement(a: str, b: str) -> float:
    """The share of the longer reply's characters up to where the two first differ."""
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return same / max(len(a), len(b), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    q4_1 = fetch_model()
    with tempfile.TemporaryDirectory() as tmp:
        q4_0 = Path(tmp) / q4_1.name.replace("Q4_1", "Q4_0")
        started = time.perf_counter()
        requantize_q4_0(q4_1, q4_0)
        derive_s = time.perf_counter() - started
        runs: dict[str, list[dict]] = {"Q4_1": [], "Q4_0": []}
        for trial in range(args.trials):
            order = [("Q4_1", q4_1), ("Q4_0", q4_0)][:: 1 if trial % 2 == 0 else -1]
            for name, path in order:
                runs[name].append(measure(path, Path(tmp) / "logs", trial))
    summary: dict = {"derive_q4_0_s": round(derive_s, 1), "trials": args.trials}
    for key in ("prompt_tps", "decode_tps_1", "decode_tps_3"):
        medians = {name: statistics.median(r[key] for r in rs) for name, rs in runs.items()}
        summary[key] = {name: round(v, 1) for name, v in medians.items()}
        summary[key]["ratio_q4_0"] = round(medians["Q4_0"] / medians["Q4_1"], 2)
    summary["prompt_tokens"] = runs["Q4_1"][0]["prompt_tokens"]
    first_q4_1, first_q4_0 = runs["Q4_1"][0]["greedy"], runs["Q4_0"][0]["greedy"]
    summary["greedy_agreement"] = [
        round(agreement(a, b), 2) for a, b in zip(first_q4_1, first_q4_0, strict=True)
    ]
    summary["greedy_same_across_trials"] = all(r["greedy"] == first_q4_1 for r in runs["Q4_1"])
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
