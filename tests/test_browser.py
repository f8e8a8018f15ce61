"""The student's path in a real browser: the student command starts JupyterLab, Chromium opens
the student edition of a lesson whose first exercise comes early, runs all its cells, and the
last cell runs, with every figure of the lesson drawn and each check saying "not solved yet".

Needs Playwright (``pip install playwright``) and a Chromium (Debian's ``chromium``, which
``.ci/run`` installs where it can); skipped, saying which is missing, where they are not.
"""

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
# its first exercise is its seventh code cell, and a figure follows both exercises. Lesson 0
# checks what holds on a crowded machine; an emulated-device lesson (10 was used here) checks
# timings that Chromium, JupyterLab and the other test worker beside it can push past its bounds
LESSON = "00_start_here.ipynb"
CHROMIUM = os.environ.get("COURSE_LIB_CHROMIUM") or shutil.which("chromium") or \
    shutil.which("chromium-browser")

playwright = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed "
                                 "(pip install playwright)")
pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install "
                                 "chromium, or set COURSE_LIB_CHROMIUM)"),
              pytest.mark.skipif(sys.platform != "linux", reason="the CI browser runs on Linux")]

CELLS = """() => {
    const panel = window.jupyterapp.shell.currentWidget;
    if (!panel || !panel.content || !panel.content.model) return null;
    const cells = [];
    for (const cell of panel.content.model.cells) {
        if (cell.type !== "code") continue;
        const outputs = [];
        for (let i = 0; i < cell.outputs.length; i++) outputs.push(cell.outputs.get(i).toJSON());
        cells.push({count: cell.executionCount, outputs: outputs});
    }
    return {cells: cells, busy: panel.sessionContext.session?.kernel?.status};
}"""


def _server(runtime: Path, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in runtime.glob("jpserver-*.json"):
            with open(path) as f:
                return json.load(f)
        time.sleep(0.5)
    raise AssertionError("JupyterLab did not start")


def test_run_all_in_chromium_reaches_the_last_cell_with_the_lessons_figures(tmp_path):
    token, runtime = secrets.token_hex(16), tmp_path / "runtime"
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # a student's terminal
    lab = subprocess.Popen(
        [sys.executable, "-m", "course_lib.exercises", "student", str(tmp_path / "student"),
         "--no-browser", "--port=0", f"--IdentityProvider.token={token}",
         "--LabApp.expose_app_in_browser=True"],
        cwd=ROOT, env={**env, "JUPYTER_RUNTIME_DIR": str(runtime)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        server = _server(runtime)
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{server['port']}/lab/tree/{LESSON}?token={token}")
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell."
                                   "currentWidget?.sessionContext?.session?.kernel?.status "
                                   "=== 'idle'", timeout=120_000)
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            # done when every cell ran, or when one failed (Run All stops there: say which)
            page.wait_for_function(f"() => {{ const s = ({CELLS})(); return s && s.busy === "
                                   f"'idle' && (s.cells.every(c => c.count) || s.cells.some("
                                   f"c => c.outputs.some(o => o.output_type === 'error'))); }}",
                                   timeout=300_000, polling=1000)
            ran = page.evaluate(CELLS)
            page.keyboard.press("Control+End")
            drawn = page.locator(".jp-OutputArea-output img").count()
            browser.close()
    finally:
        os.killpg(lab.pid, signal.SIGTERM)  # JupyterLab shuts its kernels down, then exits
        try:
            lab.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait()
    lesson = nbformat.read(ROOT / "notebooks" / LESSON, as_version=4)
    code = [c for c in lesson.cells if c.cell_type == "code"]
    errors = [(i, o["ename"], o["evalue"]) for i, c in enumerate(ran["cells"])
              for o in c["outputs"] if o["output_type"] == "error"]
    assert errors == [], f"code cell {errors[0][0]} failed: {errors[0][1]}: {errors[0][2]}"
    assert len(ran["cells"]) == len(code) and all(c["count"] for c in ran["cells"])
    figures = sum("image/png" in o.get("data", {}) for c in code for o in c.outputs)
    shown = sum("image/png" in o.get("data", {}) for c in ran["cells"] for o in c["outputs"])
    assert figures >= 2 and shown == figures  # every figure of the lesson, drawn afresh
    assert drawn >= 1  # and on the page
    checks = [c for c, ours in zip(ran["cells"], code, strict=True)
              if ours.metadata.get("nbgrader", {}).get("grade")]
    said = ["".join(o.get("data", {}).get("text/plain", "") for o in c["outputs"])
            for c in checks]
    assert len(said) >= 2 and all(s.startswith("not solved yet") for s in said), said
