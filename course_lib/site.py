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
import tempfile
from pathlib import Path

import nbformat
from docutils.nodes import SkipNode

from course_lib.exercises import editions

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "site"
WIDGET = "application/vnd.jupyter.widget-view+json"
MARKER = ".course-site"  # written into every folder this command builds: only those it replaces
CSS = """.bd-page-width { max-width: 100rem; }
.bd-main .bd-content .bd-article-container { max-width: 64em; }
div.highlight pre, div.cell_output pre { font-size: 12.5px; }
div.math-display { margin: 0.8em 0; overflow-x: auto; }
"""

CONF = '''
project = {title!r}
html_title = {title!r}
author = "the course's authors"
html_css_files = ["course.css"]
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
        raise ModuleNotFoundError("course_lib is not installed: pip install the course's "
                                  "student edition, then run this lesson again")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", KIT], check=True)
    importlib.invalidate_caches()'''

HOW_TO_RUN = '''\
> **Run this lesson.** What follows is the lesson as it last ran: every figure and number was
> printed by its code. To run it with its exercises unsolved, clone the course and write the
> student edition with `python -m course_lib.exercises student` (the README's quick start).
> {hosted}'''
HOSTED = ("On a hosted notebook service, run this notebook (the site's download button gives it): "
          "its next cell installs the course's student edition from `{kit}` where it is missing.")
NOT_HOSTED = ("Its next cell would install the kit on a hosted notebook service, but this site "
              "was built without one to install (`--kit`): clone the course instead.")
STILL = ("> On the website: the figure for the widget's first setting. Run the notebook to move "
         "its controls.")


def lessons(root: Path = ROOT) -> list[Path]:
    """The lesson notebooks, in the course's order."""
    return sorted((Path(root) / "notebooks").glob("*.ipynb"))


def page(nb, kit: str | None = None):
    """A lesson's page: its student edition, each widget's live view replaced by a note under
    its first figure, with a note on how to run it and a first cell that installs the student
    edition (``kit``: what pip installs)."""
    out, cells = editions.student_version(nb), []
    for cell in out.cells:
        cells.append(cell)
        if cell.cell_type == "code" and any(WIDGET in o.get("data", {}) for o in cell.outputs):
            cell.outputs = [o for o in cell.outputs if WIDGET not in o.get("data", {})]
            cells.append(nbformat.v4.new_markdown_cell(STILL))
    hosted = HOSTED.format(kit=kit) if kit else NOT_HOSTED
    install = nbformat.v4.new_code_cell(INSTALL.format(kit=kit))
    install.metadata["tags"] = ["hide-input"]
    first = 1 if cells and cells[0].cell_type == "markdown" else 0  # after the title
    cells[first:first] = [nbformat.v4.new_markdown_cell(HOW_TO_RUN.format(hosted=hosted)), install]
    out.cells = cells
    for i, cell in enumerate(out.cells):
        cell["id"] = f"cell-{i}"  # unique, whatever the inserted cells were given
    return out


def landing(readme: str, names: list[str]) -> str:
    """The landing page: the README's title and first paragraph, then its lesson table with
    each notebook link pointing at the lesson's page, and the table of contents."""
    title = re.search(r"^# (.+)$", readme, re.M)
    intro = re.search(r"^# .+?\n\n(.+?)\n\n", readme, re.S)
    table = re.search(r"^## Lessons\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    if not (title and table):
        raise ValueError("the README has no '# title' or no '## Lessons' section to build from")
    rows = [line for line in table.group(1).splitlines() if line.startswith("|")]
    cells = {len(re.findall(r"(?<!\\)\|", row)) for row in rows}
    if len(cells) > 1:
        raise ValueError("a row of the README's lesson table has more or fewer cells than its "
                         "header: escape a | inside a cell as \\|")
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
    readme = (Path(root) / "README.md").read_text(encoding="utf-8")
    title = re.search(r"^# (.+)$", readme, re.M)
    (src / "conf.py").write_text(CONF.format(title=title.group(1) if title else "The course"))
    (src / "_static" / "favicon.svg").write_text(FAVICON)
    (src / "_static" / "course.css").write_text(CSS)
    pages = []
    for path in lessons(root):
        nbformat.write(page(nbformat.read(path, as_version=4), kit), src / path.name)
        pages.append(src / path.name)
    (src / "index.md").write_text(landing(readme, [p.stem for p in pages]), encoding="utf-8")
    return pages


def check_out(out: Path, root: Path = ROOT) -> Path:
    """``out`` resolved, if the build may write there: a new or empty folder, or one this
    command built before (it holds :data:`MARKER`); never the course's own folders."""
    out, root = Path(out).resolve(), Path(root).resolve()
    if out == root or root.is_relative_to(out) or any(
            out.is_relative_to(root / part) for part in ("notebooks", "course_lib", ".git")):
        raise ValueError(f"--out {out} would overwrite the course itself: build elsewhere "
                         f"(the default is {OUT})")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise ValueError(f"--out {out} holds files this command did not build: it replaces the "
                         f"whole folder, so choose a new or empty one (or delete it yourself)")
    return out


def build(out: Path = OUT, kit: str | None = None, root: Path = ROOT) -> Path:
    """Build the site into ``out`` (checked by :func:`check_out`, then replaced); returns the
    landing page. Nothing is executed, and nothing is fetched from the network. Sphinx and
    MyST-NB work in a temporary folder; only the site is copied to ``out``."""
    from sphinx.cmd.build import build_main

    out = check_out(out, root)
    with tempfile.TemporaryDirectory(prefix="course-site-") as work:
        src, html = Path(work) / "src", Path(work) / "html"
        stage(src, kit, root)
        code = build_main(["-b", "html", "-q", "-W", "--keep-going", "-j", "2",
                           "-d", str(Path(work) / "doctrees"), str(src), str(html)])
        if code != 0:
            raise RuntimeError(f"sphinx-build failed (exit {code}): its messages are above")
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(html, out)
    (out / MARKER).write_text("built by python -m course_lib.site build: it may replace me\n")
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
    try:
        index = build(args.out, args.kit)
    except ValueError as why:
        print(f"python -m course_lib.site: {why}", file=sys.stderr)
        return 2
    print(f"built {index}: open it in a browser, or publish {args.out} on any static host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
