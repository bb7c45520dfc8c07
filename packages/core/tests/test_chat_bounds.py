"""Chat templates are code from whoever published the tokenizer: their render is bounded.

Loop iterations, characters written (and the longest value a template may build) and seconds
per render, each settable on ``ChatTemplate`` with a default no real template reaches; past one
the render fails with a ``DataError`` naming the template and the bound. The hang cases assert
the error and the bound it names, never the time taken; their bounds are set small so that each
refusal comes at once. Beside them: generation marks read from the parsed template, named
templates checked, text the tokenizer cannot take refused, and the mask's token lookup.
"""

from __future__ import annotations

import json
import pickle
import resource
from pathlib import Path
from typing import Any

import pytest
from o41_training_data import ChatEncoder, ChatTemplate, ConfigError, DataError, TextTokenizer

MARK = "{% generation %}{% endgeneration %}"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>"
    "{% endif %}\n{% endfor %}"
)
HELLO = [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi, how can I help?"}]
NESTED_RANGES = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([m["content"] for m in HELLO] * 20, trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    bpe.save(str(path))
    return TextTokenizer.from_file(path, eos="<|im_end|>")


def config_file(directory: Path, template: Any, **extra: Any) -> Path:
    path = directory / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": template, **extra}))
    return path


# -- 6. hangs: loops are counted, a render has a deadline -------------------------------------------


def test_nested_range_loops_stop_at_the_loop_bound_naming_the_template(tmp_path: Path) -> None:
    template = ChatTemplate.from_tokenizer_config(
        config_file(tmp_path, MARK + NESTED_RANGES), max_loop_iterations=1000
    )
    with pytest.raises(DataError, match=r"passed 1,000 loop iterations \(max_loop_iterations") as info:
        template.render(HELLO)
    assert str(tmp_path / "tokenizer_config.json") in str(info.value)
    assert template.limits["max_loop_iterations"] == 1000


@pytest.mark.parametrize(
    "loops",
    [
        # Loops over text, a list and a recursive loop's children count as well as range's.
        "{% set s = 'x' * 5000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
        "{% for a in messages * 1000 %}{% for b in messages * 1000 %}{% endfor %}{% endfor %}",
        "{% for x in [[[1] * 50] * 50] * 50 recursive %}{% if x is iterable %}{{ loop(x) }}{% endif %}"
        "{% endfor %}",
        # And the items a loop's `length` reads ahead.
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ loop.length }}{% endfor %}{% endfor %}",
    ],
)
def test_every_kind_of_loop_counts(loops: str) -> None:
    template = ChatTemplate(MARK + loops, max_loop_iterations=2000)
    with pytest.raises(DataError, match="max_loop_iterations"):
        template.render(HELLO)


def test_a_render_past_its_deadline_stops_naming_max_render_seconds() -> None:
    # Loops are not bounded here (10**10 iterations): only the deadline stops the render.
    template = ChatTemplate(MARK + NESTED_RANGES, max_loop_iterations=10**12, max_render_seconds=0.05)
    with pytest.raises(DataError, match=r"took over 0.05 s \(max_render_seconds"):
        template.render(HELLO)


# -- 7. over-allocation: values are sized before they are built ------------------------------------


def test_a_constant_repetition_is_refused_when_the_template_is_read_without_allocating() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(
        ConfigError, match=r"line 2: str \* 2,000,000,000 would be 2,000,000,000 characters"
    ) as info:
        ChatTemplate(MARK + "\n{{ 'x' * 2000000000 }}")
    assert "max_output_chars" in str(info.value)
    # ru_maxrss is in KiB: the 2 GB string was never made.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * 1024


@pytest.mark.parametrize(
    ("body", "what"),
    [
        ("{% set n = 2000000000 %}{{ 'x' * n }}", r"str \* 2,000,000,000"),
        ("{% set n = 2000000000 %}{{ ['x'] * n }}", r"list \* 2,000,000,000"),
        ("{{ 'x'.center(2000000000) }}", r"center\(2,000,000,000\)"),
        ("{{ 'x'|center(2000000000) }}", r"center filter\(2,000,000,000\)"),
        ("{% set s = 'x' * 100000 %}{{ s.replace('', s) }}", "a replace would be 10,000,200,000"),
        ("{% set s = 'x' * 100000 %}{{ s|replace('', s) }}", "replace filter would be 10,000,200,000"),
        ("{% set s = 'x' * 10000 %}{{ s|join(s) }}", "join filter would be 100,000,000"),
        ("{% set s = 'x' * 10000 %}{{ s.join(s) }}", "a join would be 100,000,000"),
        ("{% set s = '\n' * 100000 %}{{ s|indent(s) }}", "indent filter would be"),
        ("{% set s = '\t' * 100000 %}{{ s.expandtabs(100000) }}", "expandtabs would be"),
        ("{% set t = ''.maketrans({'a': 'x' * 100000}) %}{{ ('a' * 100000).translate(t) }}", "translate"),
        ("{% set w = 2000000000 %}{{ '%*d' % (w, 1) }}", "%-formatted text"),
        ("{% set f = '{:>2000000000}' %}{{ f.format(1) }}", "formatted text"),
        ("{{ '{:>{}}'.format(1, 2000000000) }}", r"format\(2,000,000,000\)"),
        ("{{ strftime_now('%2000000000Y') }}", "%-formatted text"),
        ("{{ [[[[1]]]]|tojson(indent=60000000) }}", "tojson filter"),
        # Doubling, each step within the bound, by `~`, `+`, a macro's recursion and nesting.
        (
            "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "'~' join would be 134,217,728",
        ),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
            r"str \+ str would be 134,217,728",
        ),
        ("{% macro m(s) %}{{ m(s ~ s) }}{% endmacro %}{{ m('x') }}", "'~' join"),
        (
            "{% set ns = namespace(s=['x']) %}{% for i in range(60) %}{% set ns.s = [ns.s, ns.s] %}"
            "{% endfor %}{{ ns.s|tojson }}",
            "tojson filter would be",
        ),
    ],
)
def test_a_value_past_the_output_bound_is_refused_before_it_is_built(body: str, what: str) -> None:
    template = ChatTemplate(MARK + body)
    with pytest.raises(DataError, match=f"stopped: .*{what}.*max_output_chars"):
        template.render(HELLO)


@pytest.mark.parametrize(
    "body", ["{% set n = 7 %}{{ 10 ** (n * 10000) }}", "{% set n = 2 %}{{ n ** 100000 }}"]
)
def test_ints_stay_within_what_python_prints(body: str) -> None:
    with pytest.raises(DataError, match="4300-digit"):
        ChatTemplate(MARK + body).render(HELLO)


def test_output_is_counted_where_it_is_written_inside_blocks_too() -> None:
    loops = "{% for i in range(1000) %}xxxxxxxxxx{% endfor %}"
    for body in (
        loops,
        "{% generation %}" + loops + "{% endgeneration %}",
        "{% set s %}" + loops + "{% endset %}",
    ):
        template = ChatTemplate(MARK + body, max_output_chars=5000)
        with pytest.raises(DataError, match=r"wrote over 5,000 characters \(max_output_chars"):
            template.render(HELLO)
    assert len(ChatTemplate(MARK + loops, max_output_chars=10_000).render(HELLO).text) == 10_000


def test_bounds_are_validated_kept_through_pickling_and_shown() -> None:
    for keyword, value in [("max_output_chars", 0), ("max_loop_iterations", 1.5), ("max_render_seconds", -1)]:
        with pytest.raises(ConfigError, match=f"invalid {keyword}"):
            ChatTemplate(CHATML, **{keyword: value})
    template = ChatTemplate(CHATML, name="mine", max_output_chars=100, max_render_seconds=2)
    again = pickle.loads(pickle.dumps(template))
    assert (
        again.limits
        == template.limits
        == {
            "max_output_chars": 100,
            "max_loop_iterations": 4_194_304,
            "max_render_seconds": 2.0,
        }
    )
    assert again.name == "mine"
    assert again.render(HELLO) == template.render(HELLO)
    assert "'mine'" in repr(template)


# -- 8. generation marks are read by the parser -----------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "{# {% generation %}{% endgeneration %} #}"
        + CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", ""),
        "{% raw %}{% generation %}{% endraw %}{% for m in messages %}{{ m.content }}{% endfor %}",
        "{{ '{% generation %}' }}{% for m in messages %}{{ m.content }}{% endfor %}",
    ],
)
def test_a_generation_tag_in_a_comment_or_text_is_no_mark(tokenizer: TextTokenizer, template: str) -> None:
    chat = ChatTemplate(template)
    assert not chat.marks_generation
    with pytest.raises(ConfigError, match="no {% generation %} blocks"):
        ChatEncoder(tokenizer, chat)


def test_a_generation_block_with_whitespace_control_is_a_mark(tokenizer: TextTokenizer) -> None:
    chat = ChatTemplate(CHATML.replace("{% generation %}", "{%- generation -%}"))
    assert chat.marks_generation
    assert ChatEncoder(tokenizer, chat).encode(HELLO).loss_mask.sum() > 0


# -- 9. named templates are checked -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([{"name": [1], "template": CHATML}], r"chat_template\[0\] is not a named template"),
        (
            [{"name": "default", "template": CHATML}, "tool_use"],
            r"chat_template\[1\] is not a named template",
        ),
        ([{"name": "default", "template": 7}], r"chat_template\[0\] is not a named template"),
        ([{"name": "default", "template": CHATML}] * 2, "names 'default' twice"),
    ],
)
def test_a_malformed_named_template_list_fails_naming_the_file_and_entry(
    tmp_path: Path, entries: list[Any], message: str
) -> None:
    path = config_file(tmp_path, entries)
    with pytest.raises(ConfigError, match=message) as info:
        ChatTemplate.from_tokenizer_config(path)
    assert str(path) in str(info.value)


def test_a_named_template_is_named_in_its_errors(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        [{"name": "default", "template": CHATML}, {"name": "loop", "template": MARK + NESTED_RANGES}],
    )
    template = ChatTemplate.from_tokenizer_config(path, "loop", max_loop_iterations=10)
    with pytest.raises(DataError, match=r"template 'loop'\) stopped"):
        template.render(HELLO)


# -- 10. text the tokenizer cannot take -------------------------------------------------------------


def test_a_lone_surrogate_fails_naming_the_message(tokenizer: TextTokenizer) -> None:
    encoder = ChatEncoder(tokenizer, ChatTemplate(CHATML))
    bad = [HELLO[0], {"role": "assistant", "content": "half a pair: \ud800"}]
    with pytest.raises(DataError, match=r"messages\[1\]\.content holds a lone surrogate \(U\+D800\)"):
        encoder.encode(bad)
    with pytest.raises(DataError, match=r"conversation 1: messages\[1\]\.content"):
        encoder.encode_batch([HELLO, bad])


def test_a_bound_hit_while_tokenizing_a_corpus_names_the_shard_record_and_field(
    tokenizer: TextTokenizer, tmp_path: Path
) -> None:
    from o41_training_data import tokenize_dataset

    chats = tmp_path / "chats.jsonl"
    long = [{"role": "user", "content": "x" * 200}, HELLO[1]]
    chats.write_text("".join(json.dumps({"messages": m}) + "\n" for m in (HELLO, long)))
    with pytest.raises(DataError, match="max_output_chars") as info:
        tokenize_dataset(
            [chats],
            tmp_path / "out" / "data-manifest-v1.json",
            tokenizer=tokenizer.source,
            eos="<|im_end|>",
            chat_template=ChatTemplate(CHATML, max_output_chars=150),
        )
    assert info.value.field == "messages"
    assert str(info.value.path).endswith("chats.jsonl")


# -- the mask's token lookup ------------------------------------------------------------------------


def test_the_mask_finds_tokens_as_char_to_token_does(tokenizer: TextTokenizer) -> None:
    from o41_training_data._chat import _char_token

    text = "<|im_start|>user\n  Ünïcödé 🙂  text\t\n<|im_end|>\n<|im_start|>assistant\nHi!<|im_end|>  "
    encoding = tokenizer.hf().encode(text, add_special_tokens=False)
    count = len(encoding.ids)
    assert [_char_token(encoding, p, count) for p in range(len(text) + 2)] == [
        encoding.char_to_token(p) for p in range(len(text) + 2)
    ]


def test_real_templates_render_unchanged_under_the_bounds(tokenizer: TextTokenizer) -> None:
    # The bounded compile changes nothing a template writes: the text jinja2's own sandbox renders
    # (test_chat.py checks four real templates token for token against transformers).
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    conversation = HELLO * 50
    text = (
        ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        .from_string(CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", ""))
        .render(messages=conversation)
    )
    rendered = ChatTemplate(CHATML).render(conversation)
    assert rendered.text == text
    assert len(rendered.assistant_spans) == 50
