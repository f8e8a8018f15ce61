"""Python's names, as the def-use analysis (``def_use``) needs them: which names are local to a
function or comprehension (Python's own scoping rule), the names and calls whose meaning is
known without running them, and a cell's magic lines (IPython's, set aside before parsing).

Lecture: none (the homework machinery).
"""

from __future__ import annotations

import ast
import re

# a name that reaches every variable, or IPython's history of them: the analysis cannot decide
OPAQUE = frozenset({"globals", "locals", "vars", "exec", "eval", "compile", "__import__",
                    "get_ipython", "__builtins__", "__builtin__", "builtins", "breakpoint",
                    "In", "Out"})
OPAQUE_ATTRIBUTES = frozenset({("sys", "modules"), ("sys", "_getframe"), ("inspect", "stack"),
                               ("inspect", "currentframe"), ("gc", "get_objects"),
                               ("gc", "get_referrers")})
HISTORY = re.compile(r"^_+(\d+)?$|^_i+\d*$|^_(ih|oh|dh|exit_code)$")
# functions that cannot change their arguments
PURE = frozenset({"print", "len", "isinstance", "issubclass", "repr", "str", "type", "display",
                  "float", "int", "bool", "round", "abs", "format", "hasattr", "id", "sorted",
                  "min", "max", "sum", "list", "tuple", "set", "dict", "enumerate", "zip",
                  "range", "reversed", "all", "any", "hash", "callable", "Markdown", "HTML"})
# methods that do not change their object (read-only views and copies of the common types)
READ_ONLY = frozenset({"items", "keys", "values", "get", "copy", "count", "index", "format",
                       "join", "split", "strip", "startswith", "endswith", "lower", "upper",
                       "numel", "size", "dim", "item", "tolist", "clone", "detach", "numpy",
                       "mean", "std", "median", "sum", "prod", "argmax", "argmin", "norm",
                       "parameters", "named_parameters", "buffers", "state_dict", "__len__"})
# calls on a module that change the process's state (seeds, threads, defaults, warnings, files)
SETS_STATE = re.compile(r"seed|^set_|^use_|filterwarnings|simplefilter|^chdir$|^putenv$|"
                        r"^register|^rc$|^rcdefaults$|^use$|^write|^save|^mkdir$|^unlink$|"
                        r"^remove$|^rename$|^environ$")
FILE_CALLS = frozenset({"open", "write_text", "write_bytes", "savefig", "to_csv", "mkdir",
                        "unlink", "touch", "rmtree", "copyfile", "copy2"})



SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp,
          ast.SetComp, ast.DictComp, ast.GeneratorExp)


def local_names(node) -> set:
    """The names local to a function, lambda or comprehension (Python's own rule: its
    parameters and every name it binds; a comprehension's loop targets)."""
    if isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
        return {n.id for g in node.generators for n in ast.walk(g.target)
                if isinstance(n, ast.Name)}
    arguments = node.args
    names = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                             *filter(None, [arguments.vararg, arguments.kwarg])]}
    todo = list(node.body) if isinstance(node.body, list) else [node.body]
    while todo:
        child = todo.pop()
        if isinstance(child, ast.Name) and not isinstance(child.ctx, ast.Load):
            names.add(child.id)
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(child.name)
        elif isinstance(child, ast.alias):
            names.add(child.asname or child.name.split(".")[0])
        elif isinstance(child, ast.ExceptHandler) and child.name:
            names.add(child.name)
        elif isinstance(child, ast.NamedExpr):
            names.add(child.target.id)
        if not isinstance(child, SCOPES):  # a nested scope's names are its own
            todo.extend(ast.iter_child_nodes(child))
    return names


def has_magics(source: str) -> bool:
    """Whether a cell has a magic or shell line (``%``, ``!``): IPython's syntax, not Python's."""
    return any(line.lstrip().startswith(("%", "!")) for line in source.splitlines())


def without_magics(source: str) -> str:
    """A cell's Python: its magic and shell lines (``%``, ``!``) left out."""
    return "\n".join(line for line in source.splitlines()
                     if not line.lstrip().startswith(("%", "!")))
