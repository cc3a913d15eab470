"""The generated Python wrapper: allocate, launch kernels, call extern ops, return outputs.

The module defines ``make_call(constants, fallback) -> call``; ``call(*args)`` is what the graph
compiles to. Per call it runs only straight-line code: ``empty_strided`` for buffers that reach
memory, ``kernel[grid](...)`` with constant grids and block sizes, extern ops bound to module
globals, and ``del``/reuse of dead buffers. Buffers are reused when one of the same device, dtype and
storage size is dead (graph inputs, outputs and extern results are never reused).

Graphs with symbolic sizes: ``call`` first reads each size symbol once (``s0 = arg0.size(1)``), then
every size, stride, grid and extern argument is an expression over them, written inline (a few
integer operations); kernels receive the symbols they need as arguments, and launch sites with a
size-dependent grid are ``DynamicLaunch``es. Inputs whose sizes or strides break what the code
assumes, or sizes past the int32 index math chosen at compile time, run the graph as it is.
"""
from __future__ import annotations

import math

import sympy
import torch

from ember.native import cpu_pool, extern_check, ir
from ember.native.scheduler import Kernel, Schedule, _draws_random
from ember.native.symbolic import eq, is_static, known_nonneg, print_expr


def render_const(v) -> str:
    """Python source of a constant; a size expression reads the wrapper's size variables."""
    if isinstance(v, bool) or v is None:
        return repr(v)
    if isinstance(v, sympy.Basic):
        return print_expr(v, lambda s: s.name)
    if isinstance(v, float):
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return "float('inf')" if v > 0 else "float('-inf')"
        return repr(v)
    if isinstance(v, int):
        return repr(v)
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, torch.device):
        return f"torch.device({v.type!r}, {v.index!r})" if v.index is not None else f"torch.device({v.type!r})"
    if isinstance(v, (torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, (list, tuple)):
        inner = ", ".join(render_const(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    raise TypeError(f"cannot render constant {v!r} in the wrapper")


def _flat(tree):
    if isinstance(tree, (list, tuple)):
        for t in tree:
            yield from _flat(t)
    else:
        yield tree


class FirstOnly(str):
    """A body line of the first-call variant only (extern_check.py: the checks of extern results)."""


class SteadyOnly(str):
    """A body line of the steady-state variant only (its first-call form is written as FirstOnly lines)."""


# the module defining each ember_native op (a wrapper loaded from the cache in a new process imports it)
OP_MODULES = {"addmm_act": "small_mm", "addmm_act2": "small_mm", "mm_rows": "pad_mm"}


def _op_global(target) -> tuple[str, str]:
    ns, name = target._schema.name.split("::")
    ovl = target._overloadname
    return f"{ns}_{name}_{ovl}".replace(".", "_"), f"torch.ops.{ns}.{name}.{ovl}"


class WrapperCodegen:
    def __init__(self, sched: Schedule, kernels: dict, int_inputs: dict, header: str = "", guard_inputs=True,
                 extern_overrides: dict | None = None, boxed: bool = False):
        """kernels: id(Kernel) -> (python name, EmittedKernel, module path). extern_overrides:
        extern node name -> expression of a callable replacing its ATen op (autotune's MMTemplate)."""
        self.sched, self.kernels, self.int_inputs, self.header = sched, kernels, int_inputs, header
        self.guard_inputs = guard_inputs
        self.boxed = boxed  # ``run(args)`` takes the inputs boxed and drops each at its last use
        self.extern_overrides = extern_overrides or {}
        self.g = sched.graph
        self.layouts = self.g.buffers()
        self.inputs = {b.name for b in self.g.inputs}
        self.globals: dict[str, str] = {}
        self.devices: dict = {}
        self.body: list[str] = []
        self.launches: list[str] = []
        self.static_launches: list[str] = []
        self.pools: list[str] = []
        self.check_sites: list = []  # (op, buffer, result position, device) per first-call check (extern_check)
        self.check_random = False  # an extern drawing random numbers runs at or before a checked site
        self.sizes_key = None  # symbolic sizes: the tuple of size symbols whose new values are checked again
        # the C++ path (CPU tensors) pools its large buffers across calls (cpu_pool)
        self.pool_large = any(getattr(ek, "renderer", "triton") == "cpp" for _, ek, _ in kernels.values())

    def dev(self, device) -> str:
        device = torch.device(device)
        if device not in self.devices:
            name = f"DEV{len(self.devices)}"
            self.devices[device] = name
            self.globals[name] = render_const(device)
        return self.devices[device]

    def view(self, name, sizes, strides, offset) -> str:
        lay = self.layouts[name]
        if offset == 0 and tuple(sizes) == tuple(lay.sizes) and all(
                s == 1 or a == b for s, a, b in zip(sizes, strides, lay.strides)):
            return name
        # storage offsets are read at run time: views of inputs keep working for any input offset
        off = f"{name}.storage_offset() + {offset}" if offset else f"{name}.storage_offset()"
        return f"as_strided({name}, {render_const(tuple(sizes))}, {render_const(tuple(strides))}, {off})"

    def arg(self, a) -> str:
        if isinstance(a, ir.BufferArg):
            return self.view(a.name, a.sizes, a.strides, a.offset)
        if isinstance(a, ir.RuntimeValue):
            return a.name
        if isinstance(a, (list, tuple)) and any(isinstance(x, (ir.BufferArg, ir.RuntimeValue)) for x in _flat(a)):
            inner = ", ".join(self.arg(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner},)"
        return render_const(a)

    def generate(self) -> str:
        sched = self.sched
        pool: dict = {}
        allocated: set = set()
        params = []
        placeholders = sorted((b for b in self.g.inputs if b.index is not None), key=lambda b: b.index)
        n_args = max([b.index + 1 for b in placeholders] + [k + 1 for k in self.int_inputs] + [self.g.num_args])
        pos_names = {b.index: b.name for b in placeholders}
        params = [pos_names.get(i, f"arg{i}") for i in range(n_args)]
        consts = [b.name for b in self.g.inputs if b.constant is not None]
        B = self.body
        sv = self.g.sizevars
        for s in sorted(sv.sources, key=lambda s: int(s.name[1:])):
            B.append(f"{s.name} = {sv.sources[s]}")
        # the code is specialized to the example inputs (static sizes, the strides of symbolic
        # ones, int values): other inputs run the graph as it is instead of reading out of bounds
        conds = [f"{params[pos]} != {render_const(val)}" for pos, val in sorted(self.int_inputs.items())]
        if self.guard_inputs:
            for b in placeholders:
                lay = b.layout
                for what, call, vals in (("size", "shape", lay.sizes), ("stride", "stride()", lay.strides)):
                    # a dim that its own size symbol was just read from needs no check
                    if not vals or not all(sv.sources.get(v) == f"{b.name}.{what}({i})" for i, v in enumerate(vals)):
                        conds.append(f"{b.name}.{call} != {render_const(tuple(vals))}")
        conds += [f"{render_const(n)} >= {2 ** 31}" for n in self._int32_limits()]
        if conds:
            lines = [f"if ({conds[0]}"] + [f"        or {c}" for c in conds[1:]]
            lines[-1] += "):"
            B.extend(lines)
            B.append(f"    return fallback({', '.join(params)})")
        self._checked = self._planned_on()
        last_ref = self._last_references()
        # inputs the call may drop at their last use (a boxed caller hands over its only references:
        # a backward graph's saved activations then die as the backward consumes them, as in eager)
        keep = set(sched.outputs) | {n for pair in self.g.mutations for n in pair}
        droppable = ({b.name for b in placeholders} - keep) if self.boxed else set()
        if droppable:
            # the first call holds its inputs until its last check (a mismatch re-runs the graph from
            # them), so a boxed graph checks only the extern results made before its first input is
            # dropped: holding a backward's saved activations through its last check raised GPT-2
            # training's first-step peak from 2.64 to 3.59 GB on the H100 (compile_time.py)
            first_drop = min((last_ref[b] for b in droppable if b in last_ref), default=len(sched.steps))
            made_at = {o[0]: i for i, step in enumerate(sched.steps) if not isinstance(step, Kernel)
                       for o in step.outputs if o is not None}
            self._checked = {n for n in self._checked if made_at.get(n, -1) <= first_drop}
        checked_steps = [i for i, step in enumerate(sched.steps) if not isinstance(step, Kernel)
                         and any(o is not None and o[1] is not None and o[0] in self._checked for o in step.outputs)]
        last_checked = checked_steps[-1] if checked_steps else -1
        self.check_random = any(_draws_random(step.target) for step in sched.steps[:last_checked + 1]
                                if not isinstance(step, Kernel))
        symbols = ", ".join(s.name for s in sorted(sv.sources, key=lambda s: int(s.name[1:])))
        self.sizes_key = f"({symbols},)" if symbols and checked_steps else None
        if self.sizes_key:  # symbolic sizes: the first call of each new set of them is checked too
            B.append(SteadyOnly(f"if {self.sizes_key} not in sizes_checked:  # (new sizes: extern_check.py)"))
            B.append(SteadyOnly(f"    return recheck_extern_results(({''.join(p + ', ' for p in params)}), "
                                f"sizes_checked, {self.sizes_key})"))
        parked: list = []  # (body position, buffer): dead buffers put in the pool, for reuse
        self._reuse_views: set = set()  # buffers made by reuse as as_strided views of a dead one
        # the buffers whose last use is each step, in last_use's order, and the inputs dropped
        # there (grouped once: scanning them for every step was quadratic in a deep model's graph)
        dying: dict = {}
        for buf, last in sched.last_use.items():
            dying.setdefault(last, []).append(buf)
        dropped_at: dict = {}
        for b in droppable:
            dropped_at.setdefault(last_ref.get(b, -1), []).append(b)
        for i, step in enumerate(sched.steps):
            if isinstance(step, Kernel):
                name, ek, _ = self.kernels[id(step)]
                B.append(f"# {name}: {', '.join(n.name for n in step.nodes)}")
                for buf in step.writes:
                    self._alloc(buf, pool, allocated)
                if getattr(ek, "renderer", "triton") == "cpp":  # a C++ kernel: pointers and sizes
                    if not is_static(step.numel) or step.numel > 0:
                        args = [f"{b}.data_ptr()" for b in ek.args] + [render_const(s) for s in ek.size_args]
                        B.append(f"{name}({', '.join(args)})")
                        if ek.checked:
                            B.append(f"check_cpp({self.kernels[id(step)][2]!r}, {name!r})")
                elif not is_static(step.numel) or step.numel > 0:
                    launch, grid = self._launcher(step, name, ek, allocated)
                    # a static site's ``run``: a plain function (runtime.Launch), one frame less than the site's __call__
                    call = launch if grid else f"{launch}.run"
                    B.append(f"{call}({', '.join(grid + self._launch_args(step, ek))})")
            else:
                self._extern(step)
                if i == last_checked:  # (nothing after this can mismatch: the inputs may go)
                    B.append(FirstOnly(f"check.passed({'sizes_checked, ' + self.sizes_key if self.sizes_key else ''})"
                                       "  # later calls run the steady-state code"))
            for buf in dying.get(i, ()):
                if buf not in sched.outputs and buf not in self.inputs:
                    if buf in allocated:
                        lay = self.layouts[buf]
                        pool.setdefault((lay.device, lay.dtype, lay.storage_numel), []).append(buf)
                        parked.append((len(B), buf))
                    else:
                        B.append(f"del {buf}")
            dead = sorted(dropped_at.get(i, ()))
            if dead:
                B.append(f"del {', '.join(dead)}  # (inputs: last use)")
        # a parked buffer that no later allocation took is freed where it died, not at the return
        # (the caching allocator can give its memory to a buffer of another size meanwhile)
        unused = {b for bufs in pool.values() for b in bufs}
        for pos, buf in reversed(parked):
            if buf in unused:
                B.insert(pos, f"del {buf}")
        for dst, src in self.g.mutations:
            if dst != src:
                B.append(f"{dst}.copy_({src})")
        B.append(f"return {self._outputs(self.g.outputs)}")
        return self._module(params, consts)

    def _planned_on(self) -> set:
        """Buffers whose planned metadata the generated code depends on (extern_check.py): read by a
        kernel, viewed (``as_strided``) or taken whole by a baked extern override, returned, or copied
        into a mutated input. An extern result outside this set is unused or only passed whole to
        other extern calls, which read the real tensor as eager does: its first call is not checked."""
        names = set(self.sched.outputs)
        for step in self.sched.steps:
            if isinstance(step, Kernel):
                names.update(step.reads)
                names.update(self.kernels[id(step)][1].args)
                continue
            baked = step.name in self.extern_overrides  # (its layouts are baked into the callable)
            for a in ir.buffer_args((step.args, step.kwargs)):
                if baked or self.view(a.name, a.sizes, a.strides, a.offset) != a.name:
                    names.add(a.name)
        # a result planned on the meta device is one whose device the op decides at run time (attention's
        # philox seed and offset: host tensors, or the device's under CUDA-graph capture, Note [Seed and
        # Offset] in torch/_meta_registrations.py): no code reads it, it only travels to the backward op
        return {n for n in names if n not in self.layouts or self.layouts[n].device.type != "meta"}

    def _last_references(self) -> dict:
        """buffer -> index of the last step whose code names it (read, written or passed)."""
        last = {}
        for i, step in enumerate(self.sched.steps):
            if isinstance(step, Kernel):
                names = list(step.reads) + list(step.writes) + list(self.kernels[id(step)][1].args)
            else:
                names = [a.name for a in ir.buffer_args((step.args, step.kwargs))]
            for b in names:
                last[b] = i
        return last

    def _int32_limits(self) -> list:
        """Sizes that int32 kernels need below 2**31, without those another one bounds."""
        limits = []
        for _, ek, _ in self.kernels.values():
            for n in ek.int32_limits:
                if not any(eq(n, m) for m in limits):
                    limits.append(n)
        lower = self.g.sizevars.lower
        return [n for n in limits if not any(m is not n and known_nonneg(m - n, lower) for m in limits)]

    @staticmethod
    def _static_sizes(step, ek) -> list:
        """The int arguments after a static kernel's pointers."""
        return [] if step.single else [ek.xnumel]

    def _launch_args(self, step, ek):
        if not ek.symbolic:
            return list(ek.args) + [str(n) for n in self._static_sizes(step, ek)]
        sizes = [render_const(s) for s in ek.size_args]
        return list(ek.args) + sizes + [render_const(ek.xnumel)] + ([render_const(ek.rnumel)] if ek.rnumel_arg else [])

    def _launcher(self, step, name, ek, allocated=()) -> tuple[str, list]:
        """A module-level Launch for this launch site: grid and block sizes are constants; buffers
        this wrapper allocates are aligned, so only the others' alignment is checked per call.
        A grid that depends on symbolic sizes is computed per call: a DynamicLaunch, whose first
        argument is the number of programs. Returns (launch name, [that argument] or [])."""
        xb = ek.config.XBLOCK
        meta = {"XBLOCK": xb, "num_warps": ek.config.num_warps}
        if ek.config.num_stages is not None:
            meta["num_stages"] = ek.config.num_stages
        if step.single:
            meta["xnumel"] = ek.xnumel
        if step.is_reduction:
            if not ek.rnumel_arg:
                meta["rnumel"] = ek.rnumel
            meta["RBLOCK"] = ek.config.RBLOCK
        launch = f"launch{len(self.launches)}"
        fresh = tuple(j for j, b in enumerate(ek.args) if b in allocated)
        if is_static(ek.xnumel):
            grid = 1 if step.single else max(1, -(-ek.xnumel // xb))
            # what the arguments look like, for runtime.precompile (static launch sites only)
            spec = [self.layouts[b].dtype for b in ek.args] + self._static_sizes(step, ek)
            self.launches.append(f"{launch} = Launch({name}, ({grid},), {meta!r}, fresh={fresh!r}, "
                                 f"spec={render_const(tuple(spec))})")
            self.static_launches.append(launch)
            return launch, []
        self.launches.append(f"{launch} = DynamicLaunch({name}, {meta!r}, fresh={fresh!r})")
        xn = render_const(ek.xnumel)
        return launch, [xn if xb == 1 else f"({xn} + {xb - 1}) // {xb}"]

    def _reusable(self, buf, lay, dead: list | None, views: set):
        """The dead buffer ``buf`` takes over (popped from ``dead``), or None. A graph output takes only
        one of its exact layout that is no view: eager returns a tensor of its own, and a view of a
        recycled buffer would differ where callers look (``._base``, and regional compilation's key
        of the next block's inputs, which counts views: a block fed a view compiled again)."""
        if not dead:
            return None
        if buf not in self.sched.outputs:
            return dead.pop()
        for i in range(len(dead) - 1, -1, -1):
            olay = self.layouts[dead[i]]
            if olay.sizes == lay.sizes and olay.strides == lay.strides and dead[i] not in views:
                return dead.pop(i)
        return None

    def _alloc(self, buf, pool, allocated):
        lay = self.layouts[buf]
        key = (lay.device, lay.dtype, lay.storage_numel)
        allocated.add(buf)
        views = self._reuse_views
        old = self._reusable(buf, lay, pool.get(key), views)
        if old is not None:
            olay = self.layouts[old]
            same = olay.sizes == lay.sizes and olay.strides == lay.strides
            if not same or old in views:
                views.add(buf)
            src = old if same else (f"as_strided({old}, {render_const(tuple(lay.sizes))}, "
                                    f"{render_const(tuple(lay.strides))}, {old}.storage_offset())")
            self.body.append(f"{buf} = {src}; del {old}  # reuse")
            return
        if self.pool_large and buf in self.sched.outputs and cpu_pool.pooled(lay.sizes, lay.strides, lay.dtype, lay.device):
            # a large CPU result: its storage is reused across calls once the caller lets go (cpu_pool);
            # intermediates are not pooled, so no memory beyond the results is held between calls
            pool = f"pool{len(self.pools)}"
            self.pools.append(f"{pool} = BufferPool({render_const(tuple(lay.sizes))}, "
                              f"{render_const(tuple(lay.strides))}, {lay.dtype})")
            self.body.append(f"{buf} = {pool}()")
            return
        self.body.append(f"{buf} = empty_strided({render_const(tuple(lay.sizes))}, {render_const(tuple(lay.strides))}, "
                         f"device={self.dev(lay.device)}, dtype={lay.dtype})")

    def _extern(self, e: ir.ExternNode):
        gname, expr = _op_global(e.target)
        if e.name in self.extern_overrides:
            gname, expr = f"template_{e.name}", self.extern_overrides[e.name]
        self.globals[gname] = expr
        baked = expr.startswith("SmallMM(")  # shapes, strides and scalars fixed in the callable
        if expr.startswith("PackedLinear("):  # takes its operands' whole buffers (packed_linear.plan) but x,
            # which may be a [M, K] view of a contiguous buffer (the weight, last, is passed as stored)
            args = [a.name if i == len(e.args) - 1 else self.arg(a) for i, a in enumerate(e.args) if a is not None]
        elif baked:
            self.static_launches.append(f"{gname}.site")  # (its kernel builds ahead like a generated one)
            # its strides and scalars are baked in: a view starting at its buffer's first element is
            # passed as the buffer itself (one as_strided call less per operand)
            # (its other arguments, an activation's name, are baked in too)
            args = [a.name if a.offset == 0 else self.arg(a) for a in e.args if isinstance(a, ir.BufferArg)]
        else:
            args = [self.arg(a) for a in e.args] + [f"{k}={self.arg(v)}" for k, v in e.kwargs.items()]
        ops = ", ".join(sorted({o for o, _ in e.origins}))
        note = ""
        if expr.startswith("PackedLinear("):
            note = (" (oneDNN packed weight, bias and activation in its epilogue, packed_linear.py)"
                    if expr.startswith("PackedLinear('addmm_act'") else " (MKL packed weight, packed_linear.py)")
        self.body.append(f"# extern {ops} {e.reason}".rstrip() + note)
        call = f"{gname}({', '.join(args)})"
        contiguous = baked and all(o is not None and o[1] is not None and tuple(o[1].strides) == (o[1].sizes[1], 1)
                                   for o in e.outputs)
        if contiguous:  # its results are always new contiguous [M, N] tensors: no layout to fix
            self.body.append(f"{', '.join(o[0] for o in e.outputs)} = {call}")
            for j, o in enumerate(e.outputs):
                self._check(e, j, o[0], o, repaired=False)
            return
        if not e.multi:
            out = e.outputs[0]
            if out is None or not self._checks(out):
                self.body.append(f"{out[0] if out else '_'} = {self._fixed(call, out)}")
                return
            # the first call checks the result before anything reads it (extern_check.py)
            fixed = self._fixed(out[0], out)
            self.body.append(SteadyOnly(f"{out[0]} = {self._fixed(call, out)}"))
            self.body.append(FirstOnly(f"{out[0]} = {call}"))
            self._check(e, 0, out[0], out, repaired=fixed != out[0])
            if fixed != out[0]:
                self.body.append(FirstOnly(f"{out[0]} = {fixed}"))
            return
        self.body.append(f"{e.name} = {call}")
        for j, o in enumerate(e.outputs):
            if o is not None and self._checks(o):
                self._check(e, j, f"{e.name}[{j}]", o, repaired=self._fixed("x", o) != "x")
        for j, o in enumerate(e.outputs):
            if o is not None:
                self.body.append(f"{o[0]} = {self._fixed(f'{e.name}[{j}]', o)}")
        self.body.append(f"del {e.name}")

    def _checks(self, out) -> bool:
        """Is this extern result checked at the first call (a tensor the code plans with)?"""
        return out is not None and out[1] is not None and out[0] in self._checked

    def _check(self, e, j, expr, out, repaired: bool):
        """The first call's check of extern result ``expr`` against its planned layout (extern_check.py);
        ``repaired``: ``fixed_layout`` copies it into the planned strides, so strides do not count."""
        if not self._checks(out) or extern_check.runtime_placed(e.target, j):
            return
        lay = out[1]
        op = str(e.target) + (f" ({self.extern_overrides[e.name].split('(')[0]})" if e.name in self.extern_overrides else "")
        site = len(self.check_sites)
        self.check_sites.append((op, out[0], j, str(lay.device)))
        self.body.append(FirstOnly(
            f"if check.differs({site}, {expr}, {lay.dtype}, {render_const(tuple(lay.sizes))}, "
            f"{render_const(tuple(lay.strides))}, {self.dev(lay.device)}, {repaired}):"))
        self.body.append(FirstOnly("    return check.aten()"))

    def _fixed(self, expr, out):
        if out is None or out[1] is None or (is_static(out[1].numel) and out[1].numel <= 1):
            return expr
        lay = out[1]
        return f"fixed_layout({expr}, {render_const(tuple(lay.sizes))}, {render_const(tuple(lay.strides))})"

    def _label(self) -> str:
        """How the first-call check's messages name this graph ("graph <key>: ", from the header)."""
        first = self.header.splitlines()[0] if self.header else ""
        return first.split(":")[0] + ": " if first.startswith("graph ") else ""

    def _outputs(self, tree) -> str:
        if isinstance(tree, ir.OutBuf):
            return self.view(tree.name, tree.sizes, tree.strides, tree.offset)
        if isinstance(tree, ir.OutConst):
            return render_const(tree.value)
        if isinstance(tree, ir.RuntimeValue):
            return tree.name
        inner = ", ".join(self._outputs(t) for t in tree)
        if isinstance(tree, list):
            return f"[{inner}]"
        return f"({inner}{',' if len(tree) == 1 else ''})"

    def _module(self, params, consts) -> str:
        lines = ["# ember native wrapper: generated code, do not edit"]
        lines += [f"# {l}" for l in self.header.splitlines()]
        lines += ["import torch", "from ember.native.runtime import Launch, fixed_layout, load_kernel", "",
                  "empty_strided = torch.empty_strided", "as_strided = torch.as_strided"]
        for cls, where in (("MMTemplate", "autotune"), ("SmallMM", "small_mm"), ("PackedLinear", "packed_linear")):
            if any(expr.startswith(cls + "(") for expr in self.extern_overrides.values()):
                lines.insert(-3, f"from ember.native.{where} import {cls}")
        for mod in sorted({OP_MODULES[expr.split(".")[3]] for expr in self.globals.values()
                           if expr.startswith("torch.ops.ember_native.")}):
            lines.insert(-3, f"import ember.native.{mod}  # noqa: F401 - (defines the ember_native ops it calls)")
        if any(l.split(" = ")[1].startswith("DynamicLaunch(") for l in self.launches):
            lines.insert(-3, "from ember.native.dynamic_launch import DynamicLaunch")
        per_call = []  # callables with per-call-site state: one per compiled function, made by make_call
        for name, expr in self.globals.items():
            if expr.startswith("PackedLinear("):
                per_call.append(f"{name} = {expr}")
            else:
                lines.append(f"{name} = {expr}")
        cpp, loads, cpp_loads = False, [], []
        for name, ek, path in sorted({(name, path): (name, ek, path)
                                      for name, ek, path in self.kernels.values()}.values(), key=lambda t: t[0]):
            if getattr(ek, "renderer", "triton") == "cpp":
                # loaded by make_call, not at import: importing the wrapper must not wait for the
                # unit's build (cpp_graph: it builds in the background until the first call)
                cpp = True
                cpp_loads.append(f"{name} = load_cpp_kernel({path!r}, {name!r}, {len(ek.args)}, {len(ek.size_args)})")
            else:
                loads.append(f"{name} = load_kernel({path!r}, {name!r})")
        if cpp:
            lines.append("from ember.native.cpp_build import check as check_cpp, load_kernel as load_cpp_kernel, sync_threads")
            # torch.set_num_threads governs the kernels' OpenMP regions too
            self.body.insert(0, "sync_threads()")
        lines += loads
        if self.pools:
            lines.append("from ember.native.cpu_pool import BufferPool")
            lines += self.pools
        lines += self.launches
        # the launch sites whose kernels runtime.precompile may build before the first call
        lines.append(f"LAUNCHES = [{', '.join(self.static_launches)}]")
        lines += ["", "", "def make_call(constants, fallback):"]
        lines += ["    " + l for l in cpp_loads + per_call]
        if consts:
            lines.append(f"    {', '.join(consts)}, = constants")
        lines.append("")
        steady = ["        " + l for l in self.body if not isinstance(l, FirstOnly)]
        first = (["        check = begin_first_call((" + "".join(p + ", " for p in params) + "))",
                  "        if check.failed:  # (an extern result mismatched at an earlier first call)",
                  "            return check.aten()"]
                 + ["        " + l for l in self.body if not isinstance(l, SteadyOnly)])
        fn = "run" if self.boxed else "call"
        head = ["    def {}(" + (", ".join(params) if not self.boxed else "args") + "):"]
        if self.boxed and params:
            head += [f"        {', '.join(params)}, = args", "        args.clear()"]
        lines += [head[0].format(fn)] + head[1:] + steady
        if self.check_sites:
            # the first call: the same code, each extern result the code plans with checked before
            # anything reads it; a mismatch runs the ATen graph (ember/native/extern_check.py)
            lines.append("")
            lines += [head[0].format(f"{fn}_first")] + head[1:] + first
            lines.append("")
            lines.append(f"    {fn} = arm_extern_check({fn}, {fn}_first, fallback, EXTERN_SITES, {self._label()!r}, "
                         f"{self.check_random}, {self.boxed})")
            if self.sizes_key:  # (both bodies name it: they close over the same variables)
                lines.insert(lines.index(head[0].format(fn)), "    sizes_checked = set()  # size symbols' values "
                             "whose first call passed the checks")
            at = lines.index("def make_call(constants, fallback):") - 2
            lines[at:at] = [f"EXTERN_SITES = {self.check_sites!r}  # (op, buffer, result, device) per first-call check"]
            lines.insert(lines.index(""), "from ember.native.extern_check import arm as arm_extern_check, "
                                          "begin as begin_first_call, recheck as recheck_extern_results")
        if not self.boxed:
            lines += ["    return call", ""]
            return "\n".join(lines)
        # ``run`` takes the inputs boxed (one list, which it empties: the caller keeps no reference, so
        # an input dies at its last use); ``call`` is the positional form
        lines.append("")
        lines.append(f"    def call({', '.join(params)}):")
        lines.append(f"        return run([{', '.join(params)}])")
        lines += ["", "    call.boxed = run", "    run._boxed_call = True", "    return call", ""]
        return "\n".join(lines)
