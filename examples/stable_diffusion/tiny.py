"""A Stable Diffusion pipeline small enough for a CPU test: the architecture of SD 1.x (a UNet with
cross-attention blocks, a KL autoencoder, a CLIP text encoder, DDIM), random weights, nothing
downloaded. The component sizes follow diffusers' own fast tests (``get_dummy_components`` in
``tests/pipelines/stable_diffusion/test_stable_diffusion.py``), made smaller still; the tokenizer is
built from a vocabulary written here, since the tests' tokenizer is a Hub download.

``tiny_pipeline()`` returns a ``StableDiffusionPipeline``; ``sd15_unet(dtype)`` the full-size SD-1.5
UNet (random weights, ~860 M parameters) for benchmarks.
"""
from __future__ import annotations

import string

import torch

TEXT_LENGTH = 16  # the tokenizer pads prompts to this many tokens (SD uses 77)
PROMPT = "a cat in a hat"


def _vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """CLIP-style BPE: the two specials, each letter (and letter + end-of-word), a few merges."""
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in string.ascii_lowercase:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    merges = [("c", "a"), ("ca", "t</w>"), ("h", "a"), ("ha", "t</w>"), ("i", "n</w>")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    return vocab, merges


def tiny_unet(**overrides):
    from diffusers import UNet2DConditionModel

    config = dict(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4, out_channels=4,
                  down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                  up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32, norm_num_groups=8)
    config.update(overrides)
    return UNet2DConditionModel(**config)


def tiny_pipeline(seed: int = 0):
    """The pipeline, in eval mode, with the progress bar off. Same ``seed``, same weights."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        unet = tiny_unet()
        vae = AutoencoderKL(block_out_channels=(16, 32), in_channels=3, out_channels=3, latent_channels=4,
                            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                            norm_num_groups=8)
        vocab, merges = _vocabulary()
        # transformers 5: CLIPTokenizer takes the vocabulary itself (`vocab=`, `merges=`); the 4.x
        # names vocab_file/merges_file would be swallowed by **kwargs, leaving an unknown-only vocab
        tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=TEXT_LENGTH)
        text_encoder = CLIPTextModel(CLIPTextConfig(
            hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2, layer_norm_eps=1e-5,
            vocab_size=len(vocab), max_position_embeddings=TEXT_LENGTH, bos_token_id=0, eos_token_id=1, pad_token_id=1))
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    pipe = StableDiffusionPipeline(unet=unet.eval(), vae=vae.eval(), text_encoder=text_encoder.eval(),
                                   tokenizer=tokenizer, scheduler=scheduler, safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generate(pipe, size: int = 32, steps: int = 2, seed: int = 0):
    """Images as a float numpy array (batch, size, size, 3) in [0, 1]; deterministic for a seed."""
    with torch.no_grad():
        return pipe(PROMPT, height=size, width=size, num_inference_steps=steps, output_type="np",
                    generator=torch.Generator().manual_seed(seed)).images


def sd15_unet(dtype=torch.float16, device="cpu"):
    """The UNet of Stable Diffusion 1.5 (its published config; random weights), for benchmarks."""
    from diffusers import UNet2DConditionModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        unet = UNet2DConditionModel(
            sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
            block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768, attention_head_dim=8,
            down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"))
    return unet.to(device=device, dtype=dtype).eval()
