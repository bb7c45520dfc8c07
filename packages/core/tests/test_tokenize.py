"""``o41 tokenize`` / ``tokenize_dataset``: text records into a token dataset through the saver."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from o41_testkit import collect, config_for, data_for, upload, write_shard
from o41_training_data import (
    ConfigError,
    DataError,
    DatasetSaver,
    MalformedShardError,
    ManifestSource,
    ProjectedField,
    TextTokenizer,
    TokenizerIdentity,
    iter_shard,
    load_manifest,
    tokenize_dataset,
)
from o41_training_data._cli import main

WORDS = ["the", "data", "loader", "token", "café", "naïve", "漢字", "🙂", "resume", "shard", "eos", "über"]
TESTS = Path(__file__).parent


def documents(seed: int, n: int) -> list[str]:
    """Deterministic texts of 0 to 60 words (an empty document among them), with non-ASCII."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(0, 60)))) for _ in range(n)]


def inputs(root: Path, encodings: list[str], n: int = 40, field: str = "text") -> tuple[list[str], list[str]]:
    """One shard per encoding (with a second field the tokenizer must ignore); paths and texts."""
    root.mkdir(parents=True, exist_ok=True)
    paths, texts = [], []
    suffix = {"parquet": ".parquet", "jsonl": ".jsonl", "jsonl.gz": ".jsonl.gz", "msgpack": ".msgpack"}
    for k, encoding in enumerate(encodings):
        docs = documents(k, n)
        records = [{"id": f"{k}-{i}", field: doc} for i, doc in enumerate(docs)]
        paths.append(str(write_shard(root / f"in-{k}{suffix[encoding]}", encoding, records)))
        texts += docs
    return paths, texts


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE trained here on the test texts, offline, with the tokenizers package."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(documents(99, 500), trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def tokens_of(manifest_path: Path, split: str = "train") -> list[list[int]]:
    manifest = load_manifest(manifest_path)
    return [
        list(record["tokens"])
        for shard in manifest.splits[split].shards
        for record in iter_shard(manifest.data_format, shard)
    ]


def shard_files(manifest_path: Path) -> dict[str, bytes]:
    """Every file the dataset holds (manifest, shards, descriptors), by relative path.

    Leaves out the ``.tmp-<pid>-...`` files a killed writer leaves behind: no manifest lists them.
    """
    root = manifest_path.parent
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".tmp-")
    }


def descriptors(manifest_path: Path) -> list[Path]:
    return sorted(manifest_path.parent.rglob("shard-*.done.json"))


@pytest.mark.parametrize("data_format", ["parquet", "msgpack", "jsonl.gz"])
def test_byte_tokenizer_writes_each_documents_utf8_bytes_then_eos(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data_format: str
) -> None:
    paths, texts = inputs(tmp_path / "in", ["jsonl", "jsonl.gz", "parquet", "msgpack"])
    output = tmp_path / "out" / "data-manifest-v1.json"
    argv = ["tokenize", *paths, "--output", str(output), "--data-format", data_format]
    assert main([*argv, "--tokens-per-shard", "500"]) == 0
    captured = capsys.readouterr()
    total = sum(len(t.encode()) + 1 for t in texts)
    assert f"{len(texts):,} documents, {total:,} tokens" in captured.out
    assert "byte tokenizer, vocabulary 257, eos 256" in captured.out
    assert tokens_of(output) == [[*t.encode("utf-8"), 256] for t in texts]

    manifest = load_manifest(output)
    assert manifest.data_format == data_format
    shards = manifest.splits["train"].shards
    identity = {"kind": "byte", "vocab_size": 257, "eos_id": 256, "sha256": None}
    assert all(s.metadata["tokenizer"] == identity for s in shards)
    assert TokenizerIdentity.from_manifest(manifest) == TextTokenizer.byte().identity
    # Shards close at 500 tokens: every one but each input's last holds at least that many.
    by_source: dict[str, list[Any]] = {}
    for shard in shards:
        by_source.setdefault(shard.metadata["source"], []).append(shard)
    assert list(by_source) == paths  # root order is input order
    for source, parts in by_source.items():
        assert [p.metadata["last"] for p in parts] == [False] * (len(parts) - 1) + [True]
        assert all(p.metadata["tokens"] >= 500 for p in parts[:-1])
        assert [p.metadata["first_row"] for p in parts] == list(np.cumsum([0] + [p.rows for p in parts[:-1]]))
        assert sum(p.rows for p in parts) == 40, source
    assert sum(s.metadata["tokens"] for s in shards) == total
    if data_format == "parquet":
        kind = pq.read_schema(shards[0].path).field("tokens").type
        assert pa.types.is_list(kind)
        assert pa.types.is_int32(kind.value_type)


def test_a_stream_reads_the_tokens_and_the_identity_check_catches_mixed_datasets(tmp_path: Path) -> None:
    paths, texts = inputs(tmp_path / "in", ["jsonl", "parquet"], n=6)
    output = tmp_path / "out" / "data-manifest-v1.json"
    done: list[int] = []
    tokenize_dataset(paths, output, progress=done.append)
    assert sum(done) == len(paths)  # what o41 tokenize's progress bar counts
    field = ProjectedField("tokens", "tokens", "i32", length=8, pad=-1)
    batches = collect(config_for([ManifestSource(str(output), "train")], [field], batch_size=12))
    expected = [([*t.encode(), 256] + [-1] * 8)[:8] for t in texts]
    assert batches[0]["tokens"].tolist() == expected
    document = json.loads(output.read_text())
    document["splits"]["train"]["shards"][1]["metadata"]["tokenizer"]["eos_id"] = 0
    output.write_text(json.dumps(document))
    with pytest.raises(DataError, match="encoded with") as info:
        TokenizerIdentity.from_manifest(load_manifest(output))
    assert info.value.field == "metadata.tokenizer"


def test_a_tokenizer_json_built_offline_encodes_as_the_tokenizers_package_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_json: Path
) -> None:
    from tokenizers import Tokenizer

    paths, texts = inputs(tmp_path / "in", ["jsonl.gz", "parquet"], n=60, field="body")
    output = tmp_path / "out" / "data-manifest-v1.json"
    argv = ["tokenize", *paths, "--output", str(output), "--tokenizer", str(tokenizer_json)]
    assert main([*argv, "--text-field", "body", "--batch-size", "7", "--tokens-per-shard", "300"]) == 0
    reference = Tokenizer.from_file(str(tokenizer_json))
    eos = reference.token_to_id("<|endoftext|>")
    expected = [[*reference.encode(t, add_special_tokens=False).ids, eos] for t in texts]
    assert tokens_of(output) == expected
    identity = TokenizerIdentity.from_manifest(load_manifest(output))
    assert identity == TokenizerIdentity(
        kind="tokenizers",
        vocab_size=reference.get_vocab_size(with_added_tokens=True),
        eos_id=eos,
        sha256=hashlib.sha256(tokenizer_json.read_bytes()).hexdigest(),
    )
    out = capsys.readouterr().out
    assert f"tokens in {len(load_manifest(output).splits['train'].shards)} shards" in out
    # --eos picks another token of the vocabulary.
    other = tmp_path / "other" / "data-manifest-v1.json"
    assert (
        main(
            [
                "tokenize",
                paths[0],
                "--output",
                str(other),
                "--tokenizer",
                str(tokenizer_json),
                "--text-field",
                "body",
                "--eos",
                "<pad>",
            ]
        )
        == 0
    )
    pad = reference.token_to_id("<pad>")
    assert {doc[-1] for doc in tokens_of(other)} == {pad}


def test_a_restart_after_sigkill_publishes_the_uninterrupted_dataset(tmp_path: Path) -> None:
    # Enough shards that the job is still running when the test sees its first descriptors.
    paths, _ = inputs(tmp_path / "in", ["jsonl", "parquet", "jsonl.gz"] * 2, n=400)
    reference = tmp_path / "reference" / "data-manifest-v1.json"
    options = ["--tokens-per-shard", "300", "--batch-size", "16"]
    assert main(["tokenize", *paths, "--output", str(reference), *options]) == 0
    output = tmp_path / "out" / "data-manifest-v1.json"
    o41 = str(Path(sys.executable).parent / "o41")
    job = subprocess.Popen(
        [o41, "tokenize", *paths, "--output", str(output), *options], stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while len(descriptors(output)) < 5:
        assert job.poll() is None, "the job ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(job.pid, signal.SIGKILL)
    assert job.wait() == -signal.SIGKILL
    completed = [json.loads(p.read_text()) for p in descriptors(output)]
    total = load_manifest(reference).splits["train"].shards
    assert not output.exists()
    assert 5 <= len(completed) < len(total)

    class Counting(TextTokenizer):
        """The byte tokenizer, counting the documents it is asked to encode."""

        encoded = 0

        def encode_batch(self, texts: Sequence[str]) -> Any:
            Counting.encoded += len(texts)
            return super().encode_batch(texts)

    result = tokenize_dataset(paths, output, tokenizer=Counting.byte(), tokens_per_shard=300, batch_size=16)
    assert shard_files(output) == shard_files(reference)
    assert result.documents == sum(s.rows for s in total)
    # Completed shards were recovered, not tokenised again.
    assert Counting.encoded == result.documents - sum(d["rows"] for d in completed)


def test_a_kill_between_a_shards_data_and_its_descriptor_is_repaired(
    tmp_path: Path, tokenizer_json: Path
) -> None:
    paths, _ = inputs(tmp_path / "in", ["jsonl", "msgpack"], n=50)
    options = ["--tokenizer", str(tokenizer_json), "--tokens-per-shard", "200"]
    reference = tmp_path / "reference" / "data-manifest-v1.json"
    assert main(["tokenize", *paths, "--output", str(reference), *options]) == 0
    output = tmp_path / "out" / "data-manifest-v1.json"
    argv = ["tokenize", *paths, "--output", str(output), *options]
    job = subprocess.run(
        [sys.executable, str(TESTS / "tokenize_jobs.py"), "4", "--", *argv], check=False, capture_output=True
    )
    assert job.returncode == -signal.SIGKILL
    saved = [p for p in output.parent.rglob("shard-*") if not p.name.endswith(".done.json")]
    done = descriptors(output)
    assert len(done) == 3
    assert len(saved) == 4  # the fourth shard's data object, without its descriptor
    assert not output.exists()
    assert main(argv) == 0
    assert shard_files(output) == shard_files(reference)


def test_ray_tasks_tokenize_the_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer_json: Path
) -> None:
    import ray
    from ray._private import ray_constants

    paths, _ = inputs(tmp_path / "in", ["jsonl", "parquet", "jsonl.gz"], n=30)
    local = tmp_path / "local" / "data-manifest-v1.json"
    tokenize_dataset(paths, local, tokenizer=tokenizer_json, tokens_per_shard=200)
    # As in the saver's Ray test: workers run the driver's interpreter, on loopback only.
    monkeypatch.setattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"py_executable": sys.executable},
    )
    try:
        spread = tmp_path / "ray" / "data-manifest-v1.json"
        result = tokenize_dataset(
            paths,
            spread,
            tokenizer=tokenizer_json,
            tokens_per_shard=200,
            ray_address="auto",
        )
    finally:
        ray.shutdown()
    assert shard_files(spread) == shard_files(local)
    assert result.documents == 90
    assert result.tokens == sum(len(doc) for doc in tokens_of(local))


def test_a_restart_with_another_tokenizer_or_options_is_refused(tmp_path: Path, tokenizer_json: Path) -> None:
    paths, _ = inputs(tmp_path / "in", ["jsonl"], n=30)
    output = tmp_path / "out" / "data-manifest-v1.json"
    tokenize_dataset(paths, output, tokens_per_shard=100)
    with pytest.raises(
        ConfigError, match=r"train/_/shard-00000-000000\.parquet was written by another job"
    ) as info:
        tokenize_dataset(paths, output, tokenizer=tokenizer_json, tokens_per_shard=100)
    assert info.value.option == "tokenizer"
    with pytest.raises(ConfigError) as info:
        tokenize_dataset(paths, output, tokens_per_shard=50)
    assert info.value.option == "tokens_per_shard"
    with pytest.raises(ConfigError, match="text_field: 'text'") as info:
        tokenize_dataset(paths, output, text_field="id", tokens_per_shard=100)
    assert info.value.option == "text_field"
    other, _ = inputs(tmp_path / "other", ["jsonl"], n=30)
    with pytest.raises(ConfigError, match="source") as info:
        tokenize_dataset(other, output, tokens_per_shard=100)
    assert info.value.option == "inputs"
    # Shards another job left in the output directory would join the manifest: refused, before
    # any work when no input of this job could have written them (input 0 is not redone).
    second = tmp_path / "second" / "data-manifest-v1.json"
    tokenize_dataset([*paths, *other], second, tokens_per_shard=100)
    second.unlink()
    for shard in (second.parent / "train" / "_").glob("shard-00000-*"):
        shard.unlink()
    with pytest.raises(
        ConfigError, match=r"shard-00001-000000\.parquet, which this job did not write"
    ) as info:
        tokenize_dataset(paths, second, tokens_per_shard=100)
    assert info.value.option == "output"
    assert not list((second.parent / "train" / "_").glob("shard-00000-*"))
    # ... and after the work when only the job can tell (a shard named as one of its own).
    third = tmp_path / "third" / "data-manifest-v1.json"
    DatasetSaver(third).save("train", None, [{"tokens": [1, 256]}], shard_id="00000-000099")
    with pytest.raises(ConfigError, match=r"shard-00000-000099\.parquet, which this job did not write"):
        tokenize_dataset(paths, third, tokens_per_shard=100)
    assert (third.parent / "train/_/shard-00000-000000.parquet.done.json").exists()
    assert not third.exists()
    assert not second.exists()


def test_bad_records_are_refused_naming_file_row_and_field(tmp_path: Path) -> None:
    out = tmp_path / "out" / "data-manifest-v1.json"
    for encoding in ["jsonl", "msgpack"]:
        path = write_shard(
            tmp_path / f"bad.{encoding}", encoding, [{"text": "a"}, {"text": "b"}, {"title": "c"}]
        )
        with pytest.raises(DataError, match=r"bad\.\w+, record 2, field 'text': missing") as info:
            tokenize_dataset([path], out)
        assert (info.value.path, info.value.row, info.value.field) == (str(path), 2, "text")
    numbers = write_shard(tmp_path / "numbers.jsonl", "jsonl", [{"text": "a"}, {"text": 7}])
    with pytest.raises(DataError, match=r"record 1, field 'text': a int, not text"):
        tokenize_dataset([numbers], out)
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"text": "ok"}\n{"text": "\\ud800"}\n')
    # Text that is not Unicode is a malformed record to the engine's reader.
    with pytest.raises(MalformedShardError, match=r"surrogate\.jsonl, row 1: malformed jsonl shard") as info:
        tokenize_dataset([surrogate], out)
    assert (info.value.path, info.value.row) == (str(surrogate), 1)
    parquet = write_shard(tmp_path / "p.parquet", "parquet", [{"body": "a"}])
    with pytest.raises(
        DataError, match=r"p\.parquet: no column 'text' to tokenise \(text_field\); it has body"
    ):
        tokenize_dataset([parquet], out)
    ints = write_shard(tmp_path / "ints.parquet", "parquet", [{"text": 1}])
    with pytest.raises(DataError, match=r"ints\.parquet, field 'text': a int64 column, not text"):
        tokenize_dataset([ints], out)
    nulls = write_shard(tmp_path / "nulls.parquet", "parquet", [{"text": "a"}, {"text": None}])
    with pytest.raises(DataError, match=r"nulls\.parquet, record 1, field 'text': missing"):
        tokenize_dataset([nulls], out)
    assert not out.exists()


def test_bad_options_are_refused_naming_them(tmp_path: Path, tokenizer_json: Path) -> None:
    paths, _ = inputs(tmp_path / "in", ["jsonl"], n=3)
    out = tmp_path / "out" / "data-manifest-v1.json"

    def refused(option: str, match: str, *args: Any, **kwargs: Any) -> None:
        with pytest.raises(ConfigError, match=match) as info:
            tokenize_dataset(*args, **kwargs)
        assert info.value.option == option

    refused("inputs", "no input shard", [], out)
    refused("inputs", "listed twice", [paths[0], paths[0]], out)
    refused("input_format", "no known suffix", [tmp_path / "x.txt"], out)
    refused("input_format", "'csv' is not one of", paths, out, input_format="csv")
    refused("tokens_per_shard", "at least 1", paths, out, tokens_per_shard=0)
    refused("eos", "byte tokenizer's eos is always 256", paths, out, eos="</s>")
    refused("eos", "'<nope>' is not a token of", paths, out, tokenizer=tokenizer_json, eos="<nope>")
    not_a_tokenizer = tmp_path / "tokenizer.json"
    not_a_tokenizer.write_text('{"model": 1}')
    refused(
        "tokenizer",
        r"tokenizer\.json is not a Hugging Face tokenizer\.json",
        paths,
        out,
        tokenizer=not_a_tokenizer,
    )
    # A tokenizer without any of the usual end of document tokens needs --eos.
    from tokenizers import Tokenizer, models

    bare = tmp_path / "bare.json"
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(bare))
    refused("eos", "none of the usual end of document tokens", paths, out, tokenizer=bare)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        tokenize_dataset(paths, out, tokenizer=tmp_path / "missing.json")
    assert not out.exists()


def test_without_the_tokenizers_package_the_error_names_the_extra(
    tmp_path: Path, tokenizer_json: Path
) -> None:
    paths, texts = inputs(tmp_path / "in", ["jsonl"], n=5)
    # A Python where `tokenizers` cannot be imported, as in an install without the extra.
    script = (
        "import sys; sys.modules['tokenizers'] = None\n"
        "from o41_training_data import tokenize_dataset\n"
        f"tokenize_dataset([{paths[0]!r}], {str(tmp_path / 'byte' / 'm.json')!r})\n"
        f"tokenize_dataset([{paths[0]!r}], {str(tmp_path / 'hf' / 'm.json')!r},"
        f" tokenizer={str(tokenizer_json)!r})\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert run.returncode == 1
    assert "ImportError: reading the tokenizer" in run.stderr
    assert "pip install 'o41-training-data[tokenize]'" in run.stderr
    # The byte tokenizer needed no extra.
    assert tokens_of(tmp_path / "byte" / "m.json") == [[*t.encode(), 256] for t in texts]


def test_an_empty_input_contributes_no_shard(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    paths, texts = inputs(tmp_path / "in", ["jsonl"], n=4)
    out = tmp_path / "out" / "data-manifest-v1.json"
    result = tokenize_dataset([empty, *paths], out)
    assert (result.documents, len(result.manifest.splits["train"].shards)) == (4, 1)
    assert result.manifest.splits["train"].shards[0].location == "train/_/shard-00001-000000.parquet"
    assert tokens_of(out) == [[*t.encode(), 256] for t in texts]


def test_inputs_tokenizer_and_output_in_object_storage(
    tmp_path: Path, s3_server: Any, boto3_client: Any, s3_prefix: str, tokenizer_json: Path
) -> None:
    from tokenizers import Tokenizer

    storage = data_for(s3_server).storage_config
    local, texts = inputs(tmp_path / "in", ["jsonl.gz", "parquet"], n=20)
    remote = [upload(boto3_client, Path(p), f"{s3_prefix}in/{Path(p).name}") for p in local]
    remote_tokenizer = upload(boto3_client, tokenizer_json, f"{s3_prefix}tokenizer.json")
    output = f"{s3_prefix}tokens/data-manifest-v1.json"
    options: dict[str, Any] = {"tokenizer": remote_tokenizer, "tokens_per_shard": 200}
    result = tokenize_dataset(remote, output, storage=storage, **options)
    reference = Tokenizer.from_file(str(tokenizer_json))
    eos = reference.token_to_id("<|endoftext|>")
    records = [
        list(r["tokens"])
        for shard in result.manifest.splits["train"].shards
        for r in iter_shard("parquet", shard, storage_config=storage)
    ]
    assert records == [[*reference.encode(t, add_special_tokens=False).ids, eos] for t in texts]
    assert result.tokenizer.sha256 == hashlib.sha256(tokenizer_json.read_bytes()).hexdigest()
    # Run again: every shard is recovered and the same manifest is committed again (a no-op).
    again = tokenize_dataset(remote, output, storage=storage, **options)
    assert again.manifest == result.manifest


def test_input_format_split_and_batch_size(tmp_path: Path) -> None:
    paths, texts = inputs(tmp_path / "in", ["jsonl"], n=30)
    unsuffixed = tmp_path / "in" / "corpus.txt"
    Path(paths[0]).rename(unsuffixed)
    one = tmp_path / "one" / "data-manifest-v1.json"
    options: dict[str, Any] = {"input_format": "jsonl", "split": "valid", "tokens_per_shard": 120}
    result = tokenize_dataset([unsuffixed], one, batch_size=1, **options)
    assert list(result.manifest.splits) == ["valid"]
    assert tokens_of(one, "valid") == [[*t.encode(), 256] for t in texts]
    # Shard boundaries do not depend on how many documents are encoded at once.
    many = tmp_path / "many" / "data-manifest-v1.json"
    tokenize_dataset([unsuffixed], many, batch_size=1000, **options)
    assert shard_files(many) == shard_files(one)
    assert len(result.manifest.splits["valid"].shards) > 1
