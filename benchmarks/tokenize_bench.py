"""`o41 tokenize` per core against the `tokenizers` package's own batch encoder, on the same text.

    uv run python benchmarks/tokenize_bench.py --mb 4 --reps 5

The text is CPython's standard library sources (prose and code, cut into documents of at most
4 KiB), written as JSON Lines shards `{"text": ...}`; the tokenizer is a byte-level BPE of
32,000 tokens trained here on that text with `tokenizers` (no download). Every contender runs
in its own process pinned to one core, with one encoder thread (`RAYON_NUM_THREADS=1`), and
counts the CPU time of all its threads, so "per core" is tokens per CPU-second:

- `tokenizers encode_batch` / `encode_batch_fast`: the texts already in memory, encoded in
  batches of 1,024 and nothing else (the ceiling of any tokenising pipeline on this encoder);
- `o41 tokenize`: `tokenize_dataset` end to end, reading the shards through the engine,
  encoding in batches of 1,024, and saving zstd Parquet shards with descriptors and a manifest;
- `o41 read only`: the engine reading the text field of the same shards, nothing else.

Writes the "tokenize" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from report import preamble, run_child, write_section

BATCH = 1024
DOC_CHARS = 4 * 1024
CONTENDERS = [
    "tokenizers encode_batch",
    "tokenizers encode_batch_fast",
    "o41 tokenize (tokenizer.json)",
    "o41 tokenize (byte)",
    "o41 read only",
]


def stdlib_documents(limit_bytes: int, chars: int = DOC_CHARS) -> list[str]:
    """CPython's own sources, in path order, cut into documents of at most ``chars`` (4 KiB)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs: list[str] = []
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for start in range(0, len(text), chars):
            piece = text[start : start + chars]
            docs.append(piece)
            total += len(piece.encode())
            if total >= limit_bytes:
                return docs
    return docs


def prepare(directory: Path, megabytes: float, files: int) -> dict[str, Any]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    docs = stdlib_documents(int(megabytes * 1e6))
    per_file = -(-len(docs) // files)
    inputs = []
    for k in range(files):
        path = directory / f"text-{k:03d}.jsonl"
        with path.open("w") as out:
            out.writelines(json.dumps({"text": d}) + "\n" for d in docs[k * per_file : (k + 1) * per_file])
        inputs.append(str(path))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32_000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(docs[: len(docs) // 4], trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    return {
        "inputs": inputs,
        "documents": len(docs),
        "text_bytes": sum(len(d.encode()) for d in docs),
    }


def child(name: str, directory: Path) -> None:
    """One measurement, in this process pinned to one core; prints a JSON line."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    inputs = sorted(str(p) for p in directory.glob("text-*.jsonl"))
    tokenizer_json = directory / "tokenizer.json"
    tokens = 0
    if name.startswith("tokenizers"):
        from tokenizers import Tokenizer

        texts = [json.loads(line)["text"] for path in inputs for line in Path(path).read_text().splitlines()]
        encoder = Tokenizer.from_file(str(tokenizer_json))
        encode = encoder.encode_batch_fast if name.endswith("_fast") else encoder.encode_batch
        wall, cpu = time.perf_counter(), time.process_time()
        for start in range(0, len(texts), BATCH):
            tokens += sum(map(len, encode(texts[start : start + BATCH], add_special_tokens=False)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    elif name == "o41 read only":
        from o41_training_data import StorageConfig
        from o41_training_data._tokenize import TextTokenizer, _InputJob, _texts

        wall, cpu = time.perf_counter(), time.process_time()
        for k, path in enumerate(inputs):
            job = _InputJob(
                None, TextTokenizer.byte(), k, 5, path, "jsonl", "text", "train", 1, BATCH, StorageConfig()
            )  # type: ignore[arg-type]
            for texts in _texts(job, 0):
                tokens += len(texts)  # documents: nothing is tokenised here
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    else:
        from o41_training_data import tokenize_dataset

        output = Path(tempfile.mkdtemp(prefix="tokenize-bench-out-"))
        tokenizer = "byte" if name.endswith("(byte)") else str(tokenizer_json)
        try:
            wall, cpu = time.perf_counter(), time.process_time()
            result = tokenize_dataset(
                inputs,
                output / "data-manifest-v1.json",
                tokenizer=tokenizer,
                batch_size=BATCH,
            )
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            tokens = result.tokens
        finally:
            shutil.rmtree(output)
    print(json.dumps({"tokens": tokens, "wall": wall, "cpu": cpu}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=4.0, help="megabytes of text")
    parser.add_argument("--files", type=int, default=4, help="input shards")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--child", nargs=2, metavar=("NAME", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    directory = Path(tempfile.mkdtemp(prefix="tokenize-bench-"))
    loads = [os.getloadavg()[0]]
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    try:
        corpus = prepare(directory, args.mb, args.files)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
        for rep in range(args.reps):
            order = CONTENDERS if rep % 2 == 0 else list(reversed(CONTENDERS))
            for name in order:
                runs[name].append(
                    run_child([sys.executable, __file__, "--child", name, str(directory)], env=env)
                )
                print(rep, name, runs[name][-1], flush=True)
                loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(directory)
    text_mb = corpus["text_bytes"] / 1e6

    def per_cpu(name: str, key: str = "tokens") -> list[float]:
        return [run[key] / run["cpu"] for run in runs[name]]

    def mb_per_cpu(name: str) -> list[float]:
        return [text_mb / run["cpu"] for run in runs[name]]

    rows = []
    for name in CONTENDERS:
        rates = per_cpu(name)
        unit = "documents" if name == "o41 read only" else "tokens"
        walls = [run["wall"] for run in runs[name]]
        rows.append(
            f"| {name} | {statistics.median(rates):,.0f} {unit} | {min(rates):,.0f}-{max(rates):,.0f} | "
            f"{statistics.median(mb_per_cpu(name)):.2f} | {statistics.median(walls):.2f} |"
        )
    text_rate = {name: statistics.median(mb_per_cpu(name)) for name in CONTENDERS}
    vs_batch = text_rate["o41 tokenize (tokenizer.json)"] / text_rate["tokenizers encode_batch"]
    vs_fast = text_rate["o41 tokenize (tokenizer.json)"] / text_rate["tokenizers encode_batch_fast"]
    bpe_tokens = runs["tokenizers encode_batch"][0]["tokens"]
    command = (
        f"uv run python benchmarks/tokenize_bench.py --mb {args.mb:g} --files {args.files} --reps {args.reps}"
    )
    body = f"""## Tokenising (`benchmarks/tokenize_bench.py`)

{preamble(command)}
- Text: {corpus["documents"]:,} documents, {text_mb:.1f} MB of UTF-8 (CPython's standard library
  sources cut into documents of at most 4 KiB) in {args.files} JSON Lines shards; a byte-level BPE of
  32,000 tokens trained here on a quarter of it: {bpe_tokens:,} BPE tokens
  ({corpus["text_bytes"] / bpe_tokens:.2f} bytes a token) plus one eos a document for `o41 tokenize`.
- Each contender in its own process pinned to one core with `RAYON_NUM_THREADS=1`, contenders
  alternating, {args.reps} repetitions; rates are per CPU-second of the whole process (all its
  threads), medians (min-max). `o41 tokenize` counts everything from reading the shards to the
  published manifest (zstd Parquet, descriptors, checksums); `tokenizers` only its encoder over
  texts already in memory.
- Machine load (1-minute load average, sampled between runs): {min(loads):.1f}-{max(loads):.1f} on
  {os.cpu_count()} cores. Other jobs shared the machine, so rates per CPU-second, not wall time,
  are compared; the spreads show what sharing leaves.

| contender | per core (CPU-s) | spread | text MB per CPU-s | wall s |
|---|---:|---:|---:|---:|
{chr(10).join(rows)}

`o41 tokenize` with the tokenizer.json processes the same text at **{vs_batch:.2f}x** the rate of
`tokenizers`' `encode_batch` and **{vs_fast:.2f}x** that of `encode_batch_fast` (the one it calls),
per core. The rest of its time is reading the JSON Lines through the engine (`o41 read only`),
taking ids out of each `Encoding` into one int32 buffer, and saving the shards.
"""
    print(body)
    write_section("tokenize", body)


if __name__ == "__main__":
    main()
