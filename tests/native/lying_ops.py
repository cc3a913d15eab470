"""Custom ops (torch.library) whose fake functions lie about their results, for the first-call check of
extern results (ember/native/extern_check.py, tests/native/test_extern_check.py). The native backend
has no lowering for them: each becomes an extern call whose buffer is planned from the fake result.
Imported once per process (a second registration would raise)."""
import torch

NS = "emberlie"


@torch.library.custom_op(f"{NS}::dtype", mutates_args=())
def lie_dtype(x: torch.Tensor) -> torch.Tensor:
    """Says x's dtype (float32), returns float64: read as float32, its bytes are garbage."""
    return (x * 2).double()


@lie_dtype.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op(f"{NS}::shape", mutates_args=())
def lie_shape(x: torch.Tensor) -> torch.Tensor:
    """Says [m, n] (x's sizes), returns [2m, n] (x * 2 twice): read as [m, n], its second half is
    missed (larger than said, so a run without the check reads no memory outside the tensor)."""
    return (x * 2).repeat(2, 1)


@lie_shape.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{NS}::strides", mutates_args=())
def lie_strides(x: torch.Tensor) -> torch.Tensor:
    """Says contiguous, returns the same values column-major (x * 2 transposed, made contiguous, transposed back)."""
    return (x * 2).t().contiguous().t()


@lie_strides.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{NS}::pair", mutates_args=())
def lie_pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two results: the first as said, the second float64 where float32 is said."""
    return x * 2, (x + 1).double()


@lie_pair.register_fake
def _(x):
    return torch.empty_like(x), torch.empty_like(x)


@torch.library.custom_op(f"{NS}::honest", mutates_args=())
def honest(x: torch.Tensor) -> torch.Tensor:
    """Returns what its fake function says."""
    return x * 2


@honest.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op(f"{NS}::noisy", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def noisy(x: torch.Tensor) -> torch.Tensor:
    """Honest, but draws random numbers (the check restores the generator before the ATen run)."""
    return x + torch.randn_like(x)


@noisy.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op(f"{NS}::to_float", mutates_args=())
def to_float(x: torch.Tensor) -> torch.Tensor:
    """Honest for any argument: x as float32."""
    return x.float()


@to_float.register_fake
def _(x):
    return torch.empty_like(x, dtype=torch.float32)


@torch.library.custom_op(f"{NS}::rows5", mutates_args=())
def rows5(x: torch.Tensor) -> torch.Tensor:
    """x * 2; its fake function hard-codes 5 rows: right only where x has 5 (a graph with symbolic
    sizes traced at 5 rows meets the lie at other sizes; at more rows, silently: same strides)."""
    return x * 2


@rows5.register_fake
def _(x):
    return x.new_empty(5, x.shape[1])


@torch.library.custom_op(f"{NS}::with_seed", mutates_args=())
def with_seed(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x * 2 and a host int64 seed, whose fake is on the meta device (as attention's philox seed:
    its device is decided at run time)."""
    return x * 2, torch.tensor([7, 8], dtype=torch.int64)


@with_seed.register_fake
def _(x):
    return torch.empty_like(x), torch.empty((2,), dtype=torch.uint64, device="meta")


_LIB = torch.library.Library(NS, "FRAGMENT")
# named results, as attention's: a result named philox_seed is placed by the op at run time
_LIB.define("named_seed(Tensor x) -> (Tensor out, Tensor philox_seed)")


@torch.library.impl(f"{NS}::named_seed", "CompositeExplicitAutograd", lib=_LIB)
def named_seed(x):
    """x * 2 and a seed of two int64s where the fake says a 0-dim one on x's device (efficient
    attention's fake says cuda:0, its CUDA kernel returns a host tensor outside a capture)."""
    return x * 2, torch.tensor([7, 8], dtype=torch.int64)


@torch.library.register_fake(f"{NS}::named_seed", lib=_LIB)
def _(x):
    return torch.empty_like(x), torch.empty((), dtype=torch.int64, device=x.device)


OPS = torch.ops.emberlie
