"""Chat templates: token-for-token and mask-for-mask against ``transformers``' ``apply_chat_template``.

Four template families ship as test files (``data/chat_templates``: ChatML, Llama 3, Mistral,
Qwen3 with thinking), each with ``{% generation %}`` marks; the tokenizer is a byte-level BPE
trained here, with every family's special tokens.
"""

# ruff: noqa: RUF001 (conversations hold non-ASCII text on purpose)
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from o41_training_data import ChatEncoder, ChatTemplate, ConfigError, DataError, TextTokenizer

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
FAMILIES = ("chatml", "llama3", "mistral", "qwen3")
SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
]
BOS = {"chatml": "<|endoftext|>", "llama3": "<|begin_of_text|>", "mistral": "<s>", "qwen3": "<|endoftext|>"}
EOS = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "mistral": "</s>", "qwen3": "<|im_end|>"}

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi, how can I help?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3×3 — in words, please? ünïcödé 🙂"},
        {"role": "assistant", "content": "  Nine.  "},
    ],
    [
        {"role": "user", "content": "Translate 'chat' to French."},
        {"role": "assistant", "content": "« chat »\nwith a newline\n"},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "You're welcome."},
    ],
]
THINKING = [
    {"role": "user", "content": "Is 17 prime?"},
    {"role": "assistant", "content": "<think>\nCheck 2, 3: no divisors.\n</think>\n\nYes, 17 is prime."},
    {"role": "user", "content": "And 21?"},
    {"role": "assistant", "content": "No: 3 × 7.", "reasoning_content": "21 = 3 * 7"},
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [m["content"] for c in [*CONVERSATIONS, THINKING] for m in c] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(corpus, trainer)
    directory = tmp_path_factory.mktemp("tokenizer")
    bpe.save(str(directory / "tokenizer.json"))
    return directory


def family_config(tokenizer_dir: Path, family: str) -> Path:
    """A tokenizer_config.json of ``family`` beside the tokenizer, as transformers saves one."""
    directory = tokenizer_dir / family
    directory.mkdir(exist_ok=True)
    (directory / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS[family],
        # An AddedToken as transformers saves one: the content is what the template sees.
        "eos_token": {
            "__type": "AddedToken",
            "content": EOS[family],
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        },
        "chat_template": (TEMPLATES / f"{family}.jinja").read_text(),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory / "tokenizer_config.json"


def reference(config: Path, messages: list[dict[str, Any]], **kwargs: Any) -> tuple[list[int], list[int]]:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(config.parent))
    out = hf.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **kwargs
    )
    return list(out["input_ids"]), list(out["assistant_masks"])


def cases(family: str) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    out: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [(c, {}) for c in CONVERSATIONS]
    if family in ("llama3", "qwen3"):
        out.append((CONVERSATIONS[0], {"tools": [TOOL]}))
    if family == "qwen3":
        out.append((THINKING, {}))
        prompt = THINKING[:3]
        out.append((prompt, {"add_generation_prompt": True, "enable_thinking": False}))
        out.append((prompt, {"add_generation_prompt": True}))
        calls = [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            },
            {"role": "tool", "content": "18°C"},
            {"role": "assistant", "content": "It is 18°C."},
        ]
        out.append((calls, {"tools": [TOOL]}))
    if family == "mistral":
        out = [(c, k) for c, k in out if c[0]["role"] != "system" or len(c) % 2 == 1]
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_ids_and_masks_equal_transformers(tokenizer_dir: Path, family: str) -> None:
    config = family_config(tokenizer_dir, family)
    template = ChatTemplate.from_tokenizer_config(config)
    tokenizer = TextTokenizer.from_file(config.parent / "tokenizer.json", eos=EOS[family])
    masked = 0
    for messages, kwargs in cases(family):
        tools = kwargs.pop("tools", None)
        expected_ids, expected_mask = reference(config, messages, tools=tools, **kwargs)
        encoder = ChatEncoder(tokenizer, template, **kwargs)
        got = encoder.encode(messages, tools=tools)
        assert got.input_ids.tolist() == expected_ids, (family, messages, kwargs)
        assert got.loss_mask.tolist() == expected_mask, (family, messages, kwargs)
        assert got.input_ids.dtype == np.int32
        assert got.loss_mask.dtype == np.uint8
        masked += int(got.loss_mask.sum())
        # Last turn only: the same mask with every earlier assistant turn masked out.
        last = ChatEncoder(tokenizer, template, loss_on="last", **kwargs).encode(messages, tools=tools)
        assert last.input_ids.tolist() == expected_ids
        spans = template.render(messages, tools=tools, **kwargs).assistant_spans
        if spans:
            assert 0 < int(last.loss_mask.sum()) <= int(got.loss_mask.sum())
            assert (last.loss_mask <= got.loss_mask).all()
            first_masked = int(np.argmax(last.loss_mask))
            assert (last.loss_mask[first_masked:] == got.loss_mask[first_masked:]).all()
        else:
            assert int(last.loss_mask.sum()) == 0
    assert masked > 0


def test_the_mask_covers_the_assistant_text_and_its_end_of_turn_token(tokenizer_dir: Path) -> None:
    config = family_config(tokenizer_dir, "chatml")
    tokenizer = TextTokenizer.from_file(config.parent / "tokenizer.json", eos="<|im_end|>")
    encoder = ChatEncoder(tokenizer, ChatTemplate.from_tokenizer_config(config))
    got = encoder.encode(CONVERSATIONS[0])
    hf = tokenizer.hf()
    masked_text = hf.decode(got.input_ids[got.loss_mask == 1].tolist(), skip_special_tokens=False)
    assert masked_text == "Hi, how can I help?<|im_end|>"
    im_end = hf.token_to_id("<|im_end|>")
    # The user's end-of-turn token is not the assistant's.
    ends = np.flatnonzero(got.input_ids == im_end)
    assert got.loss_mask[ends].tolist() == [0, 1]


def test_named_templates_and_a_template_file_beside_the_config(tokenizer_dir: Path, tmp_path: Path) -> None:
    chatml = (TEMPLATES / "chatml.jinja").read_text()
    config = tmp_path / "tokenizer_config.json"
    config.write_text(
        json.dumps(
            {
                "chat_template": [
                    {"name": "default", "template": chatml},
                    {"name": "tool_use", "template": "x"},
                ]
            }
        )
    )
    assert ChatTemplate.from_tokenizer_config(config).template == chatml
    assert ChatTemplate.from_tokenizer_config(config, "tool_use").template == "x"
    with pytest.raises(ConfigError, match="no template named 'rag'"):
        ChatTemplate.from_tokenizer_config(config, "rag")
    config.write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(ConfigError, match="no chat_template"):
        ChatTemplate.from_tokenizer_config(config)
    (tmp_path / "chat_template.jinja").write_text(chatml)
    beside = ChatTemplate.from_tokenizer_config(config)
    assert beside.template == chatml
    assert beside.special_tokens == {"eos_token": "</s>"}


def test_refusals_name_what_is_wrong(tokenizer_dir: Path) -> None:
    config = family_config(tokenizer_dir, "mistral")
    template = ChatTemplate.from_tokenizer_config(config)
    tokenizer = TextTokenizer.from_file(config.parent / "tokenizer.json", eos="</s>")
    encoder = ChatEncoder(tokenizer, template)
    with pytest.raises(DataError, match="roles must alternate"):
        encoder.encode([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(ConfigError, match="generation"):
        ChatEncoder(tokenizer, ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}"))
    with pytest.raises(ConfigError, match="tokenizer.json"):
        ChatEncoder(TextTokenizer.byte(), template)
    with pytest.raises(ConfigError, match="Jinja"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ConfigError, match="loss_on"):
        ChatEncoder(tokenizer, template, loss_on="first")  # type: ignore[arg-type]
    # The sandbox: a template cannot reach Python internals.
    escape = ChatTemplate("{% generation %}{{ messages.__class__.__mro__ }}{% endgeneration %}")
    with pytest.raises(DataError):
        escape.render([])


def chat_corpus(root: Path, count: int = 30) -> list[list[dict[str, Any]]]:
    """``count`` conversations cycling through the test conversations, with a marker each."""
    out = []
    for k in range(count):
        base = CONVERSATIONS[k % len(CONVERSATIONS)]
        out.append([{**m, "content": f"{m['content']} #{k}"} for m in base])
    return out


def test_tokenize_dataset_renders_conversations_resumably(tokenizer_dir: Path, tmp_path: Path) -> None:
    from o41_testkit import collect, config_for
    from o41_training_data import load_manifest, open_batch_stream, tokenize_dataset

    config = family_config(tokenizer_dir, "chatml")
    conversations = chat_corpus(tmp_path)
    # One input as JSON Lines, one as Parquet (list<struct<role, content>>), as HF datasets writes.
    jsonl = tmp_path / "chats.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"messages": c, "id": k}) + "\n" for k, c in enumerate(conversations[:20]))
    )
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "chats.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": c} for c in conversations[20:]]), parquet)
    tokenizer_json = config.parent / "tokenizer.json"
    out = tmp_path / "sft" / "data-manifest-v1.json"

    def run(**kwargs: Any) -> Any:
        return tokenize_dataset(
            [jsonl, parquet],
            out,
            tokenizer=tokenizer_json,
            eos="<|im_end|>",
            chat_template=config,
            tokens_per_shard=200,
            **kwargs,
        )

    result = run()
    expected = [reference(config, c) for c in conversations]
    assert result.documents == len(conversations)
    assert result.tokens == sum(len(ids) for ids, _ in expected)
    manifest = load_manifest(out)
    shards = manifest.splits["train"].shards
    assert len(shards) > 2  # parts close at tokens_per_shard
    rows = [r for s in shards for r in pq.read_table(s.path).to_pylist()]
    assert [r["input_ids"] for r in rows] == [ids for ids, _ in expected]
    assert [r["loss_mask"] for r in rows] == [mask for _, mask in expected]
    assert pq.read_schema(shards[0].path).field("loss_mask").type == pa.list_(pa.uint8())
    # Run again: every shard is recovered, the same dataset is published.
    again = run()
    assert again.manifest.to_json() == result.manifest.to_json()
    # Other chat options than the completed shards': refused, naming the option.
    with pytest.raises(ConfigError, match="chat") as refused:
        run(loss_on="last")
    assert refused.value.option == "chat"

    # Unpacked SFT: the projected mask summed over an epoch is the corpus's assistant tokens.
    from o41_training_data import FileSource, ProjectedField

    width = max(len(ids) for ids, _ in expected)
    stream_config = config_for(
        [FileSource([s.path for s in shards])],
        [
            ProjectedField("ids", "input_ids", "i32", length=width),
            ProjectedField("mask", "loss_mask", "i32", length=width),
        ],
        batch_size=5,  # divides the 30 conversations: an epoch is every row
    )
    batches = collect(stream_config)
    assert sum(len(b["ids"]) for b in batches) == len(conversations)
    assert sum(int(b["mask"].sum()) for b in batches) == sum(sum(mask) for _, mask in expected)
    with open_batch_stream(stream_config) as stream:
        first = next(iter(stream)).arrays()
    assert first["ids"].dtype == np.int32


def test_tokenize_refuses_a_record_that_is_no_conversation(tokenizer_dir: Path, tmp_path: Path) -> None:
    from o41_training_data import tokenize_dataset

    config = family_config(tokenizer_dir, "chatml")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"messages": CONVERSATIONS[0]}) + "\n" + json.dumps({"messages": "just text"}) + "\n"
    )
    with pytest.raises(DataError, match=r"record 1, field 'messages': a str, not a list of messages") as info:
        tokenize_dataset(
            [bad],
            tmp_path / "out" / "data-manifest-v1.json",
            tokenizer=config.parent / "tokenizer.json",
            eos="<|im_end|>",
            chat_template=config,
        )
    assert info.value.row == 1
    with pytest.raises(ConfigError, match="tools_field"):
        tokenize_dataset([bad], tmp_path / "o2" / "m.json", tools_field="tools")


def test_o41_tokenize_chat(tokenizer_dir: Path, tmp_path: Path) -> None:
    from o41_training_data import load_manifest
    from o41_training_data._cli import main

    config = family_config(tokenizer_dir, "qwen3")
    chats = tmp_path / "chats.jsonl"
    prompt = THINKING[:3]
    chats.write_text(
        json.dumps({"conversation": THINKING}) + "\n" + json.dumps({"conversation": prompt}) + "\n"
    )
    out = tmp_path / "tok" / "data-manifest-v1.json"
    argv = [
        "tokenize",
        str(chats),
        "--output",
        str(out),
        "--tokenizer",
        str(config.parent / "tokenizer.json"),
        "--eos",
        "<|im_end|>",
        "--chat",
        str(config),
        "--text-field",
        "conversation",
        "--chat-option",
        "add_generation_prompt=true",
        "--chat-option",
        "enable_thinking=false",
        "--loss-on",
        "last",
    ]
    assert main(argv) == 0
    import pyarrow.parquet as pq

    rows = [r for s in load_manifest(out).splits["train"].shards for r in pq.read_table(s.path).to_pylist()]
    for row, messages in zip(rows, (THINKING, prompt), strict=True):
        ids, mask = reference(config, messages, add_generation_prompt=True, enable_thinking=False)
        assert row["input_ids"] == ids
        # Last turn only: the reference mask from the last generation block on.
        spans = (
            ChatTemplate.from_tokenizer_config(config)
            .render(messages, add_generation_prompt=True, enable_thinking=False)
            .assistant_spans
        )
        if len(spans) > 1:
            assert sum(row["loss_mask"]) < sum(mask)
        assert all(a <= b for a, b in zip(row["loss_mask"], mask, strict=True))
    assert main([*argv[:-2], "--chat-option", "novalue"]) == 2


def tokenized_chats(tokenizer_dir: Path, tmp_path: Path, count: int = 24) -> tuple[list[str], list[Any]]:
    """A JSONL of ``count`` ChatML conversations tokenised with ``tokenize_dataset``.

    Returns its shards, and each conversation's (ids, mask) as transformers renders it.
    """
    from o41_training_data import tokenize_dataset

    config = family_config(tokenizer_dir, "chatml")
    conversations = chat_corpus(tmp_path, count=count)
    source = tmp_path / "chats.jsonl"
    source.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    result = tokenize_dataset(
        [source],
        tmp_path / "sft" / "data-manifest-v1.json",
        tokenizer=config.parent / "tokenizer.json",
        eos="<|im_end|>",
        chat_template=config,
        tokens_per_shard=300,
    )
    return [s.path for s in result.manifest.splits["train"].shards], [
        reference(config, c) for c in conversations
    ]


def test_a_packed_sft_stream_keeps_every_assistant_token_with_its_mask(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    from dataclasses import replace

    from o41_testkit import collect
    from o41_training_data import (
        BatchStreamConfig,
        FileSource,
        Packing,
        ProjectedField,
        Shuffle,
        Stage,
    )
    from o41_training_data.testing import assert_resumable

    shards, expected = tokenized_chats(tokenizer_dir, tmp_path)
    assistant_tokens = sum(sum(mask) for _, mask in expected)
    seq_len = 64
    stream_config = BatchStreamConfig(
        fields=[
            ProjectedField("input_ids", "input_ids", "i32", length=seq_len),
            ProjectedField("loss_mask", "loss_mask", "i32", length=seq_len),
            ProjectedField("segment_ids", "@segment_ids", "i32", length=seq_len),
            ProjectedField("positions", "@positions", "i32", length=seq_len),
        ],
        stages=[
            Stage(
                sources=[FileSource(shards)],
                batch_size=1,
                packing=Packing(field="input_ids", seq_len=seq_len, bins=4),
            )
        ],
        seed=3,
    )
    batches = collect(stream_config)
    assert sum(int(b["loss_mask"].sum()) for b in batches) == assistant_tokens
    # No token is split from its mask: each segment is a run of one conversation, its
    # (id, mask) pairs those of that conversation from the segment's first position on.
    pairs = {tuple(ids): mask for ids, mask in expected}
    for batch in batches:
        segments, positions = batch["segment_ids"][0], batch["positions"][0]
        for segment in range(1, int(segments.max()) + 1):
            at = np.flatnonzero(segments == segment)
            ids = batch["input_ids"][0][at].tolist()
            start = int(positions[at[0]])
            owners = [doc for doc in pairs if list(doc[start : start + len(ids)]) == ids]
            assert owners, "a segment is a piece of one conversation"
            assert batch["loss_mask"][0][at].tolist() == pairs[owners[0]][start : start + len(ids)]
    # Two ranks together deliver the same epoch; every stop point resumes exactly.
    per_rank = [collect(replace(stream_config, rank=r, world_size=2)) for r in range(2)]
    assert sum(int(b["loss_mask"].sum()) for rank in per_rank for b in rank) == assistant_tokens
    shuffled = replace(
        stream_config,
        stages=[replace(stream_config.stages[0], batch_size=2, shuffle=Shuffle(buffer_rows=8, unit_rows=1))],
    )
    assert_resumable(shuffled, batches=len(batches) // 2)


def test_packed_sft_labels_are_the_next_token_of_the_same_conversation_and_long_ones_are_dropped(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    # TRL users' packed SFT: whole conversations only (one longer than the window is left out,
    # never split), a bool loss mask, and labels shifted by one with -100 where not trained.
    from dataclasses import replace

    from o41_testkit import collect
    from o41_training_data import (
        BatchStreamConfig,
        FileSource,
        Packing,
        ProjectedField,
        Shuffle,
        Stage,
        open_batch_stream,
    )
    from o41_training_data.testing import assert_resumable

    shards, expected = tokenized_chats(tokenizer_dir, tmp_path)
    lengths = sorted(len(ids) for ids, _ in expected)
    seq_len = lengths[len(lengths) * 3 // 4]  # a quarter of the conversations do not fit
    kept = [(ids, mask) for ids, mask in expected if len(ids) <= seq_len]
    too_long = len(expected) - len(kept)
    assert too_long > 0
    assert kept
    stream_config = BatchStreamConfig(
        fields=[
            ProjectedField("input_ids", "input_ids", "i32", length=seq_len),
            ProjectedField("loss_mask", "loss_mask", "bool", length=seq_len),
            ProjectedField("labels", "@labels:loss_mask", "i64", length=seq_len, pad=-100),
            ProjectedField("segment_ids", "@segment_ids", "i32", length=seq_len),
            ProjectedField("positions", "@positions", "i32", length=seq_len),
        ],
        stages=[
            Stage(
                sources=[FileSource(shards)],
                batch_size=1,
                packing=Packing(field="input_ids", seq_len=seq_len, bins=4, overflow="drop"),
            )
        ],
        seed=3,
    )
    with open_batch_stream(stream_config) as stream:
        batches = [{k: v.copy() for k, v in b.arrays().items()} for b in stream]
        assert stream.stats.sources[0].dropped_rows == too_long
    assert batches[0]["loss_mask"].dtype == np.uint8
    # Every kept conversation arrives whole, from its first token; no long one arrives at all.
    segments_seen = []
    for batch in batches:
        ids, mask, labels = batch["input_ids"][0], batch["loss_mask"][0], batch["labels"][0]
        segments, positions = batch["segment_ids"][0], batch["positions"][0]
        for segment in range(1, int(segments.max()) + 1):
            at = np.flatnonzero(segments == segment)
            assert positions[at[0]] == 0, "no conversation starts mid-way"
            segments_seen.append(ids[at].tolist())
        for t in range(seq_len):
            same = t + 1 < seq_len and segments[t] > 0 and segments[t + 1] == segments[t]
            if same and mask[t + 1]:
                assert labels[t] == ids[t + 1], "a trained label is the next token of its conversation"
            else:
                assert labels[t] == -100, "ignored: masked, the conversation's end, or padding"
    assert sorted(segments_seen) == sorted(ids for ids, _ in kept)
    assert sum(int(b["loss_mask"].sum()) for b in batches) == sum(sum(m) for _, m in kept)
    shuffled = replace(
        stream_config,
        stages=[replace(stream_config.stages[0], batch_size=2, shuffle=Shuffle(buffer_rows=8, unit_rows=1))],
    )
    assert_resumable(shuffled, batches=len(batches) // 2)
    per_rank = [collect(replace(shuffled, rank=r, world_size=2)) for r in range(2)]
    assert sum(int(b["loss_mask"].sum()) for rank in per_rank for b in rank) <= sum(sum(m) for _, m in kept)


def preference_rows(count: int) -> list[dict[str, Any]]:
    """TRL's preference layout with an explicit prompt: the user's turn, then two answers, the
    rejected one longer on every third record."""
    rows = []
    for k in range(count):
        base = CONVERSATIONS[k % len(CONVERSATIONS)]
        prompt = [{**m, "content": f"{m['content']} #{k}"} for m in base if m["role"] != "assistant"][:2]
        chosen = f"Answer {k}: fine."
        rejected = f"Answer {k}: " + "no, not this, " * (1 + 4 * (k % 3 == 0))
        rows.append(
            {
                "prompt": prompt,
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
            }
        )
    return rows


def test_a_dpo_stream_delivers_chosen_and_rejected_stacked(tokenizer_dir: Path, tmp_path: Path) -> None:
    from dataclasses import replace

    import datasets
    from o41_testkit import collect
    from o41_training_data import (
        BatchStreamConfig,
        FileSource,
        ProjectedField,
        ProjectionError,
        Shuffle,
        Stage,
        load_manifest,
    )
    from o41_training_data._cli import main
    from o41_training_data.testing import assert_resumable

    config = family_config(tokenizer_dir, "chatml")
    rows = preference_rows(18)
    source = tmp_path / "pairs.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(source))
    out = tmp_path / "dpo" / "data-manifest-v1.json"
    argv = ["tokenize", str(source), "--output", str(out)]
    argv += [
        "--tokenizer",
        str(config.parent / "tokenizer.json"),
        "--eos",
        "<|im_end|>",
        "--chat",
        str(config),
        "--prompt-field",
        "prompt",
    ]
    argv += ["--text-field", "chosen", "--text-field", "rejected", "--tokens-per-shard", "400", "--role-ids"]
    assert main(argv) == 0
    expected = [
        tuple(reference(config, r["prompt"] + r[answer]) for answer in ("chosen", "rejected")) for r in rows
    ]
    longest = max(len(ids) for pair in expected for ids, _ in pair)
    shards = [s.path for s in load_manifest(out).splits["train"].shards]
    assert len(shards) > 1
    import pyarrow.parquet as pq

    assert set(pq.read_schema(shards[0]).names) == {
        f"{answer}_{field}"
        for answer in ("chosen", "rejected")
        for field in ("input_ids", "loss_mask", "role_ids")
    }

    def stream(seq_len: int, overflow: str, **changes: Any) -> BatchStreamConfig:
        stack = ("chosen_{}", "rejected_{}")
        return BatchStreamConfig(
            fields=[
                ProjectedField(
                    "input_ids",
                    tuple(s.format("input_ids") for s in stack),
                    "i32",
                    shape=(2, seq_len),
                    pad=-1,
                    overflow=overflow,  # type: ignore[arg-type]
                ),
                ProjectedField(
                    "loss_mask", tuple(s.format("loss_mask") for s in stack), "i32", shape=(2, seq_len)
                ),
                ProjectedField("row", "@row_id", "i64"),
            ],
            stages=[Stage(sources=[FileSource(shards)], batch_size=3)],
            **changes,
        )

    def pad(values: list[int], seq_len: int, fill: int) -> list[int]:
        return values + [fill] * (seq_len - len(values))

    # Every pair whole, chosen at index 0 and rejected at 1, ids and masks as transformers has them.
    batches = collect(stream(longest, "error"))
    got = [(b["input_ids"][k], b["loss_mask"][k]) for b in batches for k in range(len(b["row"]))]
    assert len(got) == len(rows)
    for (ids, mask), pair in zip(got, expected, strict=True):
        assert ids.shape == (2, longest)
        for entry, (want_ids, want_mask) in enumerate(pair):
            assert ids[entry].tolist() == pad(want_ids, longest, -1)
            assert mask[entry].tolist() == pad(want_mask, longest, 0)
            assert sum(want_mask) > 0
    # Too short for the long rejected answers: "error" names the shard, row and field ...
    short = max(len(ids) for k, pair in enumerate(expected) if k % 3 for ids, _ in pair) + 1
    too_long = [k for k, (_, (ids, _)) in enumerate(expected) if len(ids) > short]
    assert too_long == list(range(0, len(rows), 3))
    with pytest.raises(ProjectionError, match=r"row \d+, field 'input_ids' \(source 'rejected_input_ids'\)"):
        collect(stream(short, "error"))
    # ... "drop" leaves those records out, the same on every rank and from every resume point.
    dropped = stream(short, "drop")
    kept = collect(dropped)
    pairs = [(b["input_ids"][k], b["row"][k]) for b in kept for k in range(len(b["row"]))]
    assert [int(row) for _, row in pairs] == [k for k in range(len(rows)) if k not in too_long]
    for ids, row in pairs:
        (want_chosen, _), (want_rejected, _) = expected[int(row)]
        assert ids[0].tolist() == pad(want_chosen, short, -1)
        assert ids[1].tolist() == pad(want_rejected, short, -1)
    from o41_training_data import TrainingData

    with TrainingData().batch_stream(dropped) as opened:
        assert [s.dropped_rows for s in opened.stats.sources] == [len(too_long)]
    per_rank = [collect(replace(dropped, rank=r, world_size=2)) for r in range(2)]
    ranked = sorted(int(row) for rank in per_rank for b in rank for row in b["row"])
    assert ranked == sorted(int(row) for _, row in pairs)  # 12 rows: two rounds of 2 x 3
    shuffled = replace(
        dropped,
        stages=[replace(dropped.stages[0], infinite=True, shuffle=Shuffle(buffer_rows=6, unit_rows=1))],
    )
    assert_resumable(shuffled, batches=8)


@pytest.mark.parametrize("family", FAMILIES)
def test_role_ids_say_who_wrote_each_token(tokenizer_dir: Path, family: str) -> None:
    from o41_training_data import ROLE_IDS
    from tokenizers import Tokenizer

    config = family_config(tokenizer_dir, family)
    bpe = Tokenizer.from_file(str(config.parent / "tokenizer.json"))
    encoder = ChatEncoder(
        TextTokenizer.from_file(config.parent / "tokenizer.json", eos=EOS[family]),
        ChatTemplate.from_tokenizer_config(config),
        role_ids=True,
    )
    for messages in CONVERSATIONS[1:]:
        encoded = encoder.encode(messages)
        roles = encoded.role_ids
        assert roles is not None
        assert roles.dtype == np.uint8
        assert len(roles) == len(encoded.input_ids)
        # The assistant's tokens are exactly those the template marks as generated.
        assert ((roles == ROLE_IDS["assistant"]) == (encoded.loss_mask == 1)).all()

        def text(role: str, ids: np.ndarray = encoded.input_ids, roles: np.ndarray = roles) -> str:
            return bpe.decode(ids[roles == ROLE_IDS[role]].tolist(), skip_special_tokens=False)

        for role in ("user", "system"):
            for message in (m for m in messages if m["role"] == role):
                if family != "mistral" or role == "user":  # Mistral folds the system text in the turn
                    assert message["content"].strip() in text(role)
        assert text("template").strip()  # headers and separators are the template's
        assert "".join(m["content"] for m in messages).strip()[:3] not in text("template")


def test_tokenize_writes_role_ids(tokenizer_dir: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq
    from o41_training_data import ROLE_IDS, load_manifest, tokenize_dataset

    config = family_config(tokenizer_dir, "chatml")
    rows = preference_rows(4)
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for fields, prefix in ((("chosen", "rejected"), ("chosen_", "rejected_")), ("chosen", ("",))):
        out = tmp_path / f"out-{len(prefix)}" / "data-manifest-v1.json"
        tokenize_dataset(
            [source],
            out,
            tokenizer=config.parent / "tokenizer.json",
            eos="<|im_end|>",
            chat_template=config,
            text_field=fields,
            prompt_field="prompt",
            role_ids=True,
        )
        shards = load_manifest(out).splits["train"].shards
        written = [r for s in shards for r in pq.read_table(s.path).to_pylist()]
        assert len(written) == len(rows)
        for record in written:
            for p in prefix:
                roles, mask = record[f"{p}role_ids"], record[f"{p}loss_mask"]
                assert len(roles) == len(record[f"{p}input_ids"]) == len(mask)
                assert [r == ROLE_IDS["assistant"] for r in roles] == [m == 1 for m in mask]
                assert ROLE_IDS["user"] in roles
    with pytest.raises(ConfigError, match="role_ids need chat_template"):
        tokenize_dataset(
            [source], tmp_path / "x" / "data-manifest-v1.json", text_field="chosen", role_ids=True
        )


def test_rl_prompts_arrive_left_padded_with_their_length_and_answer(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from o41_testkit import collect
    from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Stage, load_manifest
    from o41_training_data._cli import main

    config = family_config(tokenizer_dir, "qwen3")
    # verl's layout: a prompt conversation and a reward_model struct, flattened to columns.
    rows = [
        {
            "data_source": "arith",
            "prompt": [{"role": "user", "content": f"What is {k} × {k}? ünï"}],
            "reward_model": {"style": "rule", "ground_truth": f"{k * k} (là)"},
        }
        for k in range(10)
    ]
    source = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist(rows).flatten(), source)
    out = tmp_path / "rl" / "data-manifest-v1.json"
    argv = [
        "tokenize",
        str(source),
        "--output",
        str(out),
        "--tokenizer",
        str(config.parent / "tokenizer.json"),
    ]
    argv += ["--eos", "<|im_end|>", "--chat", str(config), "--text-field", "prompt"]
    argv += ["--chat-option", "add_generation_prompt=true", "--keep-field", "reward_model.ground_truth"]
    assert main(argv) == 0
    shards = [s.path for s in load_manifest(out).splits["train"].shards]
    width = 48
    stream = BatchStreamConfig(
        fields=[
            ProjectedField(
                "prompt", "input_ids", "i32", length=width, pad=-1, pad_side="left", overflow="drop"
            ),
            ProjectedField("prompt_length", "@length:prompt", "i64"),
            ProjectedField("answer", "reward_model.ground_truth", "u8", length=16, overflow="error"),
        ],
        stages=[Stage(sources=[FileSource(shards)], batch_size=5)],
    )
    batches = collect(stream)
    got = [(b["prompt"][k], b["prompt_length"][k], b["answer"][k]) for b in batches for k in range(5)]
    assert len(got) == len(rows)
    for (prompt, length, answer), row in zip(got, rows, strict=True):
        ids, _ = reference(config, row["prompt"], add_generation_prompt=True)
        assert int(length) == len(ids) < width
        assert prompt.tolist() == [-1] * (width - len(ids)) + ids  # the last token ends the row
        text = row["reward_model"]["ground_truth"]
        assert bytes(answer[: len(text.encode())]).decode() == text
        assert not answer[len(text.encode()) :].any()


def test_keep_fields_are_checked_and_carried_for_text_too(tmp_path: Path) -> None:
    import pyarrow.parquet as pq
    from o41_training_data import load_manifest, tokenize_dataset

    source = tmp_path / "docs.jsonl"
    source.write_text(
        "".join(json.dumps({"text": f"doc {k}", "id": k, "meta": {"k": k}}) + "\n" for k in range(3))
    )
    out = tmp_path / "t" / "data-manifest-v1.json"
    tokenize_dataset([source], out, keep_fields=["id", "meta"])
    written = [
        r for s in load_manifest(out).splits["train"].shards for r in pq.read_table(s.path).to_pylist()
    ]
    assert [(r["id"], r["meta"]) for r in written] == [(k, {"k": k}) for k in range(3)]
    assert [bytes(r["tokens"][:-1]).decode() for r in written] == [f"doc {k}" for k in range(3)]
    for keep, message in ((["id", "id"], "distinct"), (["tokens"], "overwrite"), ([""], "distinct")):
        with pytest.raises(ConfigError, match=message):
            tokenize_dataset([source], tmp_path / "x" / "data-manifest-v1.json", keep_fields=keep)
    with pytest.raises(DataError, match="no column 'nope'"):
        tokenize_dataset([source], tmp_path / "y" / "data-manifest-v1.json", keep_fields=["nope"])
