"""The docs stay true: every ```python block of docs/*.md and README.md runs, and shown output is real.

Rules for writing docs (see docs/architecture.md, "Docs"):

- a page's ```python blocks run in order, in one namespace that starts with ``torch`` and ``ember``
  imported, with the page's file name and line numbers (so file:line in ember's reports points into
  the page itself);
- a block preceded by ``<!-- skip-test -->`` is not run (GPU-only examples, say); a page whose block
  needs an optional package that is missing (openvino, timm, torchvision, matplotlib, diffusers) is skipped from there;
- a ```text block preceded by ``<!-- expected-output -->`` must equal what the python block before
  it printed (stdout, stderr and ember's log lines together). A line ``...`` stands for any number of
  lines, and ``...`` inside a line for any text, so long, changeable parts can be left out.

Every public name of ``ember.__all__`` must be documented in docs/api.md, and README.md must link
every page of docs/.
"""
import contextlib
import io
import linecache
import logging
import re
import warnings
from pathlib import Path

import pytest
import torch

import ember

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
SKIP, EXPECT = "<!-- skip-test -->", "<!-- expected-output -->"
OPTIONAL = {"openvino", "timm", "torchvision", "matplotlib", "diffusers"}  # a page needing one skips where it is missing


def blocks(path: Path) -> list[dict]:
    """Fenced blocks: language, first line number (1-based, of the code), code, and the marker above."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start = i + 1
        end = next((j for j in range(start, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{path.name}:{i + 1}: unclosed code fence"
        marker = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        found.append(dict(lang=m.group(1), line=start + 1, code="\n".join(lines[start:end]), marker=marker))
        i = end + 1
    return found


def _matches(expected: str, actual: str) -> bool:
    parts = []
    for line in expected.strip("\n").splitlines():
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(map(re.escape, line.rstrip().split("..."))) + r"[ \t]*\n")
    text = "\n".join(ln.rstrip() for ln in actual.strip("\n").splitlines()) + "\n"
    return re.fullmatch("".join(parts), text, re.DOTALL) is not None


def _run(code: str, filename: str, first_line: int, namespace: dict) -> str:
    """Run one block; return everything it printed, ember's log lines included."""
    source = "\n" * (first_line - 1) + code + "\n"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    out = io.StringIO()
    handler = next(h for h in logging.getLogger("ember.graph_breaks").handlers if isinstance(h, logging.StreamHandler))
    old_stream = handler.setStream(out)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), warnings.catch_warnings():
            warnings.simplefilter("always")
            exec(compile(source, filename, "exec"), namespace)
    finally:
        handler.setStream(old_stream)
    return out.getvalue()


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_code_runs_and_output_is_real(page, monkeypatch):
    from ember.diagnostics import logging as elog

    elog.get_logger("graph_breaks")  # make sure ember's log handler exists before a block swaps its stream
    monkeypatch.setattr(ember.config, "logs", ember.config.logs)  # a page may turn logs on; undo it after
    namespace = {"__name__": f"docs_{page.stem.replace('-', '_')}", "torch": torch, "ember": ember}
    filename = str(page.relative_to(REPO))
    last_output = None
    try:
        for b in blocks(page):
            if b["lang"] == "python" and b["marker"] != SKIP:
                try:
                    last_output = _run(b["code"], filename, b["line"], namespace)
                except ModuleNotFoundError as exc:
                    if exc.name not in OPTIONAL:
                        raise
                    pytest.skip(f"{filename}:{b['line']} needs {exc.name}, which is not installed")
            elif b["lang"] == "text" and b["marker"] == EXPECT:
                assert last_output is not None, f"{filename}:{b['line']}: expected output with no python block before it"
                assert _matches(b["code"], last_output), (
                    f"{filename}:{b['line']}: the output shown is not what the code prints.\n--- shown:\n{b['code']}\n"
                    f"--- printed:\n{last_output}")
    finally:
        ember.reset()
        elog.refresh()
        torch.set_default_dtype(torch.float32)


def test_matcher():
    assert _matches("a\n...\nd", "a\nb\nc\nd\n")
    assert _matches("x = ... s", "x = 0.25 s")
    assert not _matches("a\nb", "a\nc")


def test_every_public_name_is_in_the_api_reference():
    api = (REPO / "docs" / "api.md").read_text()
    missing = [n for n in ember.__all__ if not re.search(rf"`(ember\.)?{re.escape(n)}[`(]", api)]
    assert not missing, f"docs/api.md does not document {missing}"


def test_readme_links_every_page():
    readme = (REPO / "README.md").read_text()
    missing = [p.name for p in PAGES[:-1] if f"docs/{p.name}" not in readme]
    assert not missing, f"README.md does not link {missing}"
