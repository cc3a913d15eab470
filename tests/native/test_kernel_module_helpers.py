"""``build_worker.load_kernel_module`` loads ember's Triton helpers only for a module that imports them
(session 38): a wrapper or C++ module, the only generated modules a warm start whose kernels are
adopted from recorded binaries executes, does not pay for their 26 ``@triton.jit`` definitions; a
kernel module still finds them."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CHILD = r'''
import hashlib, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "ember", "native"))
import build_worker  # (by file, as a worker does: no ember package)
folder = sys.argv[2]
def load(name, text):
    path = os.path.join(folder, name + ".py")
    src = text.encode()
    with open(path, "wb") as f:
        f.write(src)
    return build_worker.load_kernel_module(path, digest=hashlib.sha256(src).hexdigest(), source=src)
wrapper = load("wrapper_mod", "def call(x):\n    return x + 1\n")
assert wrapper.call(1) == 2
print("after wrapper", "ember.native.triton_helpers" in sys.modules, "ember" in sys.modules)
kernel = load("kernel_mod", "from ember.native.triton_helpers import *  # noqa\nOK = callable(maximum)\n")
print("after kernel", "ember.native.triton_helpers" in sys.modules, kernel.OK, "ember" in sys.modules)
'''


def test_helpers_only_for_modules_that_import_them(tmp_path):
    p = subprocess.run([sys.executable, "-c", _CHILD, REPO, str(tmp_path)], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, EMBER_CACHE_DIR=str(tmp_path / "cache")))
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert "after wrapper False False" in lines
    assert "after kernel True True False" in lines
