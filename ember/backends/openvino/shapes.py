"""What a partition takes and returns: shapes that are static, or symbolic under dynamic shapes.

With dynamic shapes (docs/dynamic-shapes.md) the ATen graphs carry FakeTensors whose sizes are
expressions over the frontend ShapeEnv's symbols (``s0``, ``2*s0``), and int values that are symbols
themselves (a size read with ``aten.sym_size``, an int argument made symbolic). One OpenVINO model
then serves every size:

* a tensor input gets an OpenVINO ``PartialShape``: a static size stays a number, a symbolic one
  becomes a ``Dimension`` bounded by what the ShapeEnv knows of it (sizes are >= 2; ``mark_dynamic``'s
  ``min``/``max``);
* a symbolic int the partition reads (shape arithmetic runs in the PyTorch glue between partitions,
  which hands the result over) is a 0-d int64 input;
* the outputs' sizes are expressions over the same symbols, compiled into one small Python function
  that reads the symbols off a call's inputs, so output buffers are allocated at the right size and
  OpenVINO writes straight into them, as in the static case.

Cache keys and whole-graph records outlive the process and its ShapeEnv, so they name symbols
canonically: ``d0, d1 ...`` in order of first appearance among the inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch
from torch.utils._sympy.printers import PythonPrinter
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy


@dataclass(frozen=True)
class Spec:
    """One partition input or output: a tensor's shape (ints, and sympy expressions where symbolic)
    and dtype; or, with ``scalar`` set, a Python int (a SymInt's expression), passed as a 0-d int64."""
    shape: tuple
    dtype: torch.dtype
    scalar: object = None

    @property
    def is_int(self) -> bool:
        return self.scalar is not None

    @property
    def symbolic(self) -> bool:
        return self.is_int or any(not isinstance(d, int) for d in self.shape)

    def text(self, rename=None) -> str:
        """``f32[s0, 16]`` / ``int s0``, symbols renamed by ``rename`` ({symbol: name}) if given."""
        show = (lambda e: str(e.xreplace(rename))) if rename else str
        if self.is_int:
            return f"int {show(self.scalar)}"
        dims = ", ".join(str(d) if isinstance(d, int) else show(d) for d in self.shape)
        return f"{_short_dtype(self.dtype)}[{dims}]"


def _short_dtype(dtype: torch.dtype) -> str:
    return {torch.float32: "f32", torch.float16: "f16", torch.int64: "i64", torch.int32: "i32",
            torch.bool: "b8"}.get(dtype, str(dtype).replace("torch.", ""))


def _size(d):
    """A size as an int when it is one, else its sympy expression (the ShapeEnv's replacements applied)."""
    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        return int(expr) if expr.is_number else expr
    return int(d)


def static_int(value) -> int | None:
    """The value of a SymInt that tracing found to be a constant (a static size read with
    ``aten.sym_size``); else None."""
    size = _size(value) if isinstance(value, torch.SymInt) else None
    return size if isinstance(size, int) else None


def spec_of(value) -> Spec:
    """The spec of a node's traced value (FakeTensor, SymInt or int), read without guarding on it."""
    if isinstance(value, (torch.SymInt, int)) and not isinstance(value, bool):
        size = _size(value)
        return Spec((), torch.int64, sympy.Integer(size) if isinstance(size, int) else size)
    if isinstance(value, torch.Tensor):
        return Spec(tuple(_size(d) for d in value.shape), value.dtype)
    raise TypeError(f"a partition boundary carries a {type(value).__name__}, not a tensor or an int")


def _shape_env(values):
    for value in values:
        sizes = (value,) if isinstance(value, torch.SymInt) else \
            tuple(value.shape) if isinstance(value, torch.Tensor) else ()
        for d in sizes:
            if isinstance(d, torch.SymInt):
                return d.node.shape_env
    return None


@dataclass(frozen=True)
class Signature:
    """A partition's inputs and outputs, and the range of every symbol they use."""
    inputs: tuple
    outputs: tuple
    ranges: dict   # symbol -> (lowest, highest or None)

    @classmethod
    def of(cls, in_values: list, out_values: list) -> "Signature":
        inputs = tuple(spec_of(v) for v in in_values)
        outputs = tuple(spec_of(v) for v in out_values)
        env = _shape_env([*in_values, *out_values])
        ranges = {}
        for sym in _symbols(inputs + outputs):
            rng = env.var_to_range.get(sym) if env is not None else None
            ranges[sym] = (_finite(rng.lower), _finite(rng.upper)) if rng is not None else (None, None)
        return cls(inputs, outputs, ranges)

    @property
    def dynamic(self) -> bool:
        return any(s.symbolic for s in self.inputs + self.outputs)

    def canonical_names(self) -> dict:
        """{symbol: d0, d1 ...} in order of first appearance among the inputs, then the outputs."""
        return {sym: sympy.Symbol(f"d{k}", integer=True)
                for k, sym in enumerate(_symbols(self.inputs + self.outputs))}

    def key_text(self) -> str:
        """What of the signature a converted model depends on, for cache keys (symbol names canonical)."""
        if not self.dynamic:
            return repr([(s.shape, s.dtype) for s in self.inputs])  # the static text, as before dynamic shapes
        names = self.canonical_names()
        ranges = ", ".join(f"{names[s]} in {r}" for s, r in self.ranges.items())
        return f"dynamic {[s.text(names) for s in self.inputs]} where {ranges}"

    def dynamic_inputs(self) -> dict[int, str]:
        """{input position: text} of the inputs with symbolic sizes or values, for reports."""
        return {k: s.text() for k, s in enumerate(self.inputs) if s.symbolic}

    def symbol_ranges(self) -> dict[str, list]:
        return {str(s): [lo, hi] for s, (lo, hi) in self.ranges.items()}

    def partial_shapes(self) -> list:
        """The OpenVINO PartialShape of each input: ``Dimension(lo, hi)`` where a size is symbolic
        (-1 for no upper bound), ``[]`` for an int."""
        from openvino import Dimension, PartialShape

        ranges = {s: ValueRanges(lo if lo is not None else -sympy.oo, hi if hi is not None else sympy.oo)
                  for s, (lo, hi) in self.ranges.items()}
        shapes = []
        for spec in self.inputs:
            dims = []
            for d in spec.shape:
                if isinstance(d, int):
                    dims.append(Dimension(d))
                    continue
                rng = bound_sympy(d, ranges)
                lo, hi = _finite(rng.lower), _finite(rng.upper)
                dims.append(Dimension(max(lo or 0, 0), hi if hi is not None else -1))
            shapes.append(PartialShape(dims))
        return shapes

    def to_json(self) -> dict:
        names = self.canonical_names()

        def dump(spec):
            if spec.is_int:
                return {"int": str(spec.scalar.xreplace(names))}
            return {"shape": [d if isinstance(d, int) else str(d.xreplace(names)) for d in spec.shape],
                    "dtype": str(spec.dtype)}

        return {"inputs": [dump(s) for s in self.inputs], "outputs": [dump(s) for s in self.outputs],
                "ranges": {str(names[s]): list(r) for s, r in self.ranges.items()}}

    @classmethod
    def from_json(cls, record: dict) -> "Signature":
        symbols = {name: sympy.Symbol(name, integer=True) for name in record["ranges"]}

        def load(item):
            if "int" in item:
                return Spec((), torch.int64, sympy.sympify(item["int"], locals=symbols))
            shape = tuple(d if isinstance(d, int) else sympy.sympify(d, locals=symbols) for d in item["shape"])
            return Spec(shape, getattr(torch, item["dtype"].split(".")[-1]))

        ranges = {symbols[name]: tuple(r) for name, r in record["ranges"].items()}
        return cls(tuple(load(i) for i in record["inputs"]), tuple(load(o) for o in record["outputs"]), ranges)

    def accepts(self, args: list) -> bool:
        """Whether concrete inputs fit: static sizes equal, symbolic sizes of one symbol consistent and
        in range (expressions are not solved: the shape guards of the compiled frame checked them)."""
        seen: dict = {}
        for spec, a in zip(self.inputs, args):
            if spec.is_int:
                pairs = [(spec.scalar, a)] if isinstance(a, int) else None
            elif isinstance(a, torch.Tensor) and a.dtype == spec.dtype and a.dim() == len(spec.shape):
                pairs = list(zip(spec.shape, a.shape))
            else:
                pairs = None
            if pairs is None:
                return False
            for d, n in pairs:
                if isinstance(d, int) and d != n:
                    return False
                if isinstance(d, sympy.Symbol):
                    lo, hi = self.ranges.get(d, (None, None))
                    if seen.setdefault(d, n) != n or (lo is not None and n < lo) or (hi is not None and n > hi):
                        return False
        return True

    def output_shapes(self):
        """A function of a call's inputs giving each output's shape (None where it cannot be worked
        out from the inputs' sizes; that output is then copied out of OpenVINO's own buffer)."""
        names = self.canonical_names()
        lines, bound = [], set()
        for k, spec in enumerate(self.inputs):
            if spec.is_int:
                reads = [(spec.scalar, f"args[{k}]")]
            else:
                reads = [(d, f"args[{k}].shape[{i}]") for i, d in enumerate(spec.shape)]
            for expr, read in reads:
                if isinstance(expr, sympy.Symbol) and expr not in bound:
                    bound.add(expr)
                    lines.append(f"    {names[expr]} = {read}")
        printer = PythonPrinter()
        outs = []
        for spec in self.outputs:
            if any(not isinstance(d, int) and not d.free_symbols <= bound for d in spec.shape):
                outs.append("None")
            else:
                dims = [str(d) if isinstance(d, int) else printer.doprint(d.xreplace(names)) for d in spec.shape]
                outs.append(f"({', '.join(dims)}{',' if len(dims) == 1 else ''})")
        source = "def output_shapes(args):\n" + "\n".join(lines) + f"\n    return ({', '.join(outs)},)\n"
        scope = {"math": __import__("math")}
        exec(compile(source, "<ember openvino output shapes>", "exec"), scope)  # noqa: S102 - our own text
        fn = scope["output_shapes"]
        fn.source, fn.known = source, [o != "None" for o in outs]
        return fn


def graph_input_positions(gm, example_inputs: list) -> list[int]:
    """Positions of the captured graph's inputs that ember's autograd layer makes placeholders of the
    ATen graphs: tensors, and ints traced as symbols; other values are baked in."""
    templates = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, (t, a) in enumerate(zip(templates, example_inputs))
            if isinstance(a, torch.Tensor) or (isinstance(t, torch.SymInt) and t.node.expr.free_symbols)]


def _symbols(specs) -> list:
    """The free symbols of the specs, in order of first appearance."""
    seen: dict = {}
    for spec in specs:
        for expr in (spec.scalar,) if spec.is_int else spec.shape:
            if not isinstance(expr, int):
                for sym in sorted(expr.free_symbols, key=str):
                    seen.setdefault(sym, None)
    return list(seen)


def _finite(bound) -> int | None:
    """A range bound as an int; None for the infinities (torch's int_oo, sympy's oo)."""
    return int(bound) if isinstance(bound, (int, sympy.Integer)) else None
