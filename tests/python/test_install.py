"""`cmake --install` puts a working package where Debian's /usr/bin/python3
looks: installed into a temporary prefix (the python component), imported
from there by a fresh interpreter, and the default place is on its path."""

import os
import subprocess
import sys
import tempfile

import pytest

BUILD = os.environ.get("CONVEYOR_BUILD_DIR")
CMAKE = os.environ.get("CONVEYOR_CMAKE", "cmake")
DEST = os.environ.get("CONVEYOR_PYTHON_INSTALL_DIR")

pytestmark = pytest.mark.skipif(not BUILD or not DEST, reason="run through ctest (python.install)")


def test_default_install_dir_is_on_debian_pythons_path():
    out = subprocess.run(["/usr/bin/python3", "-c", "import sys; print('\\n'.join(sys.path))"],
                         capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    paths = out.stdout.split()
    assert os.path.join("/usr/local", DEST) in paths, (DEST, paths)
    assert os.path.join("/usr", DEST) in paths, (DEST, paths)


def test_installed_package_works():
    with tempfile.TemporaryDirectory() as prefix:
        subprocess.run([CMAKE, "--install", BUILD, "--prefix", prefix, "--component", "python"],
                       check=True, capture_output=True)
        site = os.path.join(prefix, DEST)
        files = sorted(os.listdir(os.path.join(site, "conveyor")))
        for f in ("__init__.py", "__init__.pyi", "_async.py", "_errors.py", "py.typed", "kv.py", "kv.pyi"):
            assert f in files, files
        assert any(f.startswith("_conveyor.") and f.endswith(".so") for f in files), files
        if os.path.isdir(os.path.join(BUILD, "python", "conveyor_gloo")):  # built with torch
            gloo = sorted(os.listdir(os.path.join(site, "conveyor_gloo")))
            assert "__init__.py" in gloo and "__main__.py" in gloo, gloo
        code = ("import conveyor, threading\n"
                "assert conveyor.__file__.startswith(%r), conveyor.__file__\n"
                "print(conveyor.devices())\n"
                "d = conveyor.Device.open('soft'); pd = d.alloc_pd(); cq = d.create_cq(16)\n"
                "b = bytearray(b'installed'); mr = pd.register_memory(b, conveyor.ALL_ACCESS)\n"
                "lis = conveyor.Listener.bind(d, '127.0.0.1:0'); tq = pd.create_qp(cq)\n"
                "t = threading.Thread(target=lambda: lis.accept(5).accept(tq, mr.remote().encode())); t.start()\n"
                "qp = pd.create_qp(cq); peer = conveyor.RemoteRegion.decode(conveyor.connect(qp, lis.address).private_data)\n"
                "t.join(); out = bytearray(9); qp.read_into(out, peer); assert out == b'installed'\n") % site
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": site}
        for k in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS"):  # sanitizer builds
            if k in os.environ:
                env[k] = os.environ[k]
        out = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True, env=env,
                             cwd=prefix, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "DeviceInfo(name='soft'" in out.stdout
