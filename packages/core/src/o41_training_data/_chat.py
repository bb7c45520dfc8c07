"""Conversations rendered with a tokenizer's chat template, tokenised with an assistant loss mask.

The template is Jinja, rendered by ``jinja2`` in the sandbox and with the settings Hugging Face
``transformers`` renders it with (``trim_blocks``, ``lstrip_blocks``, loop controls, its
``tojson``, ``raise_exception`` and ``strftime_now``), so that the text, and so the token ids,
equal ``apply_chat_template(..., tokenize=True)``. The loss mask follows
``return_assistant_tokens_mask=True``: the characters a template wraps in
``{% generation %}...{% endgeneration %}`` are the assistant's, and the tokens from the one
holding a block's first character to the one holding its last are masked in. See ``docs/post_training.md``.

A template is code from whoever published the tokenizer, so its render is bounded as well as
sandboxed. The hooks the sandbox calls (every call, attribute and item, the operators ``*``,
``**``, ``%`` and ``+``) and two the template is compiled with (every loop iteration, every piece
of output) count the loop iterations and the characters written, check a deadline, and refuse
before building a value longer than the output bound wherever one step could build it (``'x' *
n``, a width, a ``replace`` or ``join``). Past a bound the render stops with a :class:`DataError`
naming the template and the bound; no thread or signal is involved.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

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
_EXTRA_HINT = "pip install 'o41-training-data[tokenize]'"

# The render bounds' defaults (docs/post_training.md). 64 Mi characters is some 16M tokens, past
# every model's context window; 4 Mi loop iterations are a few passes over a million messages;
# Qwen3's template renders 20,000 messages in about a second of the 30. No real conversation
# comes near one.
MAX_OUTPUT_CHARS = 1 << 26
MAX_LOOP_ITERATIONS = 1 << 22
MAX_RENDER_SECONDS = 30.0
# Python refuses to print an int of more digits (sys.int_info.default_max_str_digits); a template
# may not build one, nor spend the time a product or power of that size takes.
_MAX_INT_BITS = 4300 * 10 // 3
_GENERATION_METHOD = "_record"
_SURROGATE = re.compile("[\ud800-\udfff]")
# %-formatting (``%``, ``format``, ``strftime_now``): a field's width and precision.
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +_^]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class RenderedChat:
    """A conversation rendered as text, with the character spans the assistant wrote.

    ``assistant_spans`` are ``(start, end)`` character offsets of ``text``, in order, one per
    ``{% generation %}`` block the template rendered.
    """

    text: str
    assistant_spans: tuple[tuple[int, int], ...]


class _BoundError(Exception):
    """A render passed one of its bounds: ``bound`` names it, the message says how."""

    def __init__(self, bound: str, message: str) -> None:
        super().__init__(message)
        self.bound = bound


@dataclass(frozen=True)
class _Limits:
    output: int
    loops: int
    seconds: float


class _Render:
    """One render's state: its output so far, the generation spans found, and its counters.

    Outside a render (``blocks`` is ``None``) there is no deadline; the size checks always hold.
    """

    __slots__ = ("blocks", "deadline", "iterations", "length", "limits", "spans", "written")

    def __init__(self, limits: _Limits) -> None:
        self.limits = limits
        self.blocks: list[str] | None = None
        self.spans: list[tuple[int, int]] = []
        self.length = 0
        self.written = 0
        self.iterations = 0
        self.deadline = float("inf")

    def start(self, blocks: list[str], spans: list[tuple[int, int]]) -> None:
        self.blocks, self.spans = blocks, spans
        self.length = self.written = self.iterations = 0
        self.deadline = time.monotonic() + self.limits.seconds

    def stop(self) -> None:
        self.blocks, self.spans = None, []
        self.deadline = float("inf")

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _BoundError("max_render_seconds", f"the render took over {self.limits.seconds:g} s")

    def fits(self, size: int, what: str) -> None:
        """Refuses a value of ``size`` characters (made, or about to be) past the output bound."""
        if size > self.limits.output:
            raise _BoundError(
                "max_output_chars",
                f"{what} would be {size:,} characters, more than the {self.limits.output:,} "
                "a render may build",
            )

    def iterate(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """``iterable``, each item counted as a loop iteration (a ``for`` loop's, a recursive loop's)."""
        for item in iterable:
            self.iterations += 1
            if self.iterations > self.limits.loops:
                raise _BoundError(
                    "max_loop_iterations", f"the render passed {self.limits.loops:,} loop iterations"
                )
            self.tick()
            yield item

    def write(self, value: Any) -> str:
        """``value`` as the output writes it, counted against the output bound."""
        if not isinstance(value, str):
            self.fits(self.size(value), "a value written")
        text = str(value)
        self.written += len(text)
        if self.written > self.limits.output:
            raise _BoundError("max_output_chars", f"the render wrote over {self.limits.output:,} characters")
        self.tick()
        return text

    def size(self, value: Any) -> int:
        """About how many characters ``value`` prints as, counted up to past the output bound."""
        return _size(value, self.limits.output, self.tick)[0]

    def built(self, value: Any, what: str) -> Any:
        """``value``, a call's or filter's result, if it is within the output bound."""
        if isinstance(value, (str, bytes, list, tuple, dict)):
            self.fits(len(value), what)
        return value


def _items(value: Any) -> Iterator[Any] | None:
    """What a container prints (a list's items, a mapping's keys and values); ``None`` for the rest."""
    if isinstance(value, Mapping):
        return chain.from_iterable(value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return iter(value)
    if type(value).__name__ == "Namespace":  # jinja2's `namespace()`: prints its attributes
        attrs = getattr(value, "_Namespace__attrs", None)
        return chain.from_iterable(attrs.items()) if isinstance(attrs, dict) else None
    return None


def _size(value: Any, budget: int, tick: Callable[[], None] | None = None) -> tuple[int, int]:
    """About how many characters ``value`` prints as (``str``, JSON), and how deep it nests.

    Text counts its length, an int its digits, a list or mapping its items and two characters
    each. A container met again is counted from its first walk (``[s, s]`` nested 60 deep is
    sized in 120 steps, not 2**60; one holding itself prints ``[...]``), and the walk stops once
    past ``budget`` characters, calling ``tick`` (the deadline) as it goes.
    """
    walked: dict[int, tuple[int, int]] = {}  # a container's (size, depth); (5, 0) while it is walked
    items = _items(value)
    if items is None:
        return _leaf_size(value), 0
    walked[id(value)] = (5, 0)
    # Each open container: its items left, and its size and deepest child so far.
    stack: list[tuple[Any, Iterator[Any], int, int]] = [(value, items, 2, 0)]
    seen = 2  # characters counted so far, everywhere: the budget's measure
    steps = 0
    while stack:
        container, items, total, deepest = stack.pop()
        for item in items:
            steps += 1
            if tick is not None and steps % 65536 == 0:
                tick()
            inner = _items(item)
            if inner is not None and id(item) not in walked:
                walked[id(item)] = (5, 0)
                stack += [(container, items, total, deepest), (item, inner, 2, 0)]
                seen += 2
                break
            size, depth = (_leaf_size(item), 0) if inner is None else walked[id(item)]
            total, deepest, seen = total + size, max(deepest, depth), seen + size
            if seen > budget:
                return seen, deepest + 1
        else:
            walked[id(container)] = (total, deepest + 1)
            if not stack:
                return total, deepest + 1
            parent, rest, above, parent_deepest = stack.pop()
            stack.append((parent, rest, above + total, max(parent_deepest, deepest + 1)))
    raise AssertionError("the walk returns when its outermost container is done")


def _leaf_size(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value) + 2
    if isinstance(value, int):
        return value.bit_length() * 3 // 10 + 2
    return 2


def _int_bits(value: Any) -> int:
    return value.bit_length() if isinstance(value, int) else 0


def _check_binop(render: _Render, operator: str, left: Any, right: Any) -> None:
    """Refuses ``left <operator> right`` before Python builds it, if it would pass a bound."""
    if operator == "*":
        if isinstance(left, int) and not isinstance(right, int):
            left, right = right, left
        if isinstance(left, int) and isinstance(right, int):
            if _int_bits(left) + _int_bits(right) > _MAX_INT_BITS:
                raise _BoundError("int digits", "a product would pass Python's 4300-digit limit on an int")
        elif isinstance(right, int) and right > 1 and isinstance(left, (str, bytes, list, tuple)):
            unit = len(left) if isinstance(left, (str, bytes)) else render.size(left)
            render.fits(unit * right, f"{type(left).__name__} * {right:,}")
    elif operator == "**":
        if (
            isinstance(left, int)
            and isinstance(right, int)
            and abs(left) > 1
            and _int_bits(left) * right > _MAX_INT_BITS
        ):
            raise _BoundError("int digits", "a power would pass Python's 4300-digit limit on an int")
    elif operator == "+":
        if isinstance(left, (str, bytes, list, tuple)) and isinstance(right, (str, bytes, list, tuple)):
            render.fits(len(left) + len(right), f"{type(left).__name__} + {type(right).__name__}")
    elif operator == "%" and isinstance(left, (str, bytes)):
        _check_percent(render, left, right)


def _check_percent(render: _Render, template: str | bytes, args: Any) -> None:
    """``template % args`` (the ``%`` operator, ``format``): its widths, precisions and values."""
    text = _text(template)
    widths, starred = 0, False
    for match in _PERCENT_SPEC.finditer(text):
        for number in match.groups():
            if number == "*":
                starred = True
            elif number:
                widths += int(number) if len(number) < 20 else render.limits.output + 1
    if starred and isinstance(args, tuple):  # `%*d`: the width is an argument
        widths += sum(a for a in args if isinstance(a, int) and a > 0)
    render.fits(len(text) + widths + render.size(args), "a %-formatted text")


def _check_format_spec(render: _Render, template: str) -> None:
    """``template.format(...)``: the widths and precisions of its fields' specs."""
    widths = 0
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError:  # str.format will say what is wrong with it
        return
    for _, _, spec, _ in fields:
        for number in _DIGITS.findall(spec or ""):
            widths += int(number) if len(number) < 20 else render.limits.output + 1
    render.fits(len(template) + widths, "a formatted text")


def _check_ints(render: _Render, args: Sequence[Any], kwargs: Mapping[str, Any], what: str) -> None:
    """Widths, counts and indents: an int argument may not ask for more than the output bound."""
    for value in chain(args, kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and value > render.limits.output:
            render.fits(value, f"{what}({value:,})")


def _replace_size(text: Any, old: Any, new: Any, count: Any = -1) -> int:
    """How long ``text.replace(old, new, count)`` is (``count`` None or negative: all)."""
    if isinstance(text, bytes) and isinstance(old, bytes) and isinstance(new, bytes):
        text, old, new = text.decode("latin-1"), old.decode("latin-1"), new.decode("latin-1")
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return 0
    grow = len(new) - len(old)
    if grow <= 0:
        return len(text)
    times = len(text) + 1 if not old else text.count(old)
    if isinstance(count, int) and count >= 0:
        times = min(times, count)
    return len(text) + times * grow


def _join_size(render: _Render, separator: Any, items: list[Any]) -> int:
    sizes = sum(len(i) if isinstance(i, str) else render.size(i) for i in items)
    return sizes + len(str(separator)) * max(len(items) - 1, 0)


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _lines(text: Any) -> int:
    return text.count("\n") + 1 if isinstance(text, str) else 1


def _text_length(render: _Render, value: Any) -> int:
    return len(value) if isinstance(value, str) else render.size(value)


def _check_method(render: _Render, method: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A text method's result size, checked before it runs; ``join`` gets its items as a list."""
    owner, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(owner, (str, bytes)):
        return args
    if name == "replace" and len(args) >= 2:
        render.fits(_replace_size(owner, *args[:3]), "a replace")
    elif name == "join" and args:
        items = list(args[0])
        render.fits(_join_size(render, owner, items), "a join")
        args = (items, *args[1:])
    elif name == "expandtabs":
        tab = args[0] if args and isinstance(args[0], int) else 8
        render.fits(len(owner) + _text(owner).count("\t") * tab, "an expandtabs")
    elif name == "translate" and args and isinstance(owner, str) and isinstance(args[0], Mapping):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
        render.fits(len(owner) * max(longest, 1), "a translate")
    return args


def _tojson_size(render: _Render, value: Any, indent: Any, separators: Any) -> int:
    """An upper bound of ``tojson``'s length: its separators, and each item on its own line, indented."""
    size, depth = _size(value, render.limits.output, render.tick)
    pad = indent if isinstance(indent, int) else len(indent) if isinstance(indent, str) else 0
    separator = sum(len(s) for s in separators if isinstance(s, str)) if isinstance(separators, tuple) else 2
    # An item is two characters or more, so at most size // 2 separators and lines.
    return size + (size // 2 + 1) * (max(separator - 2, 0) + max(pad, 0) * depth)


def _filter_checks(
    render: _Render, name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The size ``name`` would build from ``value`` and its arguments, refused past the bound.

    Returns ``value``, as a list where the filter would consume it once (``join``).
    """
    what = f"the {name} filter"
    if name == "join":
        value = value if isinstance(value, str) else list(value)
        separator = args[0] if args else kwargs.get("d", "")
        render.fits(_join_size(render, separator, list(value)), what)
    elif name == "replace" and len(args) >= 2:
        if not isinstance(value, str):  # the filter replaces in its text
            render.fits(render.size(value), what)
        count = args[2] if len(args) > 2 else kwargs.get("count")
        render.fits(_replace_size(str(value), str(args[0]), str(args[1]), count), what)
    elif name == "indent":
        width = args[0] if args else kwargs.get("width", 4)
        pad = width if isinstance(width, int) else len(str(width))
        render.fits(_text_length(render, value) + _lines(value) * pad, what)
    elif name == "wordwrap":
        text = _text_length(render, value)
        width = args[0] if args else kwargs.get("width", 79)
        wrap = args[2] if len(args) > 2 else kwargs.get("wrapstring") or "\n"
        lines = 2 * text // max(width if isinstance(width, int) else 1, 1) + _lines(value)
        render.fits(text + lines * len(str(wrap)), what)
    elif name == "format" and isinstance(value, str):
        _check_percent(render, value, kwargs or args)
    elif name == "tojson":
        indent = args[1] if len(args) > 1 else kwargs.get("indent")
        separators = args[2] if len(args) > 2 else kwargs.get("separators")
        render.fits(_tojson_size(render, value, indent, separators), what)
    elif name in ("string", "pprint", "urlencode", "xmlattr", "e", "escape", "forceescape"):
        render.fits(render.size(value), what)
    elif name == "urlize":
        extra = sum(len(a) for a in chain(args, kwargs.values()) if isinstance(a, str))
        render.fits(_text_length(render, value) * (1 + extra), what)
    elif name == "sum":
        start = args[1] if len(args) > 1 else kwargs.get("start", 0)
        if not isinstance(start, (int, float)):  # summed sequences copy what came before, each time
            items = list(value)
            render.fits(len(items) * render.size(items), what)
            value = items
    return value


def _bounded_filter(render: _Render, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, a filter, with its size checks and result check (its jinja2 markers kept)."""
    passes = 1 if getattr(function, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        if len(args) > passes:
            render.tick()
            value, rest = args[passes], args[passes + 1 :]
            _check_ints(render, rest, kwargs, f"the {name} filter")
            value = _filter_checks(render, name, value, rest, kwargs)
            args = (*args[:passes], value, *rest)
        return render.built(function(*args, **kwargs), f"the {name} filter's result")

    return bounded


def _jinja_environment(render: _Render) -> Any:
    """The sandboxed environment, its hooks bounded by ``render``, with the generation tag."""
    try:
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension, loopcontrols
        from jinja2.runtime import LoopContext
        from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range
    except ImportError as err:
        raise ImportError(f"rendering a chat template needs the `jinja2` package: {_EXTRA_HINT}") from err

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}``: its output, recorded as a span."""

        tags = {"generation"}  # noqa: RUF012 (jinja2's own class attribute)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method(_GENERATION_METHOD, [], [], None, None)
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _record(self, context: Any, caller: Any) -> str:
            text = str(caller())
            # `generate` hands out the output as it is made, so what came before this block is
            # counted in `length` already. Like transformers, nothing is recorded before anything was.
            if render.blocks is not None and (render.blocks or render.spans):
                render.spans.append((render.length, render.length + len(text)))
            return text

    class Bounded(ImmutableSandboxedEnvironment):
        """Every hook the sandbox calls checks the deadline and the size of what it builds."""

        intercepted_binops = frozenset({"*", "**", "%", "+"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            render.tick()
            _check_binop(render, operator, left, right)
            return render.built(super().call_binop(context, operator, left, right), f"a {operator!r}")

        def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            render.tick()
            what = getattr(obj, "__name__", type(obj).__name__)
            if isinstance(obj, LoopContext):  # a recursive loop's `loop(children)`
                args = (render.iterate(args[0]), *args[1:]) if args else args
            elif obj is not safe_range:  # which bounds itself
                _check_ints(render, args, kwargs, what)
                args = _check_method(render, obj, args)
            return render.built(super().call(context, obj, *args, **kwargs), f"{what}()'s result")

        def getattr(self, obj: Any, attribute: str) -> Any:
            render.tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            render.tick()
            return super().getitem(obj, argument)

        def wrap_str_format(self, value: Any) -> Any:
            wrapped = super().wrap_str_format(value)
            if wrapped is not None:
                _check_format_spec(render, str(value.__self__))
            return wrapped

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        _check_percent(render, format, ())
        return datetime.datetime.now().strftime(format)

    # Compiled without constant folding: nothing of a template runs before a render.
    environment = Bounded(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols], optimized=False
    )
    environment.filters["tojson"] = tojson
    environment.filters = {
        name: _bounded_filter(render, name, function) for name, function in environment.filters.items()
    }
    environment.filters["o41_iterate"] = jinja2.pass_context(lambda _, iterable: render.iterate(iterable))
    environment.filters["o41_write"] = jinja2.pass_context(lambda _, value: render.write(value))
    environment.filters["o41_built"] = jinja2.pass_context(lambda _, value: render.built(value, "a '~' join"))
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    # Filler text, which no chat template writes, of a size its arguments multiply.
    environment.globals.pop("lipsum", None)
    return environment


def _bound_tree(tree: Any) -> Any:
    """``tree`` (a parsed template) with its loops, output and ``~`` joins passed through the bounds.

    Each ``for`` iterates through ``o41_iterate`` (counting iterations), each piece of output,
    literal text included, goes through ``o41_write`` (counting characters), and each ``~`` through
    ``o41_built``. The three take the context, so jinja2 never evaluates them at compile time.
    """
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    def through(node: Any, name: str) -> Any:
        return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

    class Bound(NodeTransformer):
        def visit_For(self, node: Any) -> Any:  # noqa: N802 (jinja2's visitor names)
            node = self.generic_visit(node)
            node.iter = through(node.iter, "o41_iterate")
            return node

        def visit_Output(self, node: Any) -> Any:  # noqa: N802 (jinja2's visitor names)
            node = self.generic_visit(node)
            node.nodes = [through(child, "o41_write") for child in node.nodes]
            return node

        def visit_Concat(self, node: Any) -> Any:  # noqa: N802 (jinja2's visitor names)
            return through(self.generic_visit(node), "o41_built")

    return Bound().visit(tree)


def _limit(option: str, value: Any, kind: type[int] | type[float]) -> Any:
    number = isinstance(value, int) or (kind is float and isinstance(value, float))
    if isinstance(value, bool) or not number or not value > 0:
        raise _invalid(option, f"expected a positive {kind.__name__}, got {value!r}")
    return value


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


def _marks_generation(tree: Any) -> bool:
    """Whether the parsed template holds a ``{% generation %}`` block (the tag's own call)."""
    from jinja2 import nodes

    for block in tree.find_all(nodes.CallBlock):
        call = block.call
        if (
            isinstance(call, nodes.Call)
            and isinstance(call.node, nodes.ExtensionAttribute)
            and call.node.name == _GENERATION_METHOD
        ):
            return True
    return False


def _constant_binops(tree: Any) -> Iterator[Any]:
    """The ``*``, ``**``, ``%`` and ``+`` of two constants, which can be checked before a render."""
    from jinja2 import nodes

    for node in tree.find_all((nodes.Mul, nodes.Pow, nodes.Mod, nodes.Add)):
        if isinstance(node.left, nodes.Const) and isinstance(node.right, nodes.Const):
            yield node


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
