"""The course as a website a class reads before running anything: one page per lesson, built
from the committed, executed notebooks (never re-executed) with Sphinx and MyST-NB.

Lecture: none (how the course is published). Why Sphinx with MyST-NB (the engine of Jupyter
Book 1): it builds offline from pip packages alone (no Node, no theme fetched at build time), in
seconds; it renders a notebook's saved outputs and figures as they are; it ships a client-side
search index. Math becomes MathML while the site is built (``latex2mathml``, a small extension
below), which browsers draw themselves: a page loads no script, font or CDN for it, and needs no
network either.

Each lesson's page is its student edition (:func:`~course_lib.exercises.editions.
student_version`: every solution replaced by its stub, the exercises' own outputs cleared),
without the live views of widgets (a widget's default figure is saved beside it as a picture,
and stays), with a note on how to run it after the title, and a first code cell that installs
the kit where it is missing (a hosted notebook service). The landing page is the README's
lesson table. The instructor's guide is left out: it holds the answers.

    python -m course_lib.site build [--out build/site] [--kit PIP-SPEC]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

import nbformat
from docutils.nodes import SkipNode

from course_lib.exercises import editions

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "site"
WIDGET = "application/vnd.jupyter.widget-view+json"
TITLE = "Parallel and distributed deep learning, by doing it"

CONF = '''
project = {title!r}
html_title = {title!r}
extensions = ["myst_nb", "course_lib.site"]  # course_lib.site: math as MathML, at build time
nb_execution_mode = "off"  # the committed outputs, as they are
myst_enable_extensions = ["dollarmath", "amsmath"]
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]
html_math_renderer = "mathml"
html_theme = "sphinx_book_theme"
html_theme_options = {{"use_download_button": True, "home_page_in_toc": True}}
html_context = {{"default_mode": "light"}}
html_static_path = ["_static"]
html_favicon = "_static/favicon.svg"
html_show_sourcelink = False
'''
FAVICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" '
           'height="16" rx="3" fill="#1f77b4"/></svg>\n')

INSTALL = '''\
# Where the course kit is not installed (a hosted notebook service), this cell installs it;
# where `course_lib` imports already, it does nothing.
import importlib.util
import subprocess
import sys

KIT = {kit!r}  # what pip installs: set when the site was built (--kit)
if importlib.util.find_spec("course_lib") is None:
    if KIT is None:
        raise ModuleNotFoundError("course_lib is not installed: pip install the course kit "
                                  "from your course's repository, then run this lesson again")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", KIT], check=True)'''

HOW_TO_RUN = '''\
```{{admonition}} Run this lesson
:class: tip
This page shows the lesson as it last ran: every figure and number below was printed by its
code. To run it yourself, with its exercises unsolved, clone the course and write the student
edition: `python -m course_lib.exercises student` (the README's quick start). On a hosted
notebook service, download this page's notebook (the download button above) and run it there:
its first cell installs the kit{where}.{widgets}
```'''


def lessons(root: Path = ROOT) -> list[Path]:
    """The lesson notebooks, in the course's order."""
    return sorted((Path(root) / "notebooks").glob("*.ipynb"))


def page(nb, kit: str | None = None):
    """A lesson's page: its student edition, without widgets' live views, with a note on how
    to run it and a first cell that installs the kit (``kit``: what pip installs)."""
    out, live = editions.student_version(nb), 0
    for cell in out.cells:
        if cell.cell_type == "code":
            live += sum(WIDGET in o.get("data", {}) for o in cell.outputs)
            cell.outputs = [o for o in cell.outputs if WIDGET not in o.get("data", {})]
    where = f" from `{kit}`" if kit else " (this site was built without a kit to install)"
    widgets = (" The widgets of this lesson respond only in a running notebook: here each shows "
               "the figure of its first setting.") if live else ""
    note = nbformat.v4.new_markdown_cell(HOW_TO_RUN.format(where=where, widgets=widgets))
    install = nbformat.v4.new_code_cell(INSTALL.format(kit=kit))
    first = 1 if out.cells and out.cells[0].cell_type == "markdown" else 0  # after the title
    out.cells[first:first] = [note, install]
    for i, cell in enumerate(out.cells):
        cell["id"] = f"cell-{i}"  # unique, whatever the inserted cells were given
    return out


def landing(readme: str, names: list[str]) -> str:
    """The landing page: the README's title and first paragraph, then its lesson table with
    each notebook link pointing at the lesson's page, and the table of contents."""
    title = re.search(r"^# (.+)$", readme, re.M)
    intro = re.search(r"^# .+?\n\n(.+?)\n\n", readme, re.S)
    table = re.search(r"^## Lessons\n(.*?)(?=^## )", readme, re.S | re.M)
    if not (title and table):
        raise ValueError("the README has no '# title' or no '## Lessons' section to build from")
    body = re.sub(r"\]\(notebooks/([^)]+\.ipynb)\)", r"](\1)", table.group(1))
    toc = "\n".join(["```{toctree}", ":hidden:", ":maxdepth: 1", "", *names, "```"])
    return "\n\n".join([f"# {title.group(1)}", intro.group(1) if intro else "",
                        "## Lessons", body.strip(), toc]) + "\n"


def _mathml(latex: str, display: str) -> str:
    from latex2mathml.converter import convert

    return convert(latex, display=display)


def _visit_math(translator, node):
    translator.body.append(_mathml(node.astext(), "inline"))
    raise SkipNode


def _visit_math_block(translator, node):
    translator.body.append(f'<div class="math-display">{_mathml(node.astext(), "block")}</div>')
    raise SkipNode


def setup(app):
    """A Sphinx extension: every formula becomes MathML when the page is built (browsers draw
    MathML themselves), so a page loads no script and no font for its math."""
    app.add_html_math_renderer("mathml", (_visit_math, None), (_visit_math_block, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def stage(src: Path, kit: str | None = None, root: Path = ROOT) -> list[Path]:
    """Write the site's sources into ``src``: the configuration, the landing page and one
    page notebook per lesson (the instructor's guide is never copied). Returns the pages."""
    src = Path(src)
    if src.exists():
        shutil.rmtree(src)
    (src / "_static").mkdir(parents=True)
    (src / "conf.py").write_text(CONF.format(title=TITLE))
    (src / "_static" / "favicon.svg").write_text(FAVICON)
    pages = []
    for path in lessons(root):
        nbformat.write(page(nbformat.read(path, as_version=4), kit), src / path.name)
        pages.append(src / path.name)
    readme = (Path(root) / "README.md").read_text(encoding="utf-8")
    (src / "index.md").write_text(landing(readme, [p.stem for p in pages]), encoding="utf-8")
    return pages


def build(out: Path = OUT, kit: str | None = None, root: Path = ROOT) -> Path:
    """Build the site into ``out`` (its sources staged beside it, in ``<out>-src``); returns
    the landing page. Nothing is executed, and nothing is fetched from the network."""
    from sphinx.cmd.build import build_main

    out = Path(out)
    src = out.parent / f"{out.name}-src"
    stage(src, kit, root)
    if out.exists():
        shutil.rmtree(out)
    code = build_main(["-b", "html", "-q", "-j", "2", str(src), str(out)])
    if code != 0:
        raise RuntimeError(f"sphinx-build failed (exit {code}) on the sources in {src}")
    return out / "index.html"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.site",
                                     description="Build the course's static website.")
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="build the site from the committed notebooks")
    make.add_argument("--out", type=Path, default=OUT, help=f"where (default {OUT})")
    make.add_argument("--kit", default=None,
                      help="what a hosted notebook's first cell pip-installs, e.g. "
                           "git+https://<your course's repository>")
    args = parser.parse_args(argv)
    index = build(args.out, args.kit)
    print(f"built {index}: open it in a browser, or publish {args.out} on any static host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
