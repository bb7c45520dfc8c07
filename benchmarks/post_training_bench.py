"""Post-training data: chat rendering against `transformers`, and packed SFT with its mask.

    uv run python benchmarks/post_training_bench.py --conversations 2000 --reps 3

Conversations are built from CPython's standard library sources (a user turn, an assistant
turn, two to six turns each, text cut at 1 KiB); the tokenizer is a byte-level BPE of 8,000
tokens trained here with ChatML's special tokens (no download); the template is ChatML with
`{% generation %}` marks. Every contender runs in its own process pinned to one core with one
encoder thread (`RAYON_NUM_THREADS=1`), and rates are per CPU-second of the whole process:

- `transformers apply_chat_template`: `PreTrainedTokenizerFast.apply_chat_template(batch,
  tokenize=True, return_dict=True, return_assistant_tokens_mask=True)` over batches of 256
  conversations already in memory: ids and the assistant mask;
- `o41 ChatEncoder`: `ChatEncoder.encode_batch` over the same batches: the same ids and mask;
- `o41 tokenize --chat`: `tokenize_dataset(..., chat_template=...)` end to end, from JSON Lines
  shards to a published dataset of `input_ids` + `loss_mask` Parquet shards;
- `packed tokens` / `packed tokens + mask` / `packed tokens + @segment_lengths` and `...+ mask`:
  a packed stage (`seq_len` 2,048, batches of 8) over that dataset, delivering the tokens alone,
  the tokens with their aligned `loss_mask`, and the packed batch of the 0.9x goal (tokens and
  `@segment_lengths`) without and with the mask; tokens/s counts the tokens that are not padding,
  in steady state: the stream (an infinite stage) is timed over 640 batches after 640 untimed
  ones, since the planner's first two groups of batches are fresh allocations and every later
  batch reuses them, as a training run's do.

Writes the "post-training" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tokenize_bench import stdlib_documents

from report import preamble, run_child, write_section

BATCH = 256
SEQ_LEN = 2048
WARM_UP = 640  # batches: more than the planner's two groups ahead (2 x 256 of tokens alone)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MISSED = """**The 0.9x goal is missed.** A uint8 mask now takes the page-by-page reader the ids take (no
longer arrow-rs' casting one, which cost more than the ids), and its values decode cheaply
(its dictionary indices are long RLE runs), but it is still materialised as the ids are: a
value vector per page, a list per record, a copy into the read job's chunk and another into the
batch, each as long as the ids; at 100M tokens per CPU-second those copies weigh as much as
the decoding. The way to the goal is structural: token readers that write windows straight
into the batch (no job chunk between, for the ids too), and an aligned column's runs written
there as they are decoded, its list lengths checked against the tokens' once at open."""
RENDER = ["transformers apply_chat_template", "o41 ChatEncoder", "o41 tokenize --chat"]
STREAM = [
    "packed tokens",
    "packed tokens + mask",
    "packed tokens + @segment_lengths",
    "packed tokens + @segment_lengths + mask",
]


def conversations(count: int) -> list[list[dict[str, str]]]:
    """``count`` conversations of 2-6 turns, their text CPython's sources cut at 1 KiB."""
    pieces = stdlib_documents(count * 6 * 1024, chars=1024)
    out, at = [], 0
    for k in range(count):
        turns = 2 + 2 * (k % 3)
        out.append(
            [
                {"role": "user" if t % 2 == 0 else "assistant", "content": pieces[(at + t) % len(pieces)]}
                for t in range(turns)
            ]
        )
        at += turns
    return out


def prepare(directory: Path, count: int) -> dict[str, Any]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    chats = conversations(count)
    files = 2
    per_file = -(-len(chats) // files)
    for k in range(files):
        with (directory / f"chats-{k}.jsonl").open("w") as out:
            out.writelines(
                json.dumps({"messages": c}) + "\n" for c in chats[k * per_file : (k + 1) * per_file]
            )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8_000,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([m["content"] for c in chats[: count // 4] for m in c], trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "chat_template": TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    from o41_training_data import tokenize_dataset

    result = tokenize_dataset(
        sorted(str(p) for p in directory.glob("chats-*.jsonl")),
        directory / "sft" / "data-manifest-v1.json",
        tokenizer=str(directory / "tokenizer.json"),
        eos="<|im_end|>",
        chat_template=directory / "tokenizer_config.json",
    )
    return {"conversations": len(chats), "tokens": result.tokens}


def render_child(name: str, directory: Path) -> dict[str, Any]:
    chats = [
        json.loads(line)["messages"] for p in sorted(directory.glob("chats-*.jsonl")) for line in p.open()
    ]
    batches = [chats[k : k + BATCH] for k in range(0, len(chats), BATCH)]
    tokens = masked = 0
    if name.startswith("transformers"):
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(directory))
        wall, cpu = time.perf_counter(), time.process_time()
        for batch in batches:
            out = hf.apply_chat_template(
                batch, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            tokens += sum(map(len, out["input_ids"]))
            masked += sum(map(sum, out["assistant_masks"]))
    elif name == "o41 ChatEncoder":
        from o41_training_data import ChatEncoder, ChatTemplate, TextTokenizer

        encoder = ChatEncoder(
            TextTokenizer.from_file(directory / "tokenizer.json", eos="<|im_end|>"),
            ChatTemplate.from_tokenizer_config(directory / "tokenizer_config.json"),
        )
        wall, cpu = time.perf_counter(), time.process_time()
        for batch in batches:
            for encoded in encoder.encode_batch(batch):
                tokens += len(encoded.input_ids)
                masked += int(encoded.loss_mask.sum())
    else:
        from o41_training_data import tokenize_dataset

        output = Path(tempfile.mkdtemp(prefix="chat-bench-out-"))
        try:
            wall, cpu = time.perf_counter(), time.process_time()
            result = tokenize_dataset(
                sorted(str(p) for p in directory.glob("chats-*.jsonl")),
                output / "data-manifest-v1.json",
                tokenizer=str(directory / "tokenizer.json"),
                eos="<|im_end|>",
                chat_template=directory / "tokenizer_config.json",
                batch_size=BATCH,
            )
            tokens = result.tokens
        finally:
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            shutil.rmtree(output)
        return {"rows": len(chats), "tokens": tokens, "masked": -1, "wall": wall, "cpu": cpu}
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"rows": len(chats), "tokens": tokens, "masked": masked, "wall": wall, "cpu": cpu}


def stream_child(name: str, directory: Path) -> dict[str, Any]:
    from o41_training_data import (
        BatchStreamConfig,
        FileSource,
        Packing,
        ProjectedField,
        Stage,
        load_manifest,
        open_batch_stream,
    )

    shards = [
        s.path for s in load_manifest(directory / "sft" / "data-manifest-v1.json").splits["train"].shards
    ]
    fields = [ProjectedField("input_ids", "input_ids", "i32", length=SEQ_LEN)]
    if "@segment_lengths" in name:
        fields.append(ProjectedField("lengths", "@segment_lengths", "i32", length=64))
    if name.endswith("mask"):
        fields.append(ProjectedField("loss_mask", "loss_mask", "i32", length=SEQ_LEN))
    config = BatchStreamConfig(
        fields=fields,
        stages=[
            Stage(
                sources=[FileSource(shards)],
                batch_size=8,
                packing=Packing(field="input_ids", seq_len=SEQ_LEN),
                infinite=True,
            )
        ],
        threads=1,
    )
    tokens = 0
    with open_batch_stream(config) as stream:
        # Steady state, as a training run reads: the planner fills two groups of batches ahead
        # (16 MiB of rows each) in fresh allocations, which every later batch reuses. Those are
        # read first, untimed; then as many batches again.
        for _, batch in zip(range(WARM_UP), stream, strict=False):
            batch.arrays()
        wall, cpu = time.perf_counter(), time.process_time()
        for _, batch in zip(range(WARM_UP), stream, strict=False):
            arrays = batch.arrays()
            tokens += int((arrays["input_ids"] != 0).sum())
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"tokens": tokens, "wall": wall, "cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("NAME", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        name, directory = args.child[0], Path(args.child[1])
        result = render_child(name, directory) if name in RENDER else stream_child(name, directory)
        print(json.dumps(result))
        return
    directory = Path(tempfile.mkdtemp(prefix="chat-bench-"))
    env = {
        **os.environ,
        "RAYON_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    loads = [os.getloadavg()[0]]
    try:
        corpus = prepare(directory, args.conversations)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in RENDER + STREAM}
        for rep in range(args.reps):
            names = RENDER + STREAM
            for name in names if rep % 2 == 0 else list(reversed(names)):
                runs[name].append(
                    run_child([sys.executable, __file__, "--child", name, str(directory)], env=env)
                )
                print(rep, name, runs[name][-1], flush=True)
                loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(directory)
    ids = {run["tokens"] for name in RENDER for run in runs[name]}
    masks = {run["masked"] for name in RENDER[:2] for run in runs[name]}
    if len(ids) != 1 or len(masks) != 1:
        raise SystemExit(f"contenders disagree: tokens {ids}, masked {masks}")

    def rate(name: str, key: str) -> list[float]:
        return [run[key] / run["cpu"] for run in runs[name]]

    render_rows = []
    for name in RENDER:
        rates = rate(name, "rows")
        render_rows.append(
            f"| {name} | {statistics.median(rates):,.0f} | {min(rates):,.0f}-{max(rates):,.0f} | "
            f"{statistics.median(rate(name, 'tokens')):,.0f} |"
        )
    stream_rows = []
    for name in STREAM:
        rates = rate(name, "tokens")
        stream_rows.append(
            f"| {name} | {statistics.median(rates):,.0f} | {min(rates):,.0f}-{max(rates):,.0f} |"
        )

    def median(name: str, key: str) -> float:
        return statistics.median(rate(name, key))

    vs_hf = median("o41 ChatEncoder", "rows") / median("transformers apply_chat_template", "rows")
    end_to_end = median("o41 tokenize --chat", "rows") / median("transformers apply_chat_template", "rows")
    mask_cost = median("packed tokens + mask", "tokens") / median("packed tokens", "tokens")
    goal = median("packed tokens + @segment_lengths + mask", "tokens") / median(
        "packed tokens + @segment_lengths", "tokens"
    )
    command = f"uv run python benchmarks/post_training_bench.py --conversations {args.conversations} --reps {args.reps}"
    body = f"""## Post-training data (`benchmarks/post_training_bench.py`)

{preamble(command)}
- Data: {corpus["conversations"]:,} conversations of 2-6 turns (CPython's sources cut at 1 KiB),
  {corpus["tokens"]:,} tokens with a byte-level BPE of 8,000 tokens and ChatML's special tokens;
  a ChatML template with generation marks. Every contender agreed on the ids ({ids.pop():,}) and
  the masked tokens ({masks.pop():,}).
- Each contender in its own process pinned to one core, `RAYON_NUM_THREADS=1`, alternating,
  {args.reps} repetitions; rates per CPU-second of the whole process, medians (min-max). Machine
  load {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores.

| rendering + tokenising | conversations per CPU-s | spread | tokens per CPU-s |
|---|---:|---:|---:|
{chr(10).join(render_rows)}

| packed SFT stream (seq_len {SEQ_LEN}) | tokens per CPU-s | spread |
|---|---:|---:|
{chr(10).join(stream_rows)}

`ChatEncoder` renders and tokenises at **{vs_hf:.2f}x** `transformers`' `apply_chat_template` per
core (goal: at least 1.0x); `o41 tokenize --chat`, reading the shards and publishing the dataset
as well, at {end_to_end:.2f}x. The packed batch with its mask streams at **{goal:.2f}x** the tokens
+ `@segment_lengths` batch (goal: at least 0.9x); tokens + mask at {mask_cost:.2f}x tokens alone.
Stream rates are steady state (after 640 untimed batches, over 640 more, as the list above says).
{"The mask goal is met." if goal >= 0.9 else MISSED}
"""
    print(body)
    write_section("post-training", body)


if __name__ == "__main__":
    main()
