"""Stream configs written as YAML or JSON files (``BatchStreamConfig.from_file``/``from_dict``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    ManifestSource,
    ObjectNotFoundError,
    ProjectedField,
    Shuffle,
    Stage,
)

YAML = """\
fields:
  - {name: tokens, source: input_ids, dtype: i32, length: 16, pad: 0}
  - {name: grid, source: grid, dtype: f64, shape: [2, 3], pad: 0.5}
stages:
  - sources:
      - files: [data/a.parquet, /abs/b.jsonl]
        encoding: null
        weight: 3
      - manifest_uri: s3://bucket/data-manifest-v1.json
        split: train
        curriculum_stages: [easy, medium]
    batch_size: 8
    shuffle: {buffer_rows: 64, unit_rows: 4}
    infinite: true
  - sources: [{kind: manifest, manifest_uri: m/data-manifest-v1.json, split: valid}]
    batch_size: 4
seed: 7
threads: 2
prefetch_batches: 3
rank: 1
world_size: 2
memory_limit_bytes: 1000000000
"""


def expected(base: Path) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=[
            ProjectedField(name="tokens", source="input_ids", dtype="i32", length=16, pad=0),
            ProjectedField(name="grid", source="grid", dtype="f64", shape=(2, 3), pad=0.5),
        ],
        stages=[
            Stage(
                sources=[
                    FileSource(files=[str(base / "data/a.parquet"), "/abs/b.jsonl"], weight=3),
                    ManifestSource(
                        manifest_uri="s3://bucket/data-manifest-v1.json",
                        split="train",
                        curriculum_stages=["easy", "medium"],
                    ),
                ],
                batch_size=8,
                shuffle=Shuffle(buffer_rows=64, unit_rows=4),
                infinite=True,
            ),
            Stage(
                sources=[ManifestSource(manifest_uri=str(base / "m/data-manifest-v1.json"), split="valid")],
                batch_size=4,
            ),
        ],
        seed=7,
        threads=2,
        prefetch_batches=3,
        rank=1,
        world_size=2,
        memory_limit_bytes=1_000_000_000,
    )


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_a_file_mirrors_the_config_and_its_relative_paths_follow_the_file(
    tmp_path: Path, suffix: str
) -> None:
    import yaml

    path = tmp_path / "conf" / f"stream{suffix}"
    path.parent.mkdir()
    document = yaml.safe_load(YAML)
    path.write_text(json.dumps(document) if suffix == ".json" else YAML)
    loaded = BatchStreamConfig.from_file(path)
    assert loaded.to_dict() == expected(path.parent).to_dict()


def test_to_dict_round_trips_through_from_dict(tmp_path: Path) -> None:
    config = expected(tmp_path)
    assert BatchStreamConfig.from_dict(config.to_dict()).to_dict() == config.to_dict()
    assert BatchStreamConfig.from_dict(json.loads(config.to_json())).to_json() == config.to_json()


@pytest.mark.parametrize(
    ("edit", "option", "words"),
    [
        (("    shuffle: {", "    shufle: {"), "stages[0].shufle", "unknown key 'shufle'"),
        (("    batch_size: 4\n", ""), "stages[1].batch_size", "missing required key"),
        (("buffer_rows: 64", "buffer_rows: lots"), "stages[0].shuffle.buffer_rows", "expected an integer"),
        (("dtype: i32", "dtype: int32"), "fields[0].dtype", "unknown dtype 'int32'"),
        (("weight: 3\n", "weight: -1\n"), "stages[0].sources[0].weight", "positive"),
        (
            ("- files: [data/a.parquet, /abs/b.jsonl]", "- files: data/a.parquet"),
            "stages[0].sources[0].files",
            "expected a list",
        ),
        (
            ("- files: [data/a.parquet, /abs/b.jsonl]", "- paths: [a]"),
            "stages[0].sources[0]",
            "needs 'files'",
        ),
        (("kind: manifest", "kind: table"), "stages[1].sources[0].kind", "unknown source kind"),
        (("length: 16, pad: 0}", "length: 16, shape: [16]}"), "fields[0]", "length or shape"),
        (("seed: 7", "seed: -7"), "seed", "between 0"),
        (("world_size: 2", "world_size: 2\ncolour: red"), "colour", "unknown key"),
    ],
)
def test_a_bad_key_is_named_with_the_file(
    tmp_path: Path, edit: tuple[str, str], option: str, words: str
) -> None:
    old, new = edit
    assert old in YAML
    path = tmp_path / "stream.yaml"
    path.write_text(YAML.replace(old, new, 1))
    with pytest.raises(ConfigError) as caught:
        BatchStreamConfig.from_file(path)
    assert caught.value.option == option
    assert caught.value.path == str(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: invalid {option}")
    assert words in message


def test_unreadable_documents_are_refused_naming_the_file(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "a.yaml"
    bad_yaml.write_text("fields: [\n  {name: x\nstages: 3\n")
    with pytest.raises(ConfigError, match=r"a\.yaml: not valid YAML at line \d+"):
        BatchStreamConfig.from_file(bad_yaml)
    bad_json = tmp_path / "a.json"
    bad_json.write_text('{"fields": [}\n')
    with pytest.raises(ConfigError, match=r"a\.json: not valid JSON at line 1"):
        BatchStreamConfig.from_file(bad_json)
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    with pytest.raises(
        ConfigError, match=r"list\.json: invalid config: expected a mapping at the top, got list"
    ):
        BatchStreamConfig.from_file(listed)
    toml = tmp_path / "a.toml"
    toml.write_text("seed = 1")
    with pytest.raises(ConfigError, match=r"a\.toml: unknown config file suffix '\.toml'"):
        BatchStreamConfig.from_file(toml)
    with pytest.raises(ObjectNotFoundError, match=r"missing\.yaml: no such config file") as caught:
        BatchStreamConfig.from_file(tmp_path / "missing.yaml")
    assert isinstance(caught.value, FileNotFoundError)


def test_yaml_without_pyyaml_names_the_extra(tmp_path: Path) -> None:
    path = tmp_path / "stream.yaml"
    path.write_text(YAML)
    json_path = tmp_path / "stream.json"
    json_path.write_text(json.dumps({"fields": [], "stages": []}))
    # A process where PyYAML cannot be imported: JSON configs still load, YAML ones say what to install.
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["yaml"] = None
        from o41_training_data import BatchStreamConfig, ConfigError
        try:
            BatchStreamConfig.from_file({str(json_path)!r})
        except ConfigError as error:
            assert error.option == "fields", error
        BatchStreamConfig.from_file({str(path)!r})
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert "ImportError: " in result.stderr
    assert "reading a YAML config needs PyYAML" in result.stderr
    assert "pip install 'o41-training-data[cli]'" in result.stderr
