"""Conversations rendered with a tokenizer's chat template, tokenised with an assistant loss mask.

The template is Jinja, rendered by ``jinja2`` in the sandbox and with the settings Hugging Face
``transformers`` renders it with (``trim_blocks``, ``lstrip_blocks``, loop controls, its
``tojson``, ``raise_exception`` and ``strftime_now``), so that the text, and so the token ids,
equal ``apply_chat_template(..., tokenize=True)``. The loss mask follows
``return_assistant_tokens_mask=True``: the characters a template wraps in
``{% generation %}...{% endgeneration %}`` are the assistant's, and the tokens from the one
holding a block's first character to the one holding its last are masked in. See ``docs/post_training.md``.

A template is code from whoever published the tokenizer, so its render is bounded as well as
sandboxed (``_chat_sandbox``): past a bound it stops with a :class:`DataError` naming the template
and the bound.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ._chat_sandbox import (
    MAX_LOOP_ITERATIONS,
    MAX_OUTPUT_CHARS,
    MAX_RENDER_SECONDS,
    _bound_tree,
    _BoundError,
    _check_binop,
    _constant_binops,
    _jinja_environment,
    _limit,
    _Limits,
    _marks_generation,
    _Render,
)
from ._errors import DataError
from ._errors import invalid as _invalid
from ._storage import StorageConfig, normalize
from ._tokenizer import TextTokenizer

__all__ = ["ROLE_IDS", "ChatEncoder", "ChatEncoding", "ChatTemplate", "RenderedChat"]

LossOn = Literal["all", "last"]
"""Which assistant turns count towards the loss: every one, or the last only."""

ROLE_IDS: Mapping[str, int] = {"template": 0, "system": 1, "user": 2, "assistant": 3, "tool": 4, "other": 5}
"""The per-token role ids :class:`ChatEncoder` gives with ``role_ids=True``: the role of the
message whose content a token renders (``other`` for a role not listed), ``template`` for the
template's own text (headers, separators); every token the template marks as generated is
``assistant``."""

# The special tokens a template may name, as tokenizer_config.json holds them.
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class RenderedChat:
    """A conversation rendered as text, with the character spans the assistant wrote.

    ``assistant_spans`` are ``(start, end)`` character offsets of ``text``, in order, one per
    ``{% generation %}`` block the template rendered.
    """

    text: str
    assistant_spans: tuple[tuple[int, int], ...]


class ChatTemplate:
    """A chat template: Jinja text and the special tokens it may name.

    Build one from a ``tokenizer_config.json`` (:meth:`from_tokenizer_config`) or from the
    template text. :meth:`render` turns a conversation (a list of ``{"role", "content"}``
    messages) into text and the character spans the template marks as the assistant's.

    A render is bounded: ``max_output_chars`` characters written (and the longest text or list
    it may build), ``max_loop_iterations`` loop iterations and ``max_render_seconds`` seconds;
    past one it fails with a :class:`DataError` naming the template (``name``, the file it came
    from) and the bound. The defaults are far past what any real template needs.

    Examples:
        >>> template = ChatTemplate(
        ...     "{% for m in messages %}<{{ m['role'] }}>{% if m['role'] == 'assistant' %}"
        ...     "{% generation %}{{ m['content'] }}</s>{% endgeneration %}{% else %}"
        ...     "{{ m['content'] }}{% endif %}{% endfor %}"
        ... )
        >>> template.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
        RenderedChat(text='<user>hi<assistant>yo</s>', assistant_spans=((19, 25),))

    """

    def __init__(
        self,
        template: str,
        special_tokens: Mapping[str, str] | None = None,
        *,
        name: str | None = None,
        max_output_chars: int = MAX_OUTPUT_CHARS,
        max_loop_iterations: int = MAX_LOOP_ITERATIONS,
        max_render_seconds: float = MAX_RENDER_SECONDS,
    ) -> None:
        if not isinstance(template, str) or not template:
            raise _invalid("chat_template", "expected the template's Jinja text")
        self.template = template
        """The Jinja text."""
        self.special_tokens = dict(special_tokens or {})
        """``bos_token``, ``eos_token``, ... as the template sees them."""
        self.name = name
        """Where the template came from (its ``tokenizer_config.json``), named in errors."""
        self._limits = _Limits(
            _limit("max_output_chars", max_output_chars, int),
            _limit("max_loop_iterations", max_loop_iterations, int),
            float(_limit("max_render_seconds", max_render_seconds, float)),
        )
        self._render = _Render(self._limits)
        self._environment = _jinja_environment(self._render)
        where = f"{name}: " if name else ""
        try:
            tree = self._environment.parse(template)
        except Exception as err:  # jinja2.TemplateSyntaxError, with its line
            raise _invalid("chat_template", f"{where}not a valid Jinja template ({_describe(err)})") from None
        self._marks_generation = _marks_generation(tree)
        for node in _constant_binops(tree):
            try:
                _check_binop(self._render, node.operator, node.left.value, node.right.value)
            except _BoundError as err:
                raise _invalid(
                    "chat_template", f"{where}line {node.lineno}: {err} ({err.bound}, docs/post_training.md)"
                ) from None
        try:
            bounded = _bound_tree(tree)
            bounded.set_environment(self._environment)
            code = self._environment.compile(bounded)
            self._compiled = self._environment.template_class.from_code(
                self._environment, code, self._environment.make_globals(None), None
            )
        except Exception as err:
            raise _invalid("chat_template", f"{where}not a valid Jinja template ({_describe(err)})") from None

    @property
    def marks_generation(self) -> bool:
        """Whether the template wraps the assistant's output in ``{% generation %}`` blocks.

        Read from the parsed template, so a block inside a comment or ``{% raw %}`` is no mark.
        """
        return self._marks_generation

    @property
    def limits(self) -> dict[str, float]:
        """The render's bounds by keyword (``max_output_chars``, ``max_loop_iterations``, ...)."""
        return {
            "max_output_chars": self._limits.output,
            "max_loop_iterations": self._limits.loops,
            "max_render_seconds": self._limits.seconds,
        }

    @classmethod
    def from_tokenizer_config(
        cls,
        path: str | os.PathLike[str],
        name: str | None = None,
        *,
        storage: StorageConfig | None = None,
        max_output_chars: int = MAX_OUTPUT_CHARS,
        max_loop_iterations: int = MAX_LOOP_ITERATIONS,
        max_render_seconds: float = MAX_RENDER_SECONDS,
    ) -> ChatTemplate:
        """The chat template of a ``tokenizer_config.json`` (local path or ``s3://``).

        ``chat_template`` is the template's text, or a list of named templates
        (``[{"name": ..., "template": ...}]``) of which ``name`` picks one (``default`` when
        omitted). A ``chat_template.jinja`` beside the file, as newer tokenizers save it, is
        used when the config holds none. Raises :class:`ConfigError` naming the file. The
        bounds are :class:`ChatTemplate`'s.
        """
        uri = normalize(path, "tokenizer_config")
        store = (storage or StorageConfig()).core()
        try:
            config = json.loads(bytes(store.read(uri)).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise _invalid("tokenizer_config", f"{uri} is not JSON ({err})") from None
        if not isinstance(config, dict):
            raise _invalid("tokenizer_config", f"{uri} is not a JSON object")
        template = config.get("chat_template")
        source = uri
        if template is None:
            source = uri.rsplit("/", 1)[0] + "/chat_template.jinja"
            try:
                template = bytes(store.read(source)).decode("utf-8")
            except Exception:
                raise _invalid(
                    "tokenizer_config", f"{uri} has no chat_template, nor is there {source}"
                ) from None
        if isinstance(template, list):
            named = _named_templates(uri, template)
            wanted = name or "default"
            if wanted not in named:
                raise _invalid(
                    "chat_template_name",
                    f"{uri} has no template named {wanted!r}; it has {', '.join(map(repr, named))}",
                )
            template, source = named[wanted], f"{uri} (template {wanted!r})"
        elif name is not None:
            raise _invalid("chat_template_name", f"{uri} has one unnamed template, not {name!r}")
        if not isinstance(template, str):
            raise _invalid("tokenizer_config", f"{uri}: chat_template is not text")
        tokens = {}
        for key in _SPECIAL_TOKENS:
            value = config.get(key)
            if isinstance(value, dict):  # an AddedToken as saved: {"content": ..., ...}
                value = value.get("content")
            if isinstance(value, str):
                tokens[key] = value
        return cls(
            template,
            tokens,
            name=source,
            max_output_chars=max_output_chars,
            max_loop_iterations=max_loop_iterations,
            max_render_seconds=max_render_seconds,
        )

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **switches: Any,
    ) -> RenderedChat:
        """The conversation as text, with the assistant's spans.

        ``switches`` are the template's own variables (``enable_thinking=False``, ...).
        Raises :class:`DataError` when the template refuses the conversation (its
        ``raise_exception``, such as roles that do not alternate) or passes a bound.
        """
        blocks: list[str] = []
        spans: list[tuple[int, int]] = []
        render = self._render
        render.start(blocks, spans)
        try:
            for block in self._compiled.generate(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                **{**self.special_tokens, **switches},
            ):
                blocks.append(block)
                render.length += len(block)
        except _BoundError as err:
            raise DataError(
                f"the chat template{self._named} stopped: {err} ({err.bound}; "
                f"ChatTemplate({err.bound}=...) sets it, docs/post_training.md)"
                if err.bound.startswith("max_")
                else f"the chat template{self._named} stopped: {err}"
            ) from None
        except Exception as err:
            raise DataError(
                f"the chat template{self._named} refused the conversation: {_describe(err)}"
            ) from None
        finally:
            render.stop()
        return RenderedChat("".join(blocks), tuple(spans))

    @property
    def _named(self) -> str:
        return f" {self.name}" if self.name else ""

    def __getstate__(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "special_tokens": self.special_tokens,
            "name": self.name,
            **self.limits,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def __repr__(self) -> str:
        named = f"{self.name!r}, " if self.name else ""
        return (
            f"ChatTemplate({named}{len(self.template)} characters, marks_generation={self.marks_generation})"
        )


def _describe(err: BaseException) -> str:
    """An exception as a message: its text, or its type where it has none (``MemoryError()``)."""
    text = str(err)
    return text if text else type(err).__name__


def _named_templates(uri: str, entries: list[Any]) -> dict[str, str]:
    """tokenizer_config.json's list of named templates, each checked: a text ``name`` and ``template``."""
    named: dict[str, str] = {}
    for k, entry in enumerate(entries):
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and isinstance(entry.get("template"), str)
        ):
            raise _invalid(
                "tokenizer_config",
                f'{uri}: chat_template[{k}] is not a named template ({{"name": text, "template": text}}): '
                f"{json.dumps(entry)[:80]}",
            )
        if entry["name"] in named:
            raise _invalid("tokenizer_config", f"{uri}: chat_template names {entry['name']!r} twice")
        named[entry["name"]] = entry["template"]
    return named


@dataclass(frozen=True)
class ChatEncoding:
    """One conversation's token ids and loss mask, of equal length, and its role ids if asked."""

    input_ids: npt.NDArray[np.int32]
    loss_mask: npt.NDArray[np.uint8]
    role_ids: npt.NDArray[np.uint8] | None = None
    """Each token's :data:`ROLE_IDS` code, with ``ChatEncoder(role_ids=True)``."""


class ChatEncoder:
    """Renders conversations with a template and tokenises them with a loss mask.

    ``loss_on="all"`` masks in every assistant turn, ``"last"`` the last one only. With
    ``role_ids=True`` each encoding also says who wrote each token (:data:`ROLE_IDS`): a message's
    content is found in the rendered text after the previous one's, its whitespace trimmed; a
    message whose content the template rewrites (not found verbatim) leaves its tokens at
    ``template``. The template must mark generation (``{% generation %}`` blocks;
    :class:`ConfigError` otherwise), since the mask is exactly what it marks. Ids are the
    tokenizer's for the rendered text with no special tokens added: the template writes them.

    One encoder renders one conversation at a time: give each thread its own.

    Examples:
        >>> encoder = ChatEncoder(TextTokenizer.from_file("tokenizer.json"), template)  # doctest: +SKIP
        >>> encoder.encode([{"role": "user", "content": "hi"}]).loss_mask  # doctest: +SKIP

    """

    def __init__(
        self,
        tokenizer: TextTokenizer,
        template: ChatTemplate,
        *,
        loss_on: LossOn = "all",
        role_ids: bool = False,
        **switches: Any,
    ) -> None:
        if tokenizer.identity.kind != "tokenizers":
            raise _invalid("tokenizer", "chat rendering needs a tokenizer.json (its offsets place the mask)")
        if loss_on not in ("all", "last"):
            raise _invalid("loss_on", f"expected 'all' or 'last', got {loss_on!r}")
        if not template.marks_generation:
            where = f"{template.name} " if template.name else "it "
            raise _invalid(
                "chat_template",
                f"{where}has no {{% generation %}} blocks, so it does not say which tokens the assistant "
                "wrote; use a template that marks them (docs/post_training.md)",
            )
        self.tokenizer = tokenizer
        self.template = template
        self.loss_on = loss_on
        self.role_ids = bool(role_ids)
        self.switches = switches

    def identity(self) -> dict[str, Any]:
        """What a token dataset records of this encoder: the template's hash, the options."""
        text = json.dumps([self.template.template, self.template.special_tokens], sort_keys=True)
        identity = {
            "template_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "loss_on": self.loss_on,
            "options": json.loads(json.dumps(self.switches, sort_keys=True, default=str)),
        }
        if self.role_ids:  # only when set: datasets written before the option stay recoverable
            identity["role_ids"] = True
        return identity

    def encode_batch(
        self,
        conversations: Sequence[Sequence[Mapping[str, Any]]],
        tools: Sequence[Sequence[Mapping[str, Any]] | None] | None = None,
    ) -> list[ChatEncoding]:
        """Each conversation's ids and mask; tokenised in one call to the Rust tokenizer.

        Raises :class:`DataError` for a conversation the template refuses or that is not text
        (a lone surrogate, which UTF-8 cannot encode), naming the conversation and the field.
        """
        rendered = [
            self.template.render(messages, tools=None if tools is None else tools[i], **self.switches)
            for i, messages in enumerate(conversations)
        ]
        for i, chat in enumerate(rendered):
            # isascii() is O(1) on CPython; the search only runs over other text.
            if not chat.text.isascii() and (found := _SURROGATE.search(chat.text)) is not None:
                raise _not_text(
                    conversations[i], None if tools is None else tools[i], found.group(), i, len(rendered)
                )
        try:
            encodings = self.tokenizer.hf().encode_batch([r.text for r in rendered], add_special_tokens=False)
        except Exception as err:
            raise DataError(f"the tokenizer refused a rendered conversation: {_describe(err)}") from None
        out = []
        for messages, chat, encoding in zip(conversations, rendered, encodings, strict=True):
            ids = np.asarray(encoding.ids, dtype=np.int32)
            mask = np.zeros(len(ids), dtype=np.uint8)
            spans = chat.assistant_spans[-1:] if self.loss_on == "last" else chat.assistant_spans
            for start, end in spans:
                _mark(encoding, (start, end), mask, 1)
            roles = None
            if self.role_ids:
                roles = np.zeros(len(ids), dtype=np.uint8)
                for span, role in _content_spans(chat.text, messages):
                    _mark(encoding, span, roles, ROLE_IDS.get(role, ROLE_IDS["other"]))
                for span in chat.assistant_spans:
                    _mark(encoding, span, roles, ROLE_IDS["assistant"])
            out.append(ChatEncoding(ids, mask, roles))
        return out

    def encode(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> ChatEncoding:
        """One conversation's ids and mask."""
        return self.encode_batch([messages], None if tools is None else [tools])[0]


def _not_text(messages: Any, tools: Any, surrogate: str, index: int, count: int) -> DataError:
    """The error for a conversation holding a lone surrogate, naming where it is."""
    where = _find_text(messages, "messages", surrogate) or _find_text(tools, "tools", surrogate)
    which = f"conversation {index}: " if count > 1 else ""
    place = where or "the rendered text (from the template's variables)"
    return DataError(
        f"{which}{place} holds a lone surrogate (U+{ord(surrogate):04X}), which is not text: "
        "UTF-8 cannot encode it, so no tokenizer can read it"
    )


def _find_text(value: Any, path: str, needle: str) -> str | None:
    """Where in ``value`` (messages, tools) a text holding ``needle`` is, as ``messages[1].content``."""
    if isinstance(value, str):
        return path if needle in value else None
    if isinstance(value, Mapping):
        items: Iterable[tuple[str, Any]] = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{path}[{k}]", v) for k, v in enumerate(value))
    else:
        return None
    for inner, item in items:
        if (found := _find_text(item, inner, needle)) is not None:
            return found
    return None


def _char_token(encoding: Any, position: int, count: int) -> int | None:
    """The token holding character ``position``, as ``Encoding.char_to_token`` finds it.

    ``char_to_token`` scans from the first token, so marking each turn of a long conversation
    was quadratic (almost 6 minutes for 18 MB in 18,679 messages). A sequence's offsets follow its text,
    both ends non-decreasing, so the first token ending after ``position`` is found by bisection
    (``token_to_chars`` is a lookup), and holds it if it starts at or before it.
    """
    low, high = 0, count
    while low < high:
        middle = (low + high) // 2
        if encoding.token_to_chars(middle)[1] <= position:
            low = middle + 1
        else:
            high = middle
    if low < count and encoding.token_to_chars(low)[0] <= position:
        return low
    return None


def _mark(encoding: Any, span: tuple[int, int], out: npt.NDArray[np.uint8], value: int) -> None:
    """Sets ``value`` on the tokens that hold ``span``'s characters.

    From the token holding its first character to the one holding its last, as ``transformers``
    places its assistant mask.
    """
    start, end = span
    if end <= start:
        return
    first = _char_token(encoding, start, len(out))
    last = _char_token(encoding, end - 1, len(out))
    if first is None:
        return
    out[first : (last + 1 if last is not None else len(out))] = value


def _content_spans(text: str, messages: Sequence[Mapping[str, Any]]) -> list[tuple[tuple[int, int], str]]:
    """Where each message's content (its text parts, trimmed) is in ``text``, with its role.

    Searched in order, each after the previous; a content the template rewrote is not found and
    has no span.
    """
    spans = []
    at = 0
    for message in messages:
        content = message.get("content")
        parts: list[str] = [content] if isinstance(content, str) else []
        if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
            parts = [
                str(p["text"]) for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
            ]
        for part in parts:
            needle = part.strip()
            found = text.find(needle, at) if needle else -1
            if found >= 0:
                spans.append(((found, found + len(needle)), str(message.get("role"))))
                at = found + len(needle)
    return spans
