"""A process whose C++ kernel units are still building when it ends, or is stopped with Ctrl-C while it
waits for one, exits without waiting for the compilers (ember/native/build_threads.py). The compiler
here never finishes (``sleep``): before the fix, exit joined the build threads and hung; the test
only asks that the process ends (a hang detector with a generous limit, not a timing measurement)
and that the compilers it started were killed."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch")  # (the child process imports ember)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HANG_S = 240  # far above a loaded machine's start-up and exit (~15 s): only a hang reaches it

SCRIPT = textwrap.dedent("""
    import os, sys, tempfile, time
    from ember.native import cpp_build
    from ember.native.cpp_emit import translation_unit
    base = tempfile.mkdtemp()
    paths = []
    for i in range(4):  # more units than build threads: some queued, some compiling
        paths.append(cpp_build.write_source(translation_unit([]) + f"// unit {i}\\n", base))
        cpp_build.submit(paths[-1])
    print("submitted", flush=True)
    for _ in range(2000):  # until a compiler runs (so one is running, others queued, at the end)
        if os.path.exists(sys.argv[2]) and open(sys.argv[2]).read().strip():
            break
        time.sleep(0.1)
    if sys.argv[1] == "wait":
        cpp_build.library(paths[0])  # blocks: stopped by SIGINT
""")


def _never_finishing_compiler(tmp_path):
    pids = tmp_path / "pids"
    cxx = tmp_path / "cxx"
    cxx.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo fake-cxx 1; exit 0; fi\n"
                   f"echo $$ >> {pids}\nexec sleep 1000\n")
    cxx.chmod(0o755)
    return cxx, pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("how", ["script_ends", "ctrl_c_while_waiting"])
def test_exit_does_not_wait_for_background_builds(tmp_path, how):
    cxx, pids = _never_finishing_compiler(tmp_path)
    env = {**os.environ, "CXX": str(cxx), "EMBER_CACHE_DIR": str(tmp_path / "cache"), "EMBER_COMPILE_THREADS": "2",
           "PYTHONPATH": REPO}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "wait" if how != "script_ends" else "end", str(pids)],
                            env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "submitted"
        if how == "ctrl_c_while_waiting":
            deadline = time.monotonic() + HANG_S
            while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
                time.sleep(0.1)  # a compiler is running, so the main thread is (about to be) waiting for it
            time.sleep(1.0)
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the process did not exit: it waited for its background builds")
    if how == "ctrl_c_while_waiting":
        assert "KeyboardInterrupt" in err, err
    else:
        assert proc.returncode == 0, err
    started = [int(p) for p in pids.read_text().split()] if pids.exists() else []
    assert started, "no compiler ran: the test tested nothing"
    for _ in range(50):  # (a killed process may take a moment to be reaped by init)
        if not any(_alive(p) for p in started):
            break
        time.sleep(0.1)
    assert not any(_alive(p) for p in started), "a compiler was left running"
