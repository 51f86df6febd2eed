"""The Python blocks of docs/python.md and the examples of examples/python run as shown."""
import os
import re
import subprocess
import sys

import pytest


PAGES = {"docs/python.md": 6, "README.md": 1}


def blocks(source_dir, page):
    text = (source_dir / page).read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_is_run_here(page, source_dir):
    assert len(blocks(source_dir, page)) == PAGES[page]


@pytest.mark.parametrize("page,index", [(p, i) for p, n in PAGES.items() for i in range(n)])
def test_python_block_runs(page, index, source_dir, tmp_path, monkeypatch):
    code = blocks(source_dir, page)[index]
    (tmp_path / "configs").symlink_to(source_dir / "configs")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{page} python block {index}", "exec"), {})


def test_train_loop_example_learns(source_dir):
    out = subprocess.run([sys.executable, str(source_dir / "examples/python/train_loop.py")],
                         check=True, capture_output=True, text=True, env=os.environ).stdout
    losses = [float(m) for m in re.findall(r"loss (\d+\.\d+)", out)]
    assert len(losses) == 5 and losses[-1] < 0.5 * losses[0], out
    accuracy = float(re.search(r"accuracy (\d\.\d+)", out).group(1))
    assert accuracy > 0.85, out
