"""Corpora named every way ``docs/corpora.md`` recommends, for each front door's resume matrix.

A stream over each must resume with its config: the same-stream check compares the names the
config gives, not the files they resolved to.
"""

from __future__ import annotations

from pathlib import Path

from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Shuffle, Stage

from .corpora import token_corpus, write_mds_tokens_plain, write_megatron_plain

__all__ = ["NAMING_FORMS", "named_corpus", "naming_config"]

NAMING_FORMS = (
    "megatron-idx",
    "megatron-prefix",
    "megatron-bin",
    "save-to-disk",
    "dataset-dict-split",
    "mds-directory",
)
"""Every form a corpus read in place may be named by: a Megatron dataset by its ``.idx``, its
common prefix or its ``.bin``; a ``datasets`` ``save_to_disk`` directory, a split of a saved
``DatasetDict``; an MDS dataset directory. Each names several shards or another file than
itself."""

LENGTHS = [5, 3, 8, 1, 6, 4, 7, 2, 5, 3, 6, 8, 2, 4, 7, 1, 3, 5, 6, 2, 4, 8, 3, 5]
WIDTH = 8


def named_corpus(form: str, directory: Path) -> FileSource:
    """The source naming, as ``form`` says, a corpus of ``LENGTHS`` documents written into ``directory``.

    Every corpus holds its ids under ``tokens``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    docs = token_corpus(LENGTHS)
    if form.startswith("megatron"):
        idx = write_megatron_plain(directory / "corpus", docs)
        if form == "megatron-idx":
            return FileSource(files=[str(idx)])
        name = str(directory / "corpus") + (".bin" if form == "megatron-bin" else "")
        return FileSource(files=[name], encoding="megatron")
    if form in ("save-to-disk", "dataset-dict-split"):
        import datasets  # type: ignore[import-untyped]

        # Several Arrow files: the directory stands for more shards than the one name.
        corpus = datasets.Dataset.from_dict({"tokens": docs})
        if form == "save-to-disk":
            corpus.save_to_disk(str(directory / "corpus"), num_shards=3)
            return FileSource(files=[str(directory / "corpus")], encoding="arrow")
        split = datasets.DatasetDict({"train": corpus, "test": corpus.select(range(4))})
        split.save_to_disk(str(directory / "corpus"), num_shards={"train": 3, "test": 1})
        return FileSource(files=[str(directory / "corpus" / "train")], encoding="arrow")
    if form == "mds-directory":
        return FileSource(
            files=[str(write_mds_tokens_plain(directory / "corpus", docs, per_shard=7))], encoding="mds"
        )
    raise ValueError(f"unknown naming form {form!r}; expected one of {', '.join(NAMING_FORMS)}")


def naming_config(source: FileSource, *, infinite: bool = False, seed: int = 3) -> BatchStreamConfig:
    """A shuffled record stage over ``source``, two rows a batch.

    Each row is a document's ids (pad -1) and its ``@row_id``.
    """
    return BatchStreamConfig(
        fields=[
            ProjectedField(name="ids", source="tokens", dtype="i64", length=WIDTH, pad=-1),
            ProjectedField(name="row_id", source="@row_id", dtype="i64"),
        ],
        stages=[
            Stage(
                sources=[source], batch_size=2, shuffle=Shuffle(buffer_rows=8, unit_rows=1), infinite=infinite
            )
        ],
        seed=seed,
        threads=1,
    )
