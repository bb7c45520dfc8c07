"""The bounded render of a chat template.

A template is code from whoever published the tokenizer, so its render is bounded as well as
sandboxed.
The hooks the sandbox calls (every call, attribute and item, the operators ``*``, ``**``, ``%``
and ``+``) and two the template is compiled with (every loop iteration, every piece of output)
count the loop iterations and the characters written, check a deadline, and refuse before
building a value longer than the output bound wherever one step could build it (``'x' * n``, a
width, a ``replace`` or ``join``). Past a bound the render stops with a :class:`DataError` naming
the template and the bound; no thread or signal is involved. :class:`~._chat.ChatTemplate` holds
one of these renders.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

from ._errors import invalid as _invalid

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
# %-formatting (``%``, ``format``, ``strftime_now``): a field's width and precision.
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +_^]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")


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
