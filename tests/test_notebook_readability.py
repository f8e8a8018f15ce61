"""The lessons are readable (issue 30): short sentences, short code cells, lessons of a sitting.

A sentence of the markdown has at most ``MAX_WORDS`` words; a code cell at most ``MAX_LINES``
lines; a lesson at most ``MAX_LESSON_WORDS`` words of markdown. What a sentence is: the prose of
a markdown cell with its code spans, math, link targets, HTML tags and tables left out, cut at
``.``, ``!`` or ``?`` before a space, at a blank line, and before each list item or heading. A
word: a run of characters with a letter or a digit in it.

The cells and lessons still over their limits are listed in ``LONG_CELLS`` and ``LONG_LESSONS``
with what is to be done; the test also fails when a listed one is no longer over (so the list
only shrinks).
"""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_WORDS, MAX_LINES, MAX_LESSON_WORDS = 40, 30, 2500

# notebook prefix -> code cells (index among all cells) still over MAX_LINES: to split, or to move
# into course_lib and show with inspect.getsource where the code is the algorithm
LONG_CELLS: dict[str, set[int]] = {}
# notebook prefix -> why the lesson is still over MAX_LESSON_WORDS words of markdown
LONG_LESSONS: dict[str, str] = {
}

_LEFT_OUT = [
    re.compile(r"```.*?```", re.S),            # fenced code
    re.compile(r"\$\$.*?\$\$", re.S),          # display math
    re.compile(r"(?<!\\)\$[^$]+?(?<!\\)\$"),   # inline math: a "word" of its own
    re.compile(r"`[^`]*`"),                    # code spans: one word each
    re.compile(r"<[^>]+>"),                    # HTML tags
]
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")  # [text](target): the text stays
_WORD = re.compile(r"\S*[A-Za-z0-9]\S*")


def sentences(markdown: str) -> list[str]:
    """The sentences of one markdown cell (see the module's docstring)."""
    text = _LINK.sub(r"\1", markdown)
    for pattern in _LEFT_OUT:
        text = pattern.sub(" X ", text)
    blocks, current = [], []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|"):  # a table row: cells, not sentences
            continue
        if not stripped or re.match(r"(#+\s|[-*+]\s|\d+[.)]\s|>)", stripped):
            blocks.append(" ".join(current))
            current = []
        current.append(stripped)
    blocks.append(" ".join(current))
    out = []
    for block in blocks:
        out += [s.strip() for s in re.split(r"(?<=[.!?])\s+", block) if s.strip()]
    return out


def words(sentence: str) -> int:
    return len(_WORD.findall(sentence))


def cells(path, kind):
    return [(i, "".join(c["source"])) for i, c in enumerate(json.loads(path.read_text())["cells"])
            if c["cell_type"] == kind]


def test_a_sentence_is_cut_where_a_reader_stops():
    text = ("One short sentence. A second, with `code.like(this)` and $a.b = c$ in it!\n\n"
            "- a list item\n- another one\n\n| a | table |\n|---|---|\n"
            "See [the paper](https://example.org/a.b) now.")
    assert sentences(text) == ["One short sentence.", "A second, with  X  and  X  in it!",
                               "- a list item", "- another one", "See the paper now."]
    assert words("A second, with  X  and  X  in it!") == 8
    assert words(" ".join(["word"] * 41) + ".") == 41


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_sentence_has_at_most_40_words(path):
    long = [(i, words(s), s[:80]) for i, md in cells(path, "markdown") for s in sentences(md)
            if words(s) > MAX_WORDS]
    assert not long, f"sentences over {MAX_WORDS} words (cell, words, start): {long}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_code_cells_are_short(path):
    listed = LONG_CELLS.get(path.stem.split("_")[0], set())
    over = {i for i, source in cells(path, "code") if len(source.splitlines()) > MAX_LINES}
    assert over <= listed, f"code cells over {MAX_LINES} lines: {sorted(over - listed)}"
    assert listed <= over, f"no longer over {MAX_LINES} lines, take off LONG_CELLS: " \
                           f"{sorted(listed - over)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_lesson_is_read_in_a_sitting(path):
    total = sum(words(s) for _, md in cells(path, "markdown") for s in sentences(md))
    if path.stem.split("_")[0] in LONG_LESSONS:
        assert total > MAX_LESSON_WORDS, f"{total} words now: take it off LONG_LESSONS"
    else:
        assert total <= MAX_LESSON_WORDS, f"{total} words of markdown"
