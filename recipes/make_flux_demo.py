"""``python recipes/make_flux_demo.py FOLDER``: a tiny FLUX pipeline and captioned pictures to try docs/diffusion.md
offline in seconds. With your own model and images, skip it and point the recipe at a diffusers pipeline folder
(FLUX.1-dev's) and a folder of images with a metadata.jsonl.

FOLDER/pipeline is a ``FluxPipeline`` of tiny, randomly initialised parts (a transformer of width 16 with one double-
and one single-stream block, a VAE that halves once, CLIP and T5 encoders of one layer, bigtrain's byte tokenizer for
both, FLUX's scheduler) saved with ``save_pretrained``; FOLDER/images holds 200 of bigtrain's built-in 32 px shapes
with a caption each ("a red disk") in a metadata.jsonl, as diffusers' imagefolder reads it. The tests build theirs with
``pipeline_folder`` and ``captioned_folder``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

TINY_FLUX = {
    "patch_size": 1, "in_channels": 16, "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 8,
    "num_attention_heads": 2, "joint_attention_dim": 32, "pooled_projection_dim": 16, "guidance_embeds": False,
    "axes_dims_rope": [2, 2, 4],
}  # fmt: skip
IMAGE_SIZE = 16  # px: latents of 8 x 8 (the tiny VAE halves once), 16 patches
TEXT_LEN = 8


def tiny_vae():
    """A VAE of two blocks (it halves an image's side once) with 4 latent channels, FLUX's scaling and shifting."""
    import diffusers

    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=4,
        sample_size=IMAGE_SIZE, scaling_factor=0.5, shift_factor=0.1,
    )  # fmt: skip


def pipeline_folder(root: Path, seed: int = 0) -> Path:
    """A FluxPipeline of tiny parts saved with ``save_pretrained`` in ``root/pipeline``, every value from ``seed``."""
    import diffusers
    import torch
    import transformers

    from bigtrain.config.diffusers_config import quiet_pipeline
    from bigtrain.data.tokenizer import save_byte_tokenizer

    torch.manual_seed(seed)
    transformer = diffusers.FluxTransformer2DModel(**TINY_FLUX)
    vae = tiny_vae()
    clip = transformers.CLIPTextModel(
        transformers.CLIPTextConfig(
            vocab_size=260, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            max_position_embeddings=32, eos_token_id=256, bos_token_id=256, pad_token_id=256,
        )
    )  # fmt: skip
    t5 = transformers.T5EncoderModel(
        transformers.T5Config(vocab_size=260, d_model=32, d_ff=64, d_kv=16, num_layers=1, num_heads=2)
    )
    tokenizers = []
    for name, length in (("tokenizer", 16), ("tokenizer_2", 64)):
        folder = save_byte_tokenizer(root / f".{name}")
        tokenizers.append(transformers.AutoTokenizer.from_pretrained(folder, model_max_length=length))
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False)
    pipe = diffusers.FluxPipeline(
        scheduler=scheduler, vae=vae, text_encoder=clip, tokenizer=tokenizers[0], text_encoder_2=t5,
        tokenizer_2=tokenizers[1], transformer=transformer,
    )  # fmt: skip
    with quiet_pipeline():  # its per-part "Writing model shards" bars: one line says what was written
        pipe.save_pretrained(root / "pipeline")
    return root / "pipeline"


def captioned_folder(
    root: Path, count: int = 8, seed: int = 0, shape: tuple[int, int] | list[tuple[int, int]] = (20, 24)
) -> Path:
    """``count`` random pictures of ``shape`` (height, width) px in ``root/images`` with a metadata.jsonl (of a
    list of shapes: picture i of the i-th, cycling)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    shapes = shape if isinstance(shape, list) else [shape]
    folder = root / "images"
    folder.mkdir(parents=True)
    rows = []
    for i in range(count):
        pixels = rng.integers(0, 256, (*shapes[i % len(shapes)], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.png")
        rows.append({"file_name": f"{i}.png", "text": f"a picture number {i} of {'red ' * (i % 3)}things"})
    (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def shapes_folder(root: Path, count: int = 200) -> Path:
    """The first ``count`` of bigtrain's built-in shapes in ``root/images``, each captioned with its class."""
    from PIL import Image

    from bigtrain.data.builtin_images import CLASSES, shapes

    images, labels = shapes()
    folder = root / "images"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(count):
        Image.fromarray(images[i]).save(folder / f"{i}.png")
        rows.append({"file_name": f"{i}.png", "text": f"a {CLASSES[labels[i]].replace('_', ' ')}"})
    (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/flux_demo")
    out.mkdir(parents=True, exist_ok=True)
    print(f"wrote {pipeline_folder(out)} and {shapes_folder(out)}")
