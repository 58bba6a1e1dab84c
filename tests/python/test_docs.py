"""docs/PYTHON.md's examples: each ```python block runs as a program of its
own (with this build's package) and must exit 0."""

import os
import re
import subprocess
import sys

import pytest

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "PYTHON.md")


def blocks():
    with open(DOC) as f:
        text = f.read()
    found = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(found) >= 5, "docs/PYTHON.md lost its examples"
    return found


@pytest.mark.parametrize("index", range(len(blocks())))
def test_example_runs(index):
    code = blocks()[index]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, "example %d failed:\n%s\n%s" % (index, out.stdout, out.stderr)


def test_shell_snippet_prints_devices():
    out = subprocess.run([sys.executable, "-c", "import conveyor; print(conveyor.devices())"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "DeviceInfo(name='soft'" in out.stdout, out.stderr
