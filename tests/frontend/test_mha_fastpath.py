"""nn.TransformerEncoderLayer and nn.MultiheadAttention take a fused fast path in eval mode without
grad; those fused ops have no fake kernels, so the frontend must trace the regular path (same math)."""
import pytest
import torch

import ember

FUSED = ("_transformer_encoder_layer_fwd", "_native_multi_head_attention")


def _layer():
    return torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)


@pytest.mark.parametrize("name,make,call", [
    ("layer", _layer, lambda m, x: m(x)),
    ("encoder", lambda: torch.nn.TransformerEncoder(_layer(), 2, enable_nested_tensor=False), lambda m, x: m(x)),
    ("mha", lambda: torch.nn.MultiheadAttention(32, 4, batch_first=True), lambda m, x: m(x, x, x)[0]),
])
def test_fast_path_modules_trace_the_regular_path(name, make, call):
    torch.manual_seed(0)
    model = make().eval()
    graphs = []

    def record(gm, inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        assert torch.backends.mha.get_fastpath_enabled()  # eager takes the fused path here
        expected = call(model, x)
        got = call(ember.compile(model, backend=record, fullgraph=True), x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(graphs) == 1
    called = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert not [t for t in called if any(f in t for f in FUSED)], called
