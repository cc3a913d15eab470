"""The model zoo's table: which models, built how, fed what.

Every model is built from a tiny config with random weights (nothing is downloaded): a few layers,
hidden size 32-64, a 100-token vocabulary, 32x32 images, 0.1 s of 16 kHz audio. Each row names the
model class and its config; the input kind says what the forward takes. Each model is fed two input
shapes: variant 0 compiles, variant 1 (a longer sequence, or a bigger batch where the model fixes
the sequence or image size) shows whether a new shape recompiles.

Suites: "huggingface" (transformers, always here), "timm" and "torchvision" (only where installed;
their rows are skipped cleanly otherwise).
"""
from __future__ import annotations

import dataclasses
import importlib

import torch

VOCAB = 100
BATCH = 2
SEQ = (8, 12)          # text length for input variants 0 and 1
IMAGE_BATCH = (2, 3)   # vision models fix the image size, so the batch changes instead


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    suite: str          # huggingface | timm | torchvision
    family: str         # encoder | decoder | encoder-decoder | vision | speech
    builder: str        # HF model class name, timm model name or torchvision model name
    inputs: str         # a key of INPUTS
    config: dict = dataclasses.field(default_factory=dict)   # HF config / timm / torchvision kwargs
    image_size: int = 32


# Tiny configs, one per naming scheme; rows override what their model needs.
BERT = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=64)
LLAMA = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, max_position_embeddings=64)
BART = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
VIT = dict(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=128)
SPEECH = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
              conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
              num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, vocab_size=VOCAB)


def _hf(name, family, cls, inputs, config, **kw):
    return ModelSpec(name, "huggingface", family, cls, inputs, config, **kw)


def _rows() -> list[ModelSpec]:
    return [
        # encoders
        _hf("bert", "encoder", "BertModel", "text+mask", BERT),
        _hf("roberta", "encoder", "RobertaForSequenceClassification", "text+mask",
            dict(BERT, pad_token_id=1, max_position_embeddings=68)),
        _hf("distilbert", "encoder", "DistilBertModel", "text+mask",
            dict(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64)),
        _hf("albert", "encoder", "AlbertModel", "text+mask", dict(BERT, embedding_size=32)),
        _hf("electra", "encoder", "ElectraForMaskedLM", "text+mask", dict(BERT, embedding_size=32)),
        _hf("deberta-v2", "encoder", "DebertaV2Model", "text+mask", dict(BERT, max_relative_positions=16)),
        _hf("mpnet", "encoder", "MPNetModel", "text+mask", dict(BERT, pad_token_id=1, max_position_embeddings=68)),
        _hf("mobilebert", "encoder", "MobileBertModel", "text+mask",
            dict(BERT, embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32, num_feedforward_networks=2)),
        _hf("convbert", "encoder", "ConvBertModel", "text+mask", dict(BERT, embedding_size=64)),
        # decoders
        _hf("gpt2", "decoder", "GPT2LMHeadModel", "text",
            dict(vocab_size=VOCAB, n_layer=2, n_embd=64, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)),
        _hf("gpt-neo", "decoder", "GPTNeoForCausalLM", "text",
            dict(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
                 window_size=4, max_position_embeddings=64, bos_token_id=0, eos_token_id=0)),
        _hf("gptj", "decoder", "GPTJForCausalLM", "text",
            dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=64,
                 bos_token_id=0, eos_token_id=0)),
        _hf("opt", "decoder", "OPTForCausalLM", "text+mask",
            dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                 word_embed_proj_dim=64, max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2)),
        _hf("llama", "decoder", "LlamaForCausalLM", "text", LLAMA),
        _hf("mistral", "decoder", "MistralForCausalLM", "text", dict(LLAMA, sliding_window=None)),
        _hf("qwen2", "decoder", "Qwen2ForCausalLM", "text", LLAMA),
        _hf("qwen3", "decoder", "Qwen3ForCausalLM", "text", dict(LLAMA, head_dim=16)),
        _hf("phi", "decoder", "PhiForCausalLM", "text", LLAMA),
        _hf("gemma", "decoder", "GemmaForCausalLM", "text", dict(LLAMA, head_dim=16)),
        _hf("bloom", "decoder", "BloomForCausalLM", "text+mask", dict(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4)),
        _hf("falcon", "decoder", "FalconForCausalLM", "text",
            dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, bos_token_id=0,
                 eos_token_id=0)),
        _hf("gpt-neox", "decoder", "GPTNeoXForCausalLM", "text", dict(LLAMA, num_key_value_heads=4)),
        _hf("codegen", "decoder", "CodeGenForCausalLM", "text",
            dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=64, n_ctx=64,
                 bos_token_id=0, eos_token_id=0)),
        # encoder-decoders
        _hf("t5", "encoder-decoder", "T5ForConditionalGeneration", "seq2seq",
            dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                 decoder_start_token_id=0, pad_token_id=0)),
        _hf("bart", "encoder-decoder", "BartForConditionalGeneration", "seq2seq", BART),
        _hf("marian", "encoder-decoder", "MarianMTModel", "seq2seq", dict(BART, decoder_start_token_id=1)),
        _hf("pegasus", "encoder-decoder", "PegasusForConditionalGeneration", "seq2seq", BART),
        _hf("mbart", "encoder-decoder", "MBartForConditionalGeneration", "seq2seq", BART),
        # vision
        _hf("vit", "vision", "ViTForImageClassification", "image", VIT),
        _hf("deit", "vision", "DeiTModel", "image", VIT),
        _hf("beit", "vision", "BeitModel", "image", dict(VIT, use_relative_position_bias=True)),
        _hf("dinov2", "vision", "Dinov2Model", "image", VIT),
        _hf("clip-vision", "vision", "CLIPVisionModel", "image", VIT),
        _hf("swin", "vision", "SwinModel", "image",
            dict(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)),
        _hf("convnext", "vision", "ConvNextForImageClassification", "image",
            dict(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10)),
        _hf("resnet", "vision", "ResNetForImageClassification", "image",
            dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=10,
                 downsample_in_first_stage=False)),
        _hf("mobilevit", "vision", "MobileViTModel", "image",
            dict(image_size=32, hidden_sizes=[32, 32, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64])),
        _hf("segformer", "vision", "SegformerModel", "image",
            dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                 num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])),
        # speech
        _hf("wav2vec2", "speech", "Wav2Vec2Model", "audio", SPEECH),
        _hf("hubert", "speech", "HubertModel", "audio", SPEECH),
        _hf("whisper", "speech", "WhisperForConditionalGeneration", "mel+decoder",
            dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
                 max_source_positions=16, max_target_positions=32, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                 decoder_start_token_id=0, begin_suppress_tokens=None, suppress_tokens=None)),
        _hf("speech2text", "speech", "Speech2TextForConditionalGeneration", "features+decoder",
            dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, input_feat_per_channel=16,
                 num_conv_layers=2, conv_channels=32, max_source_positions=64, max_target_positions=32,
                 pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)),
    ] + [
        ModelSpec(name, "timm", "vision", name, "image", kw, image_size=64) for name, kw in TIMM
    ] + [
        ModelSpec(f"tv-{name}", "torchvision", "vision", name, "image", {"num_classes": 10}, image_size=64)
        for name in TORCHVISION
    ]


# timm names with the kwargs that fit them to 64x64 images and 10 classes
TIMM = [(name, dict(num_classes=10, **extra)) for name, extra in [
    ("resnet18", {}), ("resnet50", {}), ("efficientnet_b0", {}), ("mobilenetv3_small_100", {}),
    ("convnext_atto", {}), ("regnetx_002", {}), ("densenet121", {}), ("ghostnet_100", {}), ("dla34", {}),
    ("vit_tiny_patch16_224", dict(img_size=64)), ("deit_tiny_patch16_224", dict(img_size=64)),
    ("mixer_s16_224", dict(img_size=64)),
]]
TORCHVISION = ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "squeezenet1_1", "shufflenet_v2_x0_5",
               "regnet_y_400mf"]

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in _rows()}


# ------------------------------------------------------------------------------------------------- building models

def available(spec: ModelSpec) -> str | None:
    """None if the model's library is importable, else why it is skipped."""
    module = {"huggingface": "transformers", "timm": "timm", "torchvision": "torchvision"}[spec.suite]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return f"{module} not installed ({exc})"
    return None


def build(spec: ModelSpec, device: str, dtype: torch.dtype):
    """The model in eval mode on `device`, and `inputs(variant) -> (args, kwargs)`."""
    torch.manual_seed(0)
    if spec.suite == "huggingface":
        import transformers

        cls = getattr(transformers, spec.builder)
        model = cls(cls.config_class(**spec.config))
    elif spec.suite == "timm":
        import timm

        model = timm.create_model(spec.builder, pretrained=False, **spec.config)
    else:
        import torchvision

        model = torchvision.models.get_model(spec.builder, weights=None, **spec.config)
    _randomise_norm_stats(model)
    model = model.to(device=device, dtype=dtype).eval()
    config = getattr(model, "config", None)
    make = INPUTS[spec.inputs]

    def inputs(variant: int):
        gen = torch.Generator().manual_seed(1 + variant)  # fresh values for each variant, the same in every run
        args, kwargs = make(spec, config, variant, gen)
        move = (lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype))
        return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}

    return model, inputs


def _randomise_norm_stats(model: torch.nn.Module) -> None:
    """Fresh BatchNorm statistics are 0/1, which makes eval-mode BatchNorm an identity and hides bugs."""
    gen = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=gen) - 0.5)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)


# ---------------------------------------------------------------------------------------------------- input kinds

def _ids(batch, seq, gen):
    return torch.randint(3, VOCAB, (batch, seq), generator=gen)


def _text(spec, config, variant, gen):
    return (), {"input_ids": _ids(BATCH, SEQ[variant], gen)}


def _text_mask(spec, config, variant, gen):
    seq = SEQ[variant]
    mask = torch.ones(BATCH, seq, dtype=torch.long)
    mask[1, seq - 3:] = 0  # right padding on the second row: the mask really changes the result
    return (), {"input_ids": _ids(BATCH, seq, gen), "attention_mask": mask}


def _seq2seq(spec, config, variant, gen):
    seq = SEQ[variant]
    return (), {"input_ids": _ids(BATCH, seq, gen), "decoder_input_ids": _ids(BATCH, seq // 2, gen)}


def _image(spec, config, variant, gen):
    size = spec.image_size
    pixels = torch.randn(IMAGE_BATCH[variant], 3, size, size, generator=gen)
    return ((), {"pixel_values": pixels}) if spec.suite == "huggingface" else ((pixels,), {})


def _audio(spec, config, variant, gen):
    return (), {"input_values": torch.randn(BATCH, (1600, 2400)[variant], generator=gen)}


def _mel_decoder(spec, config, variant, gen):
    # Whisper's encoder takes exactly 2 * max_source_positions frames, so the decoder length varies
    frames = 2 * config.max_source_positions
    return (), {"input_features": torch.randn(BATCH, config.num_mel_bins, frames, generator=gen),
                "decoder_input_ids": _ids(BATCH, (4, 6)[variant], gen)}


def _features_decoder(spec, config, variant, gen):
    feats = config.input_feat_per_channel * config.input_channels
    return (), {"input_features": torch.randn(BATCH, (32, 48)[variant], feats, generator=gen),
                "decoder_input_ids": _ids(BATCH, (4, 6)[variant], gen)}


INPUTS = {"text": _text, "text+mask": _text_mask, "seq2seq": _seq2seq, "image": _image, "audio": _audio,
          "mel+decoder": _mel_decoder, "features+decoder": _features_decoder}
