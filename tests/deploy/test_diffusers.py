"""A Stable Diffusion pipeline (diffusers, small random components, no download) with its UNet
compiled by ember the two ways diffusers users compile it: by assignment
(``pipe.unet = ember.compile(pipe.unet)``, the ``torch.compile`` idiom) and in place
(``ember.compile_module_(pipe.unet)``, the ``pipe.unet.compile()`` idiom). Images equal eager's, the
UNet is one graph, a second resolution costs one recompile, and ``save_pretrained`` still saves the
UNet (diffusers unwraps only torch's own compiled wrapper, hence the in-place form).

Each test compiles the UNet once or twice (a few seconds each on a CPU); the tests run with one
intra-op thread, as small convolutions gain nothing from more and a busy CI machine loses a lot.
"""
import json

import numpy as np
import pytest
import torch

import ember
from ember.testing import CompileCounter, cache_of

pytest.importorskip("diffusers", reason="diffusers is not installed (pip install -e '.[test]')")
from examples.stable_diffusion.tiny import generate, tiny_pipeline, tiny_unet  # noqa: E402

F32 = {"config": {"INFERENCE_PRECISION_HINT": "f32"}}  # OpenVINO on CPU otherwise computes in bf16


@pytest.fixture(autouse=True)
def _one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def reference():
    """Eager images at two resolutions, from a pipeline no test compiles."""
    with torch.random.fork_rng(devices=[]):
        torch.set_num_threads(1)
        pipe = tiny_pipeline()
        return {32: generate(pipe, 32), 48: generate(pipe, 48)}


def _graphs_and_breaks(cache) -> tuple[int, list]:
    """Graphs compiled for a callable and everything compiled at its graph breaks; the breaks."""
    graphs, breaks = 0, []
    for entry in cache.entries:
        graphs += entry.graph is not None
        breaks += list(entry.breaks)
    for sub in cache.break_context.caches():
        g, b = _graphs_and_breaks(sub)
        graphs, breaks = graphs + g, breaks + b
    return graphs, breaks


def test_unet_is_one_graph():
    """The UNet's forward, attention processors included, is captured whole (it used to break on
    ``inspect.signature(processor).parameters.keys()`` in Attention.forward: 38 graphs)."""
    unet = tiny_unet().eval()
    x, t, text = torch.randn(2, 4, 16, 16), torch.tensor(7), torch.randn(2, 16, 32)
    counter = CompileCounter()
    compiled = ember.compile(unet, backend=counter, fullgraph=True)
    with torch.no_grad():
        expected = unet(x, t, text).sample
        got = compiled(x, t, text).sample
    torch.testing.assert_close(got, expected)
    assert counter.frame_count == 1


def test_in_place_native_backend_images_recompile_and_save(reference, tmp_path):
    from diffusers import StableDiffusionPipeline

    pipe = tiny_pipeline()
    unet = pipe.unet
    assert ember.compile_module_(pipe.unet, backend="ember", dynamic=False) is unet
    np.testing.assert_allclose(generate(pipe, 32), reference[32], atol=1e-4)
    cache = cache_of(pipe.unet)
    graphs, breaks = _graphs_and_breaks(cache)
    assert (graphs, breaks) == (1, [])
    np.testing.assert_allclose(generate(pipe, 48), reference[48], atol=1e-4)  # a second resolution:
    assert cache.compile_count == 2, cache.recompile_reasons  # one recompile, every denoising step reuses it
    assert "shape" in cache.recompile_reasons[0]

    # the pipeline still knows its UNet: save, load (offline) and get the same images eagerly
    assert type(pipe.unet).__name__ == "UNet2DConditionModel" and pipe.unet is unet
    pipe.save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["unet"] == ["diffusers", "UNet2DConditionModel"]
    loaded = StableDiffusionPipeline.from_pretrained(tmp_path, local_files_only=True)
    loaded.set_progress_bar_config(disable=True)
    np.testing.assert_allclose(generate(loaded, 32), reference[32], atol=1e-4)
    unet._compiled_call_impl = None  # uncompiled again, as after nn.Module.compile()
    np.testing.assert_allclose(generate(pipe, 32), reference[32], atol=1e-5)


@pytest.mark.slow
def test_automatic_dynamic_resolution(reference):
    """The default (dynamic=None): the second resolution recompiles once with symbolic sizes, and a
    third needs no compile. Slow: tracing the UNet with symbolic sizes takes several times longer (sympy)."""
    pipe = tiny_pipeline()
    ember.compile_module_(pipe.unet, backend="ember")
    np.testing.assert_allclose(generate(pipe, 32), reference[32], atol=1e-4)
    np.testing.assert_allclose(generate(pipe, 48), reference[48], atol=1e-4)
    images = generate(pipe, 64)
    eager = tiny_pipeline()
    np.testing.assert_allclose(images, generate(eager, 64), atol=1e-4)
    cache = cache_of(pipe.unet)
    assert cache.compile_count == 2, cache.recompile_reasons
    assert _graphs_and_breaks(cache) == (2, [])


def test_assigned_wrapper_openvino_backend(reference):
    pytest.importorskip("openvino")
    pipe = tiny_pipeline()
    pipe.unet = ember.compile(pipe.unet, backend="openvino", options=F32)
    np.testing.assert_allclose(generate(pipe, 32), reference[32], atol=1e-4)
    assert _graphs_and_breaks(cache_of(pipe.unet)) == (1, [])



def test_gpu_suite_sd15_workload_code_path():
    """benchmarks/gpu_suite.py's sd15_unet row (the H100 one uses the full-size SD-1.5 UNet in fp16):
    its quick form builds the tiny UNet and one denoising step, here uncompiled and through ember's
    eager backend (the suite's --quick --device cpu run compiles it with each compiler)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import gpu_suite

    build, inputs, _ = gpu_suite.make("sd15_unet", "cpu", quick=True)
    expected = build(lambda f: f)(*inputs)
    counter = CompileCounter()
    got = build(lambda f: ember.compile(f, backend=counter))(*inputs)
    assert expected.shape == inputs[0].shape
    torch.testing.assert_close(got, expected)
    assert counter.frame_count == 1
