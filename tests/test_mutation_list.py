"""The mutation list of tools/mutation.py stays current: every snippet occurs exactly once in its
file (code that moved or changed fails here, naming the mutant to update) and every selection
names test files that exist. The mutants themselves are run by hand: python tools/mutation.py."""
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _mutation():
    spec = importlib.util.spec_from_file_location("ember_mutation_tool", REPO / "tools" / "mutation.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_every_snippet_occurs_exactly_once():
    mod = _mutation()
    assert mod.check(mod.MUTANTS, str(REPO)) == []


def test_selections_name_existing_tests():
    mod = _mutation()
    for m in mod.MUTANTS:
        paths = [a.split("::")[0] for a in m.tests if a.startswith("tests/")]
        assert paths, f"{m.name}: no test file in its selection {m.tests}"
        for p in paths:
            assert (REPO / p).exists(), f"{m.name}: {p} does not exist"


def test_a_moved_snippet_is_reported(tmp_path):
    mod = _mutation()
    m = mod.M("moved", "f.py", "a = 1", "a = 2", "tests/x.py")
    (tmp_path / "f.py").write_text("a = 1\na = 1\n")
    assert "occurs 2 times" in mod.check([m], str(tmp_path))[0]
    (tmp_path / "f.py").write_text("b = 1\n")
    assert "occurs 0 times" in mod.check([m], str(tmp_path))[0]


def test_a_folder_mutant_finds_its_snippet_in_any_module(tmp_path):
    mod = _mutation()
    m = mod.M("anywhere", "pkg/", "x = 1", "x = 2", "tests/x.py")
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("y = 1\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("x = 1\n")
    assert mod.check([m], str(tmp_path)) == []
    path, original = mod.mutate(str(tmp_path), m)
    assert path.endswith("b.py") and original == "x = 1\n"
    assert (tmp_path / "pkg" / "sub" / "b.py").read_text() == "x = 2\n"
    (tmp_path / "pkg" / "sub" / "b.py").write_text(original)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")  # now in two modules
    assert "occurs 2 times" in mod.check([m], str(tmp_path))[0]
