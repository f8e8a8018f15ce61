"""What each exercise needs, so that the grader runs only that: not the lesson's sweeps and
figures.

Lecture: none (the homework machinery). From each cell's def-use facts (``def_use``),
:func:`needed` closes the graded cells over "reads what an earlier cell binds or changes": a
name is decided by the last cell before its reader that binds it and every cell between that
changes it; a name a function reads, by those up to the last cell that may call the function;
a cell with effects before the last exercise is always kept. :func:`to_run` does it statement by
statement (a cell that defines a constant and then runs a sweep gives only the constant). An
opaque cell before the last exercise makes the answer ``None``: the whole lesson runs.
"""

from __future__ import annotations

import ast
from dataclasses import replace

from course_lib.exercises.def_use import Cell, analyse
from course_lib.exercises.python_names import has_magics, without_magics


def imported(sources) -> frozenset:
    """The names the cells bind by an import at top level."""
    names = set()
    for source in sources:
        try:
            tree = ast.parse(without_magics(source))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                names.update(a.asname or a.name.split(".")[0] for a in node.names)
    return frozenset(names)


def runs_elsewhere(sources) -> frozenset:
    """``{"launch"}`` when every binding of ``launch`` in the cells imports course_lib's (which
    sends its function and arguments to worker processes by value), else nothing."""
    binders = []
    for source in sources:
        try:
            tree = ast.parse(without_magics(source))
        except SyntaxError:
            return frozenset()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                binders += [getattr(node, "module", None) or "" for a in node.names
                            if (a.asname or a.name.split(".")[0]) == "launch"]
            elif isinstance(node, ast.Name | ast.FunctionDef | ast.ClassDef | ast.arg) and \
                    "launch" in (getattr(node, "id", None), getattr(node, "name", None),
                                 getattr(node, "arg", None)) and \
                    not isinstance(getattr(node, "ctx", None), ast.Load):
                binders.append(None)
    ok = binders and all(m is not None and m.split(".")[0] == "course_lib" for m in binders)
    return frozenset({"launch"}) if ok else frozenset()


def lesson(sources) -> list[Cell]:
    """Read a lesson's code cells, in order, and charge each call of a function with what the
    function changes or does: a cell that reads a name an earlier cell binds changes what that
    cell's functions change (over-approximated: any name it binds might be the function; not
    when it only hands the function to ``launch``, which runs it in other processes)."""
    sources = list(sources)
    modules, elsewhere = imported(sources), runs_elsewhere(sources)
    linked = []
    for cell in (analyse(source, modules, elsewhere) for source in sources):
        changes, effects = set(cell.changes), cell.effects
        late_changes, late_effects = set(cell.late_changes), cell.late_effects
        for earlier in linked:
            if earlier.binds & (cell.reads - cell.shipped):
                changes |= earlier.late_changes
                effects = effects or earlier.late_effects
            if earlier.binds & cell.late:
                late_changes |= earlier.late_changes
                late_effects = late_effects or earlier.late_effects
        linked.append(replace(cell, changes=frozenset(changes), effects=effects,
                              late_changes=frozenset(late_changes), late_effects=late_effects))
    # a name every cell binds only to a number or string: passing it to a function changes nothing
    fixed = {n for cell in linked for n in cell.values} - \
        {n for cell in linked for n in cell.binds - cell.values}
    return [replace(c, changes=c.changes - fixed, late_changes=c.late_changes - fixed)
            for c in linked]


def _writers(cells, name, start, stop):
    """The cells before ``stop`` whose run decides ``name`` for a reader at ``start`` (or later,
    up to ``stop``): the last cell before ``start`` that binds it, and every cell from there to
    ``stop`` that binds or changes it."""
    binder = next((i for i in range(start - 1, -1, -1) if name in cells[i].binds), 0)
    return {i for i in range(binder, stop)
            if name in cells[i].binds or name in cells[i].changes}


def _callers(cells, j, keep, last) -> int:
    """The last kept cell, up to ``last``, that may call a function cell ``j`` defines: one that
    names what ``j`` binds, or what such a cell binds or changes (a function stored in a list)."""
    carried, reach = set(cells[j].binds), j
    for k in range(j + 1, last + 1):
        cell = cells[k]
        if k in keep and (cell.reads | cell.late | cell.changes) & carried:
            carried |= cell.binds | cell.changes
            reach = k
    return reach


def needed(cells: list[Cell], targets) -> set[int] | None:
    """The cells (positions in ``cells``) that the ``targets`` depend on, targets included, or
    None when the analysis cannot decide (an unreadable cell before the last target).

    A name a cell reads is decided by the last cell before it that binds the name and every cell
    between that changes it; a name a function reads, by those up to the last kept cell that may
    call the function. Cells with effects before the last target are always kept."""
    targets = set(targets)
    if not targets:
        return set()
    last = max(targets)
    if any(cell.opaque for cell in cells[:last + 1]):
        return None
    keep = targets | {i for i in range(last) if cells[i].effects}
    while True:
        found = set()
        for j in keep:
            for name in cells[j].reads | cells[j].changes:
                found |= _writers(cells, name, j, j)
            if cells[j].late:
                reach = _callers(cells, j, keep, last)
                for name in cells[j].late:
                    found |= _writers(cells, name, j, reach + 1)
        if found <= keep:
            return keep
        keep |= found


def statements(source: str) -> list[str]:
    """A cell's top-level statements, each with its decorators and the lines it spans (a cell
    with magics or that does not parse is one piece)."""
    if has_magics(source):
        return [source]
    lines = source.splitlines()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return [source]
    spans = []
    for node in tree.body:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        if spans and start <= spans[-1][1]:  # two statements on one line stay together
            spans[-1][1] = max(spans[-1][1], node.end_lineno)
        else:
            spans.append([start, node.end_lineno])
    return ["\n".join(lines[a - 1:b]) for a, b in spans]


def to_run(sources, targets) -> list[str | None] | None:
    """What the grader runs of each cell so that the ``targets`` (cell positions) run as in the
    whole lesson: each target whole, of every other cell only the statements they depend on
    (None: skip the cell). None when the analysis cannot decide: run everything."""
    targets = set(targets)
    pieces, owner = [], []
    try:  # code can nest deeper than the analysis recurses (1 + 1 + ... 800 times) or than the
        # parser holds (3,000 nested lambdas: MemoryError); then everything runs
        for c, source in enumerate(sources):
            parts = [source] if c in targets else statements(source)
            pieces += parts
            owner += [c] * len(parts)
        keep = needed(lesson(pieces), [k for k, c in enumerate(owner) if c in targets])
    except (RecursionError, MemoryError):
        return None
    if keep is None:
        return None
    run = [[] for _ in sources]
    for k in sorted(keep):
        run[owner[k]].append(pieces[k])
    return [sources[c] if c in targets else ("\n".join(parts) if parts else None)
            for c, parts in enumerate(run)]
