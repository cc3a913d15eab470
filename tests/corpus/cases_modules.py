"""nn.Module forwards at any depth: Sequential, ModuleList, ModuleDict, custom modules, calls
through __call__, self.training branches, buffers, registered parameters, functional ops with the
module's parameters. Every module here has parameters that require grad, so every case also
compares parameter gradients after .backward() on the output."""
import collections
import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import module_case


def x(*shape):
    return lambda: (torch.randn(*shape),)


class MLP(nn.Module):
    def __init__(self, d_in=8, d_hidden=16, d_out=4):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class SeqIndexing(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x):
        h = self.seq[0](x)
        h = self.seq[1:4](h)
        return self.seq[-1](h), len(self.seq)


class ModuleListIter(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(6, 6) for _ in range(n)])
        self.norms = nn.ModuleList(nn.LayerNorm(6) for _ in range(n))

    def forward(self, x):
        for i, (layer, norm) in enumerate(zip(self.layers, self.norms)):
            x = x + norm(layer(x)) * (i + 1)
        return x, self.layers[-1](x), len(self.layers)


class ModuleDictRouting(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"cls": nn.Linear(5, 3), "reg": nn.Linear(5, 1), "emb": nn.Linear(5, 5)})

    def forward(self, x):
        out = {name: head(x) for name, head in self.heads.items()}
        out["both"] = self.heads["cls"](x).sum(-1) + self.heads["reg"](x).squeeze(-1)
        return out, list(self.heads.keys()), "cls" in self.heads


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = MLP(d, 2 * d, d)

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Stack(nn.Module):
    def __init__(self, d=8, depth=3):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(d) for _ in range(depth)])
        self.head = nn.Linear(d, 2)

    def forward(self, x):
        return self.head(self.blocks(x))


class DeepNest(nn.Module):
    """Depth-4 nesting through custom modules, each calling the child through __call__."""

    def __init__(self, depth=4):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.child = DeepNest(depth - 1) if depth > 1 else None

    def forward(self, x):
        x = torch.tanh(self.lin(x))
        if self.child is not None:
            x = self.child(x) + x
        return x


class TrainingBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        h = self.lin(x)
        if self.training:
            h = h * 0.5 + 1.0
        else:
            h = h - 1.0
        return h, self.training


class DropoutNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return self.drop(F.gelu(self.lin(x))) + F.dropout(x, 0.2, self.training)


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.bn1d = nn.BatchNorm1d(4)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        return self.bn1d(h.mean((2, 3)))


class BufferUser(nn.Module):
    def __init__(self, d=6, max_len=10):
        super().__init__()
        pos = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        pe = torch.zeros(max_len, d)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        self.register_buffer("pe", pe)
        self.register_buffer("scale", torch.tensor(2.0), persistent=False)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        return self.proj(x * self.scale + self.pe[: x.size(1)])


class CountingBuffer(nn.Module):
    """Mutates a buffer in forward: the buffer must end up as in eager."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("running", torch.zeros(4))

    def forward(self, x):
        self.calls.add_(1)
        with torch.no_grad():
            self.running.mul_(0.9).add_(x.mean(0) * 0.1)
        return self.lin(x - self.running)


class RawParams(nn.Module):
    """Registered parameters used through functional ops."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 7) * 0.1)
        self.bias = nn.Parameter(torch.zeros(5))
        self.register_parameter("gain", nn.Parameter(torch.ones(5)))
        self.register_parameter("unused", None)

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias) * self.gain
        if self.unused is None:
            y = y + 1
        return F.layer_norm(y, (5,), self.gain, self.bias)


class FunctionalConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3) * 0.2)
        self.b = nn.Parameter(torch.zeros(4))

    def forward(self, x):
        y = F.conv2d(x, self.w, self.b, stride=1, padding=1)
        return F.avg_pool2d(F.silu(y), 2).flatten(1)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(8, 3))

    def forward(self, x):
        return self.classifier(self.features(x))


class SelfAttention(nn.Module):
    def __init__(self, d=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        if mask is not None:
            att = att.masked_fill(mask, float("-inf"))
        y = att.softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class TransformerBlock(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = SelfAttention(d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        x = x + self.attn(self.ln1(x), mask=mask)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=11, d=8, n_layer=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, 6, d))
        self.blocks = nn.ModuleList([TransformerBlock(d) for _ in range(n_layer)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying

    def forward(self, idx, targets=None):
        h = self.tok(idx) + self.pos[:, : idx.shape[1]]
        for blk in self.blocks:
            h = blk(h)
        logits = self.head(self.ln(h))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


class KwargsForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, scale=1.0, *, bias=None, activation="relu"):
        y = self.lin(x) * scale
        if bias is not None:
            y = y + bias
        return getattr(F, activation)(y)


DictOut = collections.namedtuple("DictOut", ["hidden", "pooled"])


class StructuredOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 6)

    def forward(self, x):
        h = self.enc(x)
        return {"out": DictOut(h, h.mean(1)), "aux": [h.max(), 3], "cfg": {"d": h.shape[-1]}}


class SharedSubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(5, 5)
        self.alias = self.shared

    def forward(self, x):
        return self.alias(self.shared(x)) + self.shared(x)


class ParamListModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.ws = nn.ParameterList([nn.Parameter(torch.randn(4, 4) * 0.3) for _ in range(3)])
        self.pd = nn.ParameterDict({"a": nn.Parameter(torch.ones(4)), "b": nn.Parameter(torch.zeros(4))})

    def forward(self, x):
        for w in self.ws:
            x = torch.tanh(x @ w)
        return x * self.pd["a"] + self.pd["b"]


class ResidualIdentity(nn.Module):
    def __init__(self, proj=False):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 6), nn.SiLU(), nn.Linear(6, 6))
        self.shortcut = nn.Linear(6, 6) if proj else nn.Identity()

    def forward(self, x):
        return self.body(x) + self.shortcut(x)


class ConfigAttrs(nn.Module):
    def __init__(self, act="gelu", scale=0.5, use_norm=True, n_repeat=2):
        super().__init__()
        self.act = act
        self.scale = scale
        self.use_norm = use_norm
        self.n_repeat = n_repeat
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4) if use_norm else None

    def forward(self, x):
        for _ in range(self.n_repeat):
            x = self.lin(x) * self.scale
            x = F.gelu(x) if self.act == "gelu" else F.relu(x)
        if self.use_norm:
            x = self.norm(x)
        return x


class HelperMethods(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def _branch(self, layer, x, k=1.0):
        return layer(x) * k

    @staticmethod
    def _combine(p, q):
        return torch.stack([p, q]).sum(0)

    @property
    def layers(self):
        return [self.a, self.b]

    def forward(self, x):
        outs = [self._branch(layer, x, k=i + 1) for i, layer in enumerate(self.layers)]
        return self._combine(*outs)


class ParamIteration(nn.Module):
    """Iterates its own parameters / children (e.g. an L2 penalty)."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(3, 3)
        self.l2 = nn.Linear(3, 3)

    def forward(self, x):
        penalty = sum((p ** 2).sum() for p in self.parameters())
        names = [n for n, _ in self.named_parameters()]
        kids = [type(c).__name__ for c in self.children()]
        return self.l2(self.l1(x)).sum() + 0.01 * penalty, names, kids


class EmbeddingBag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 6, padding_idx=0)
        self.proj = nn.Linear(6, 2)

    def forward(self, idx):
        mask = (idx != 0).unsqueeze(-1).float()
        pooled = (self.emb(idx) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.proj(pooled)


class DtypeCasting(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        w = self.lin.weight.to(x.dtype)
        y = F.linear(x, w, self.lin.bias.to(x.dtype))
        return y.float(), y.dtype


class AutocastModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.lin(x)
        return y.float() + 1, y.dtype


class NoGradInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.teacher = nn.Linear(4, 4)
        self.student = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            t = self.teacher(x)
        s = self.student(x)
        return F.mse_loss(s, t), t.requires_grad


class GroupNormUnflatten(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 12), nn.Unflatten(1, (4, 3)), nn.GroupNorm(2, 4), nn.Flatten(),
                                 nn.LeakyReLU(0.1), nn.Softmax(dim=-1))

    def forward(self, x):
        return self.net(x)


class Conv1dTemporal(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 5, 3, padding=1)
        self.pool = nn.AdaptiveMaxPool1d(2)
        self.norm = nn.InstanceNorm1d(5, affine=True)

    def forward(self, x):
        return self.pool(F.elu(self.norm(self.conv(x))))


class SequentialOfCustom(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(collections.OrderedDict([
            ("pre", nn.Linear(6, 6)), ("block", ResidualIdentity()), ("post", nn.Tanh())]))

    def forward(self, x):
        return self.seq(x), self.seq.pre(x), self.seq.block.shortcut(x), [name for name, _ in self.seq.named_children()]


class MHAWrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        out, w = self.mha(x, x, x, need_weights=True)
        return out, w


class RecursiveTree(nn.Module):
    """A binary tree of modules; forward recurses on a Python int depth."""

    def __init__(self, depth=2):
        super().__init__()
        self.depth = depth
        self.lin = nn.Linear(3, 3)
        if depth > 0:
            self.left = RecursiveTree(depth - 1)
            self.right = RecursiveTree(depth - 1)

    def forward(self, x):
        h = self.lin(x)
        if self.depth == 0:
            return h
        return self.left(h) * self.right(h)


class ScaledLinear(nn.Linear):
    """Subclass of a built-in module calling super().forward."""

    def __init__(self, d_in, d_out, scale=0.5):
        super().__init__(d_in, d_out)
        self.scale = scale

    def forward(self, x):
        return super().forward(x) * self.scale


class LoggingSequential(nn.Sequential):
    """nn.Sequential subclass overriding forward and iterating itself."""

    def forward(self, x):
        outs = []
        for i, layer in enumerate(self):
            x = layer(x)
            outs.append(x.mean() * i)
        return x, torch.stack(outs)


class ModuleListSlicing(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])

    def forward(self, x):
        for layer in self.layers[1:3]:
            x = torch.relu(layer(x))
        for layer in reversed(self.layers):
            x = x + layer(x) * 0.1
        return self.layers[0](x), len(self.layers[::2])


@dataclasses.dataclass
class EncoderOutput:
    hidden: torch.Tensor
    logits: torch.Tensor
    n_layers: int


class DictInDataclassOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(3, 6)
        self.cls = nn.Linear(6, 2)

    def forward(self, batch):
        h = self.emb(batch["features"]) * batch["mask"].unsqueeze(-1)
        return EncoderOutput(hidden=h, logits=self.cls(h.sum(1)), n_layers=2)


class PlainCallableAttribute(nn.Module):
    """Holds a plain Python callable object and a plain list of (registered elsewhere) modules."""

    class Scale:
        def __init__(self, k):
            self.k = k

        def __call__(self, x):
            return x * self.k

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.pipeline = [self.a, self.Scale(3.0), self.b]

    def forward(self, x):
        for step in self.pipeline:
            x = step(x)
        return x


class TiedAutoencoder(nn.Module):
    """Uses one parameter in two places (encoder weight and its transpose)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(6, 3)
        self.dec_bias = nn.Parameter(torch.zeros(6))

    def forward(self, x):
        z = torch.sigmoid(self.enc(x))
        return F.linear(z, self.enc.weight.t(), self.dec_bias), z


# ---- registrations (>= 25 module cases) ------------------------------------------------

module_case("mlp", lambda: MLP(), x(3, 8))
module_case("sequential_builtin", lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), x(5, 4))
module_case("sequential_indexing", SeqIndexing, x(2, 8))
module_case("modulelist_iteration", ModuleListIter, x(2, 6))
module_case("moduledict_routing", ModuleDictRouting, x(3, 5))
module_case("stack_of_blocks", Stack, x(2, 8))
module_case("deep_nesting", DeepNest, x(3, 4))
module_case("training_branch_train", TrainingBranch, x(2, 6), train=True)
module_case("training_branch_eval", TrainingBranch, x(2, 6), train=False)
module_case("dropout_train_seeded", DropoutNet, x(4, 8), train=True)
module_case("dropout_eval", DropoutNet, x(4, 8), train=False)
module_case("batchnorm_train_updates_buffers", BNNet, x(2, 3, 5, 5), train=True)
module_case("batchnorm_eval", BNNet, x(2, 3, 5, 5), train=False)
module_case("buffers_positional_encoding", BufferUser, x(2, 4, 6))
module_case("buffer_mutation_in_forward", CountingBuffer, x(3, 4), train=True)
module_case("registered_parameters_functional", RawParams, x(2, 7))
module_case("functional_conv_with_params", FunctionalConv, x(2, 3, 6, 6))
module_case("convnet", ConvNet, x(2, 1, 8, 8))
module_case("self_attention", SelfAttention, x(2, 5, 8))
module_case("self_attention_with_mask_kwarg", SelfAttention, lambda: (torch.randn(2, 3, 8),),
            kwargs=lambda: {"mask": torch.tensor([[False, True, True], [False, False, True], [False, False, False]])})
module_case("transformer_block", TransformerBlock, x(2, 4, 8))
module_case("tiny_gpt_with_loss", TinyGPT, lambda: (torch.randint(0, 11, (2, 5)), torch.randint(0, 11, (2, 5))),
            train=True)
module_case("tiny_gpt_eval_no_targets", TinyGPT, lambda: (torch.randint(0, 11, (2, 6)),))
module_case("kwargs_forward", KwargsForward, lambda: (torch.randn(2, 4), 2.0),
            kwargs=lambda: {"bias": torch.randn(4), "activation": "silu"})
module_case("kwargs_forward_defaults", KwargsForward, x(2, 4))
module_case("structured_outputs", StructuredOutputs, x(3, 4))
module_case("shared_submodule", SharedSubmodule, x(2, 5))
module_case("parameter_list_and_dict", ParamListModule, x(2, 4))
module_case("residual_identity", ResidualIdentity, x(3, 6))
module_case("residual_projection", lambda: ResidualIdentity(proj=True), x(3, 6))
module_case("config_attributes", ConfigAttrs, x(2, 4))
module_case("config_attributes_relu_no_norm", lambda: ConfigAttrs("relu", 2.0, False, 3), x(2, 4))
module_case("helper_methods_and_property", HelperMethods, x(2, 4))
module_case("parameter_iteration", ParamIteration, x(2, 3))
module_case("embedding_masked_mean", EmbeddingBag, lambda: (torch.randint(0, 20, (3, 5)),))
module_case("dtype_casting_params", DtypeCasting, lambda: (torch.randn(2, 4, dtype=torch.float64),))
module_case("autocast_inside_forward", AutocastModule, x(2, 8))
module_case("no_grad_teacher", NoGradInside, x(3, 4), train=True)
module_case("groupnorm_unflatten_sequential", GroupNormUnflatten, x(2, 12))
module_case("conv1d_instance_norm", Conv1dTemporal, x(2, 3, 7), train=True)
module_case("sequential_of_custom_named", SequentialOfCustom, x(2, 6))
module_case("multihead_attention", MHAWrapper, x(2, 3, 8))
module_case("recursive_tree", RecursiveTree, x(2, 3))
module_case("transformer_encoder_layer", lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
            x(2, 4, 8))
module_case("gru_cell", lambda: nn.GRUCell(4, 6), x(3, 4))
module_case("subclass_super_forward", lambda: ScaledLinear(4, 3), x(2, 4))
module_case("sequential_subclass_iterating_self",
            lambda: LoggingSequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), x(3, 4))
module_case("modulelist_slicing_reversed", ModuleListSlicing, x(2, 4))
module_case("dict_input_dataclass_output", DictInDataclassOut,
            lambda: ({"features": torch.randn(2, 5, 3), "mask": (torch.rand(2, 5) > 0.3).float()},))
module_case("plain_callable_attributes", PlainCallableAttribute, x(2, 4))
module_case("tied_autoencoder", TiedAutoencoder, x(4, 6), train=True)
