"""A tiny FLUX pipeline folder and captioned images, made locally: what the text-to-image tests train on
(recipes/make_flux_demo.py makes them, as the walk-through does); and a tiny SD3 pipeline (``sd3_pipeline_folder``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "recipes"))

from make_flux_demo import IMAGE_SIZE, TEXT_LEN, TINY_FLUX, captioned_folder, pipeline_folder, tiny_vae  # noqa: E402

__all__ = [
    "IMAGE_SIZE",
    "TEXT_LEN",
    "TINY_FLUX",
    "TINY_SD3",
    "captioned_folder",
    "pipeline_folder",
    "sd3_pipeline_folder",
]

# SD3's transformer at width 16: two joint blocks (the last one's text stream ends: context_pre_only), patches of 2,
# text states of T5's width 32 (the two CLIPs' 8 + 8 padded to it), pooled vectors of 8 + 8
TINY_SD3 = {
    "sample_size": 8, "patch_size": 2, "in_channels": 4, "out_channels": 4, "num_layers": 2, "attention_head_dim": 8,
    "num_attention_heads": 2, "joint_attention_dim": 32, "caption_projection_dim": 16, "pooled_projection_dim": 16,
    "pos_embed_max_size": 16,
}  # fmt: skip


def sd3_pipeline_folder(root: Path, seed: int = 0) -> Path:
    """A StableDiffusion3Pipeline of tiny parts saved in ``root/sd3``: the transformer above, the tiny FLUX demo's
    VAE, two CLIP text models with projection (CLIP-L's and CLIP-G's places) and a T5 encoder of one or two layers,
    bigtrain's byte tokenizer for all three, SD3's scheduler (shift 3)."""
    import diffusers
    import torch
    import transformers

    from bigtrain.config.diffusers_config import quiet_pipeline
    from bigtrain.data.tokenizer import save_byte_tokenizer

    torch.manual_seed(seed)
    transformer = diffusers.SD3Transformer2DModel(**TINY_SD3)
    vae = tiny_vae()
    clips = [
        transformers.CLIPTextModelWithProjection(
            transformers.CLIPTextConfig(
                vocab_size=260, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=32, projection_dim=8, eos_token_id=256, bos_token_id=256, pad_token_id=256,
            )
        )
        for _ in range(2)
    ]  # fmt: skip
    t5 = transformers.T5EncoderModel(
        transformers.T5Config(vocab_size=260, d_model=32, d_ff=64, d_kv=16, num_layers=1, num_heads=2)
    )
    tokenizers = []
    for name, length in (("tokenizer", 16), ("tokenizer_2", 16), ("tokenizer_3", 64)):
        folder = save_byte_tokenizer(root / f".sd3_{name}")
        tokenizers.append(transformers.AutoTokenizer.from_pretrained(folder, model_max_length=length))
    pipe = diffusers.StableDiffusion3Pipeline(
        transformer=transformer, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
        text_encoder=clips[0], tokenizer=tokenizers[0], text_encoder_2=clips[1], tokenizer_2=tokenizers[1],
        text_encoder_3=t5, tokenizer_3=tokenizers[2],
    )  # fmt: skip
    with quiet_pipeline():
        pipe.save_pretrained(root / "sd3")
    return root / "sd3"
