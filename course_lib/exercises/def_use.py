"""What one notebook cell binds, changes and reads: the def-use facts ``slicing`` works from.

Lecture: none (the homework machinery). A cell is read with Python's ``ast``, in Python's own
scoping rules (a function's parameters and assigned names are its own; a comprehension's loop
variable is its own): the names it **binds** at top level, the objects it may **change** in
place (a method call, an item or attribute store, passing the object to a function -- unless the
object is a number or a string, which nothing can change), the names it **reads** now and those
its functions and lambdas read **late** (when called), and whether it has **effects** beyond its
names (a seed, the environment, a file, a magic). A cell that reaches variables by other means
(``globals()``, ``exec``, ``import *``, IPython's history, a function rebinding a global) is
**opaque**: nothing can be decided about it.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass

from course_lib.exercises.python_names import (
    FILE_CALLS,
    HISTORY,
    OPAQUE,
    OPAQUE_ATTRIBUTES,
    PURE,
    READ_ONLY,
    SETS_STATE,
    has_magics,
    local_names,
    without_magics,
)


@dataclass(frozen=True)
class Cell:
    """What one code cell binds, changes, reads (now and late) and whether it has effects.
    ``late_changes`` and ``late_effects``: what its functions change or do when called."""
    binds: frozenset = frozenset()
    changes: frozenset = frozenset()
    reads: frozenset = frozenset()
    late: frozenset = frozenset()
    effects: bool = False
    opaque: bool = False
    late_changes: frozenset = frozenset()
    late_effects: bool = False
    values: frozenset = frozenset()  # names it binds only to values nothing can change
    shipped: frozenset = frozenset()  # names it reads only to send to other processes (launch)


def _unchangeable(value) -> bool:
    """A number, string, bytes, None, a tuple of them or arithmetic on them (Python can't change
    them in place)."""
    if isinstance(value, ast.Constant | ast.JoinedStr):
        return True
    if isinstance(value, ast.Tuple):
        return all(_unchangeable(v) for v in value.elts)
    if isinstance(value, ast.UnaryOp):
        return _unchangeable(value.operand)
    if isinstance(value, ast.BinOp):
        return _unchangeable(value.left) and _unchangeable(value.right)
    return False


def _base(node):
    """The variable under an attribute or item chain (``a`` in ``a.b[0].c``), or None."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Starred):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class _Reader(ast.NodeVisitor):
    def __init__(self, modules: frozenset, elsewhere: frozenset):
        self.modules = modules  # names the lesson binds by an import
        self.elsewhere = elsewhere  # functions that run their function argument in other processes
        self.loads, self.sent = Counter(), Counter()
        self.binds, self.changes, self.reads, self.late = set(), set(), set(), set()
        self.late_changes, self.values, self.others = set(), set(), set()
        self.effects = self.late_effects = self.opaque = False
        self.depth = 0  # > 0 inside a function or lambda body: it runs when called
        self.scoped = 0  # > 0 in a class body or comprehension: runs now, binds nothing outside
        self.local = []  # the local names of each enclosing function and comprehension
        self.sure = set()  # names this piece has surely bound by now (its own, when read)

    def _mine(self, name) -> bool:
        return any(name in names for names in self.local) or (not self.depth and
                                                              name in self.sure)

    def _read(self, name):
        if name in OPAQUE or HISTORY.match(name):
            self.opaque = True
        if not self._mine(name):
            (self.late if self.depth else self.reads).add(name)
            self.loads[name] += not self.depth

    def _bind(self, name):
        if not (self.depth or self.scoped):
            self.binds.add(name)
            self.sure.add(name)

    def _effect(self):
        setattr(self, "late_effects" if self.depth else "effects", True)

    def _changed(self, name):
        if name is None:
            return
        if self._mine(name):
            return  # a local variable, or an object this piece made itself
        if name in self.modules:
            self._effect()  # storing into a module (os.environ[...] = ...) is global state
        elif self.depth:
            self.late_changes.add(name)
        else:
            self.changes.add(name)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self._read(node.id)
        else:
            if isinstance(node.ctx, ast.Del):  # ``del x`` needs the x bound before it
                self._read(node.id)
            self._bind(node.id)

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and (node.value.id, node.attr) in OPAQUE_ATTRIBUTES:
            self.opaque = True
        self.generic_visit(node)

    def visit_NamedExpr(self, node):  # binds in the enclosing function or module, even from a
        self.visit(node.value)        # comprehension
        if not self.depth:
            self.binds.add(node.target.id)
            self.sure.add(node.target.id)

    def _branches(self, node):
        """A loop, ``if`` or ``try``: what its blocks bind is not sure after it (nor in the next
        block); the test or iterable first, as Python evaluates it."""
        for field in ("test", "iter"):
            if hasattr(node, field):
                self.visit(getattr(node, field))
        saved = set(self.sure)
        for field in ("target", "body", "handlers", "orelse", "finalbody"):
            part = getattr(node, field, [])
            for statement in part if isinstance(part, list) else [part]:
                self.visit(statement)
            if field != "target":
                self.sure = set(saved)
        self.sure = saved

    visit_For = visit_AsyncFor = visit_While = visit_If = visit_Try = _branches
    visit_TryStar = _branches

    def visit_Global(self, node):
        self.opaque = True  # a function that rebinds a global: which cell calls it is unknown

    visit_Nonlocal = visit_Match = visit_Global

    def visit_ExceptHandler(self, node):
        if node.name:
            self._bind(node.name)
        self.generic_visit(node)

    def _target_base(self, target):
        if isinstance(target, ast.Attribute | ast.Subscript):
            self._changed(_base(target))
        elif isinstance(target, ast.Tuple | ast.List | ast.Starred):
            for element in target.elts if hasattr(target, "elts") else [target.value]:
                self._target_base(element)

    def _fixed(self, target, value):
        """Sort the names ``target`` binds into those bound to an unchangeable value and not."""
        if isinstance(target, ast.Name):
            (self.values if value is not None and _unchangeable(value) else
             self.others).add(target.id)
        elif isinstance(target, ast.Tuple | ast.List):
            pairs = isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts)
            for i, element in enumerate(target.elts):
                self._fixed(element, value.elts[i] if pairs else None)

    def visit_Assign(self, node):  # the value first, then the targets, as Python runs it
        targets = node.targets if hasattr(node, "targets") else [node.target]
        for part in (getattr(node, "value", None), getattr(node, "annotation", None)):
            if part is not None:
                self.visit(part)
        for target in targets:
            if not (self.depth or self.scoped or isinstance(node, ast.Delete)):
                self._fixed(target, node.value)
            self._target_base(target)
            self.visit(target)

    visit_AnnAssign = visit_Delete = visit_Assign

    def visit_AugAssign(self, node):
        self.visit(node.value)
        self._target_base(node.target)
        if isinstance(node.target, ast.Name):
            self._read(node.target.id)
            self._changed(node.target.id)
            self.others.add(node.target.id)
        self.visit(node.target)

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name == "*":
                self.opaque = True
            else:
                self._bind(alias.asname or alias.name.split(".")[0])

    visit_ImportFrom = visit_Import

    def _function(self, node, name=None):
        for expression in [*getattr(node, "decorator_list", []), *node.args.defaults,
                           *[d for d in node.args.kw_defaults if d is not None]]:
            self.visit(expression)  # evaluated when the cell runs
        if name:
            self._bind(name)
        self.depth += 1
        self.local.append(local_names(node))
        for statement in node.body if isinstance(node.body, list) else [node.body]:
            self.visit(statement)
        self.local.pop()
        self.depth -= 1

    def visit_FunctionDef(self, node):
        self._function(node, getattr(node, "name", None))
    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_ClassDef(self, node):
        for expression in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expression)
        self._bind(node.name)
        self.scoped += 1  # a class body runs now; its methods' bodies when called
        for statement in node.body:
            self.visit(statement)
        self.scoped -= 1

    def _comprehension(self, node):
        self.visit(node.generators[0].iter)  # evaluated in the enclosing scope
        self.scoped += 1
        self.local.append(local_names(node))
        for i, generator in enumerate(node.generators):
            if i:
                self.visit(generator.iter)
            self.visit(generator.target)
            for condition in generator.ifs:
                self.visit(condition)
        for part in ("elt", "key", "value"):
            if hasattr(node, part):
                self.visit(getattr(node, part))
        self.local.pop()
        self.scoped -= 1

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Call(self, node):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else None
        if isinstance(func, ast.Attribute):
            owner = _base(func)
            if owner in self.modules:
                if SETS_STATE.search(func.attr):
                    self._effect()
            elif func.attr not in READ_ONLY:
                self._changed(owner)
            name = func.attr
        if name in FILE_CALLS:
            self._effect()
        if isinstance(func, ast.Name) and name in self.elsewhere:  # launch(fn, ...): pickled, run
            for argument in node.args:                             # in the workers
                if isinstance(argument, ast.Name) and not self.depth:
                    self.sent[argument.id] += 1
        elif name not in PURE:  # an argument may be changed, unless it is (part of) a module
            for argument in [*node.args, *(k.value for k in node.keywords)]:
                if _base(argument) not in self.modules:
                    self._changed(_base(argument))
        self.generic_visit(node)


def analyse(source: str, modules: frozenset = frozenset(),
            elsewhere: frozenset = frozenset()) -> Cell:
    """Read one cell. ``modules``: the names the lesson imports (calling a module's function is
    not changing a variable); ``elsewhere``: functions that send what they are given to worker
    processes (``course_lib.launch``): its arguments are copies there, not changed here. Magics
    and shell lines (``%``, ``!``) count as effects."""
    effects = has_magics(source)
    try:
        tree = ast.parse(without_magics(source))
    except SyntaxError:
        return Cell(effects=True, opaque=True)
    reader = _Reader(modules, elsewhere)
    reader.visit(tree)
    shipped = {name for name, sent in reader.sent.items() if reader.loads[name] == sent}
    return Cell(frozenset(reader.binds), frozenset(reader.changes), frozenset(reader.reads),
                frozenset(reader.late), effects or reader.effects, reader.opaque,
                frozenset(reader.late_changes), reader.late_effects,
                frozenset(reader.values - reader.others - reader.changes), frozenset(shipped))
