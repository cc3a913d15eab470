"""No measured figure without a committed result: every paragraph, list item or table of README.md
and docs/*.md that quotes a measurement (a speedup ``1.6x``, a time ``2.1 s`` / ``3 ms`` / ``40 µs``,
a percentage, a bandwidth) names the file under benchmarks/results/ it comes from, and that file is
committed. A figure from a run nobody committed goes, or is reworded without the number."""
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:x|ms|s|%|µs|us|GB/s)(?!\w)")
RESULT = re.compile(r"benchmarks/results/([\w.+-]+\.(?:json|md|txt))")


def prose_blocks(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph / list item outside code fences; a table belongs to the
    paragraph above it (which says where its numbers come from)."""
    out: list[list] = []
    fence = False
    prev_blank = True
    for no, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
            prev_blank = True
            continue
        if fence:
            continue
        stripped = line.strip()
        if not stripped:
            prev_blank = True
            continue
        table = stripped.startswith("|")
        item = re.match(r"^\s*([-*]|\d+\.)\s", line) is not None
        if out and (table or not (prev_blank or item)):
            out[-1][1] += "\n" + line
        else:
            out.append([no, line])
        prev_blank = False
    return [(no, t) for no, t in out]


def committed(name: str) -> bool:
    path = f"benchmarks/results/{name}"
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=REPO,
                             capture_output=True).returncode == 0
    return tracked or not (REPO / ".git").exists() and (REPO / path).is_file()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_figure_names_a_committed_result_file(page):
    problems = []
    for no, block in prose_blocks(page.read_text()):
        figures = FIGURE.findall(block)
        files = RESULT.findall(block)
        missing = [f for f in files if not committed(f)]
        if missing:
            problems.append(f"{page.name}:{no}: names {missing}, which is not committed under benchmarks/results/")
        if figures and not files:
            problems.append(f"{page.name}:{no}: quotes {figures} without naming the benchmarks/results/ "
                            "file they come from (link the file, or drop the figure)")
    assert not problems, "\n".join(problems)


def test_prose_blocks_and_figures():
    text = "Para 1.6x faster\n\n| a | b |\n|---|---|\n| 3 | 2.1 ms |\n\n- item 5 s\n  more\n- two\n```\n9 s\n```\n"
    blocks = prose_blocks(text)
    assert [no for no, _ in blocks] == [1, 7, 9]
    assert FIGURE.findall(blocks[0][1]) == ["1.6x", "2.1 ms"] and FIGURE.findall(blocks[1][1]) == ["5 s"]
    assert not FIGURE.findall("8192x4096 bf16, b16x256, 96x96, x86_64, GPT-2 124M, 50257")
