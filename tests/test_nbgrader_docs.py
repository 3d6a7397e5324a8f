"""docs/teaching.md's nbgrader commands, run as written in a fresh shell.

The block once called a bare ``nbgrader`` in a shell where only ``.venv/bin/nbgrader`` would
have found it; and with that path, and the venv not activated, ``generate_assignment`` failed
inside (nbgrader runs ``alembic`` by name, found on PATH) and ``autograde`` then said the
assignment did not exist. The tests beside nbgrader's (tests/test_release_files.py,
tests/test_grading_class.py) put the venv on PATH themselves, so they could not see it."""

import re
import sqlite3
import subprocess
from pathlib import Path

import pytest

from course_utils.grading import limits

ROOT = Path(__file__).resolve().parents[1]
TEACHING = ROOT / "docs" / "teaching.md"


def nbgrader_block() -> str:
    """The ```bash block of docs/teaching.md that runs ``nbgrader autograde``."""
    blocks = re.findall(r"^```bash\n(.*?)^```", TEACHING.read_text(), flags=re.M | re.S)
    found = [b for b in blocks if "nbgrader autograde" in b]
    assert len(found) == 1, f"{len(found)} bash blocks of docs/teaching.md run nbgrader autograde"
    return found[0]


@pytest.mark.grader
def test_the_documented_nbgrader_commands_work_in_a_fresh_shell(tmp_path):
    """The block, verbatim, from the repository's folder in ``bash -e`` with nothing of this
    process's environment (PATH=/usr/bin:/bin, HOME a fresh folder): it releases the nbgrader
    course, generates the exercise and autogrades the submission it collects. One release and
    two nbgrader commands, one notebook run: ~11 CPU-s. Every process it starts is killed after
    it, whatever happens (the kernel nbgrader starts runs in its own session)."""
    pytest.importorskip("nbgrader")
    block = nbgrader_block()
    home = tmp_path / "home"
    home.mkdir()
    env = ["env", "-i", "PATH=/usr/bin:/bin", f"HOME={home}", "LANG=C.UTF-8"]
    with limits.subreaper():
        before = limits.descendants()
        p = subprocess.Popen([*env, "bash", "-e", "-c", block], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out = p.communicate(timeout=300)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            out = p.communicate()[0] + "\n(killed after 300 s)"
        finally:
            limits.kill_new_descendants(before)
    assert p.returncode == 0, out[-6000:]
    assert "ERROR" not in out, out[-6000:]
    dbs = list(home.rglob("gradebook.db"))
    assert len(dbs) == 1, (dbs, out[-3000:])
    with sqlite3.connect(dbs[0]) as db:
        students = [r[0] for r in db.execute("SELECT student_id FROM submitted_assignment")]
        grades = list(db.execute("SELECT g.auto_score, c.max_score FROM grade g JOIN grade_cells c ON g.cell_id = c.id"))
    assert students == ["alice"], (students, out[-3000:])
    # the untouched exercise: every check cell ran and scored 0 of the exercise's points
    assert grades and all(score == 0 for score, _ in grades) and sum(m for _, m in grades) > 0, grades
