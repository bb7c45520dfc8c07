"""Tokenizers a token dataset is encoded with, and the identity its manifest records.

The built-in byte tokenizer, and a Hugging Face ``tokenizer.json`` read with ``tokenizers``.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ._errors import DataError
from ._errors import invalid as _invalid
from ._manifest import DataManifest
from ._storage import StorageConfig, normalize

__all__ = ["BYTE_EOS", "TextTokenizer", "TokenizerIdentity", "data_error"]

BYTE_EOS = 256
"""The byte tokenizer's end of document id: one past the 256 byte values."""
# End-of-document tokens looked for, in this order, when a tokenizer.json is given without eos.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
_EXTRA_HINT = "pip install 'o41-training-data[tokenize]'"


def data_error(message: str, path: str, row: int | None = None, field: str | None = None) -> DataError:
    """A :class:`DataError` naming the shard, record and field at fault."""
    error = DataError(message)
    error.path, error.row, error.field = path, row, field
    return error


@dataclass(frozen=True)
class TokenizerIdentity:
    """What a token dataset was encoded with, as every shard's manifest metadata records it.

    ``kind`` is ``"byte"`` (UTF-8 bytes 0-255, eos 256) or ``"tokenizers"`` (a Hugging Face
    ``tokenizer.json``); ``sha256`` is the hex SHA-256 of that file's bytes (``None`` for the
    byte tokenizer, which has no file).

    Examples:
        >>> TextTokenizer.byte().identity
        TokenizerIdentity(kind='byte', vocab_size=257, eos_id=256, sha256=None)

    """

    kind: str
    vocab_size: int
    eos_id: int
    sha256: str | None

    def to_metadata(self) -> dict[str, Any]:
        """The identity as the JSON object stored under ``metadata["tokenizer"]``."""
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "sha256": self.sha256,
        }

    @classmethod
    def from_manifest(cls, manifest: DataManifest) -> TokenizerIdentity:
        """The identity every shard of a tokenised dataset records; raises if any shard differs.

        Raises :class:`DataError` naming the first shard that records no tokenizer or another one.

        Examples:
            >>> manifest = load_manifest("tokens/data-manifest-v1.json")  # doctest: +SKIP
            >>> TokenizerIdentity.from_manifest(manifest)  # doctest: +SKIP
            TokenizerIdentity(kind='byte', vocab_size=257, eos_id=256, sha256=None)

        """
        found: TokenizerIdentity | None = None
        for split in manifest.splits.values():
            for shard in split.shards:
                recorded = shard.metadata.get("tokenizer")
                try:
                    identity = cls(**recorded) if isinstance(recorded, dict) else None
                except TypeError:
                    identity = None
                if identity is None:
                    raise data_error(
                        f"{shard.path or shard.location}: its manifest metadata records no tokenizer "
                        "(metadata.tokenizer); it was not written by o41 tokenize",
                        shard.path or shard.location,
                        field="metadata.tokenizer",
                    )
                if found is not None and identity != found:
                    raise data_error(
                        f"{shard.path or shard.location}: encoded with {identity}, other shards with {found}",
                        shard.path or shard.location,
                        field="metadata.tokenizer",
                    )
                found = identity
        if found is None:
            raise DataError(f"{manifest.uri or 'the manifest'}: has no shards to read a tokenizer from")
        return found


class TextTokenizer:
    """Turns documents into int32 token ids, each document ending with the eos id.

    :meth:`byte` is built in: a document's UTF-8 bytes (ids 0-255) then eos 256.
    :meth:`from_file` loads a Hugging Face ``tokenizer.json`` with the ``tokenizers`` package
    (the ``[tokenize]`` extra), without network access; its batch encoder runs in Rust threads
    outside the GIL. Special tokens of the tokenizer's post-processor (BOS, CLS...) are not
    added: a document is its text's tokens, then eos.

    Pickles as its ``tokenizer.json`` text, so Ray tasks and worker processes need no file.

    Examples:
        >>> offsets, ids = TextTokenizer.byte().encode_batch(["hi", ""])
        >>> offsets.tolist(), ids.tolist()
        ([0, 3, 4], [104, 105, 256, 256])

    """

    def __init__(self, identity: TokenizerIdentity, source: str, tokenizer_json: str | None = None) -> None:
        self.identity = identity
        """Kind, vocabulary size, eos id and file hash."""
        self.source = source
        """``"byte"`` or the location the ``tokenizer.json`` was read from."""
        self._json = tokenizer_json
        self._hf: Any = None

    @classmethod
    def byte(cls) -> TextTokenizer:
        """The built-in byte tokenizer: vocabulary 257, eos 256."""
        return cls(TokenizerIdentity("byte", 257, BYTE_EOS, None), "byte")

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        eos: str | None = None,
        *,
        storage: StorageConfig | None = None,
    ) -> TextTokenizer:
        """A Hugging Face ``tokenizer.json`` (local path or ``s3://`` location) and its eos token.

        ``eos`` names the end of document token; omitted, the first of ``<|endoftext|>``,
        ``</s>``, ``<eos>``, ``<|end_of_text|>`` the vocabulary has. Raises ``ImportError`` naming
        the ``[tokenize]`` extra without the ``tokenizers`` package, and :class:`ConfigError`
        (``option`` ``tokenizer`` or ``eos``) for a file that is no tokenizer or an unknown eos.
        """
        uri = normalize(path)
        data = bytes((storage or StorageConfig()).core().read(uri))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise _invalid("tokenizer", f"{uri} is not a tokenizer.json (not UTF-8: {err})") from None
        identity_hash = hashlib.sha256(data).hexdigest()
        hf = _load_tokenizers(text, uri)
        if eos is None:
            found = next((t for t in EOS_CANDIDATES if hf.token_to_id(t) is not None), None)
            if found is None:
                raise _invalid(
                    "eos",
                    f"{uri} has none of the usual end of document tokens ({', '.join(EOS_CANDIDATES)}); "
                    "name its eos token (--eos)",
                )
            eos = found
        eos_id = hf.token_to_id(eos)
        if eos_id is None:
            raise _invalid("eos", f"{eos!r} is not a token of {uri}")
        vocab_size = int(hf.get_vocab_size(with_added_tokens=True))
        if vocab_size > 2**31:
            raise _invalid("tokenizer", f"{uri} has {vocab_size} tokens, more than int32 ids can hold")
        tokenizer = cls(TokenizerIdentity("tokenizers", vocab_size, int(eos_id), identity_hash), uri, text)
        tokenizer._hf = hf
        return tokenizer

    def __getstate__(self) -> dict[str, Any]:
        return {"identity": self.identity, "source": self.source, "json": self._json}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["identity"], state["source"], state["json"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"TextTokenizer({self.source!r}, {self.identity})"

    def hf(self) -> Any:
        """The ``tokenizers.Tokenizer`` of a ``tokenizer.json`` (loaded on first use in a process)."""
        if self.identity.kind != "tokenizers":
            raise _invalid("tokenizer", "the byte tokenizer has no tokenizer.json")
        if self._hf is None:
            self._hf = _load_tokenizers(self._json or "", self.source)
        return self._hf

    def encode_batch(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
        """``(offsets, ids)``: document ``i`` is ``ids[offsets[i]:offsets[i + 1]]``, eos last."""
        if self.identity.kind == "byte":
            pieces: list[bytes] = [text.encode("utf-8") for text in texts]
            lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
            body: npt.NDArray[Any] = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        else:
            hf = self.hf()
            encode = getattr(hf, "encode_batch_fast", None) or hf.encode_batch
            encodings = encode(list(texts), add_special_tokens=False)
            lengths = np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings))
            body = np.fromiter(
                itertools.chain.from_iterable(e.ids for e in encodings),
                dtype=np.int32,
                count=int(lengths.sum()),
            )
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths + 1, out=offsets[1:])
        ids = np.empty(int(offsets[-1]), dtype=np.int32)
        ends = offsets[1:] - 1
        keep = np.ones(len(ids), dtype=bool)
        keep[ends] = False
        ids[keep] = body
        ids[ends] = self.identity.eos_id
        return offsets, ids


def _load_tokenizers(text: str, uri: str) -> Any:
    try:
        from tokenizers import Tokenizer  # type: ignore[import-untyped]
    except ImportError as err:
        raise ImportError(
            f"reading the tokenizer {uri} needs the `tokenizers` package: {_EXTRA_HINT}"
        ) from err
    try:
        return Tokenizer.from_str(text)
    except Exception as err:  # tokenizers raises a bare Exception for any malformed file
        raise _invalid("tokenizer", f"{uri} is not a Hugging Face tokenizer.json ({err})") from None
