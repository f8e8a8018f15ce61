"""The README's promises: two Quick start commands, the test command CI runs, real links."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def quick_start_blocks():
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.S)


def test_quick_start_is_exactly_two_one_line_commands():
    blocks = quick_start_blocks()
    assert len(blocks) == 2
    assert all(len(b.strip().splitlines()) == 1 for b in blocks)
    lab, test = (b.strip() for b in blocks)
    # students open the student edition; the instructor's path is in the text below it
    assert "pip install -r requirements.txt" in lab and "course_lib.exercises student" in lab
    assert "jupyter lab notebooks/00_start_here.ipynb" in README
    assert "pip install -r requirements.txt" in test and "pytest" in test


def test_ci_runs_the_readme_test_command():
    found = subprocess.run(
        ["awk", "/<!-- quick-start:test -->/ {found=1; next} found && /^```/ "
         "{inblock=!inblock; if (!inblock) exit; next} found && inblock {print; exit}",
         str(ROOT / "README.md")], capture_output=True, text=True, check=True).stdout.strip()
    assert found == quick_start_blocks()[1].strip()
    assert "README.md" in (ROOT / ".ci" / "run").read_text()


def test_every_linked_notebook_exists():
    for link in re.findall(r"\]\((notebooks/[^)]+\.ipynb)\)", README):
        assert (ROOT / link).exists(), link


def test_every_notebook_is_in_the_lesson_table():
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        assert nb.stem in README, f"{nb.name} is missing from the README's lesson table"


def test_the_homework_commands_work_as_written_on_a_fresh_clone(tmp_path):
    import os
    import sys

    block = README.split("<!-- homework -->", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "0 / 3 points" in done.stdout  # lesson 1 has three exercises
    assert (clone / "reports" / "01_backprop.json").exists()
