"""Which modules of course_lib have a command line, and the refusal for those that do not.

A lesson's experiment runs as ``python -m course_lib.<module> --world-size 2`` (through
``launch``) or ``torchrun --standalone --nproc-per-node 2 -m course_lib.<module>``. Most modules
only hold functions for the notebooks: started with ``-m`` they would import, do nothing and
exit 0, which looks like success. :func:`refuse_modules_without_a_command` (called first thing
by ``import course_lib``) stops that: it says which module has no command, lists the ones that
do, and exits with status 2. It imports nothing heavy (no torch), so the answer is immediate.

    python -m course_lib.commands        # the list of modules with a command
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# started by launch and the fork server, never by hand: not worth listing
INTERNAL = ("course_lib.runtime.worker", "course_lib.runtime.forkserver")
_MAIN_BLOCK = re.compile(r"""^if __name__ == ["']__main__["']\s*:""", re.MULTILINE)


def module_run_with_dash_m(argv) -> str | None:
    """The module of ``python [options] -m MODULE ...`` in ``argv`` (a ``sys.orig_argv``);
    None for a script, ``-c`` or an interactive interpreter."""
    args = iter(argv[1:])
    for arg in args:
        if arg == "-" or not arg.startswith("-"):
            return None  # a script, or stdin
        if arg.startswith("--"):
            if arg == "--check-hash-based-pycs":
                next(args, None)
            continue
        letters = arg[1:]  # short options may come together: -um module, -Wignore, -Ic code
        for i, letter in enumerate(letters):
            if letter == "c":
                return None
            if letter == "m":
                return letters[i + 1:] or next(args, None)
            if letter in "WX":  # their value is the rest of this word, or the next one
                if not letters[i + 1:]:
                    next(args, None)
                break
    return None


def _source(module: str) -> tuple[str, Path] | None:
    """("module", its file) or ("package", the package's folder) for a module of course_lib;
    None when there is no such file (Python itself will then say so)."""
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts)
    if path.with_suffix(".py").is_file() and parts:
        return "module", path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return "package", path
    return None


def has_a_command(module: str) -> bool | None:
    """Does ``python -m module`` run something? A module: its source has an
    ``if __name__ == "__main__":`` block; a package: it has a ``__main__.py``. None when the
    module is not found among course_lib's files."""
    found = _source(module)
    if found is None:
        return None
    kind, path = found
    if kind == "package":
        return (path / "__main__.py").is_file()
    try:
        return bool(_MAIN_BLOCK.search(path.read_text(encoding="utf-8")))
    except OSError:
        return None  # unreadable: let Python go on


def modules_with_a_command() -> list[str]:
    """Every module of course_lib that has a command, sorted (the internal ones left out)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).with_suffix("")
        if "__pycache__" in relative.parts:
            continue
        if relative.name == "__main__":
            found.append(".".join(["course_lib", *relative.parts[:-1]]))
        elif relative.name != "__init__" and _MAIN_BLOCK.search(path.read_text(encoding="utf-8")):
            found.append(".".join(["course_lib", *relative.parts]))
    return sorted(name for name in found if name not in INTERNAL)


def refusal(module: str) -> str:
    """What ``python -m module`` says when the module has no command."""
    listed = "\n".join(f"  python -m {name}" for name in modules_with_a_command())
    return (f"{module} has no command: it holds functions for the notebooks and the other "
            f"modules, and running it with -m would do nothing.\n"
            f"These modules of course_lib have one (add --help for its options; a lesson's "
            f"experiment also runs as torchrun --standalone --nproc-per-node 2 -m <module>):"
            f"\n{listed}")


def refuse_modules_without_a_command(argv=None) -> None:
    """When this process was started as ``python -m course_lib.X`` and X has no command, print
    why on stderr and exit with status 2. Anything else (a module with a command, a script,
    a notebook kernel, a worker) returns at once."""
    argv = getattr(sys, "orig_argv", None) if argv is None else argv
    module = module_run_with_dash_m(argv or [])
    if module is None or (module != "course_lib" and not module.startswith("course_lib.")):
        return
    if module == __name__:  # python -m course_lib.commands: answered here, as the package is
        main()              # imported, before runpy would run this module a second time
        raise SystemExit(0)
    if has_a_command(module) is False:
        print(refusal(module), file=sys.stderr)
        raise SystemExit(2)


def main() -> None:
    print("Modules of course_lib with a command (python -m <module> --help for its options):")
    for name in modules_with_a_command():
        print(f"  {name}")


if __name__ == "__main__":
    main()
