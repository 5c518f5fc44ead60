"""Captioned images as a diffusion transformer trains on them (``model.task: text-to-image``): the frozen parts'
outputs computed once into the data cache, the noising made per example at each visit.

A text-to-image pipeline's VAE and text encoders are frozen: their outputs for an image and its caption never change,
so they are computed once, by the first process that needs them (the others wait on the cache's lock), and kept in
the data cache as arrays every rank maps:

- the VAE's latent distribution of each image (its mean and log-variance, [2, C, h, w]): an image's latents are a
  fresh sample of it at each visit, as diffusers' scripts sample a cached ``latent_dist`` (``--cache_latents``);
- the prompt embeddings of each caption (FLUX: T5's token states [L, D] and CLIP's pooled vector [P]; SD3: its two
  CLIPs' states then T5's, and their pooled vectors), through the pipeline's own ``encode_prompt`` (captions longer
  than the text encoder's ``L`` tokens are cut, and counted).

A micro-batch (``micro_batch``) draws, for each example, from the generator of its position in the run's global
order (``losses/flow_matching.py``): the latents' sample, the noise and the timestep, so that every plan noises each
example alike. FLUX's transformer reads the noisy latents packed into 2 x 2 patches with their position ids, and the
timestep as sigma; SD3's reads the latents as they are (it patches them itself), and the timestep as sigma x 1000.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigtrain.config.diffusers_config import quiet_pipeline
from bigtrain.data import cache
from bigtrain.data.denoise_batch import DenoiseBatch, ImageBatch, Noiser
from bigtrain.errors import ConfigError

__all__ = ["DenoiseBatch", "EncodedImages", "read_encoded"]

ENCODE_BATCH = 8  # images (captions) through the frozen parts at once
TEXT_FILES = ("prompt_embeds.npy", "pooled.npy")
BUCKETS = "buckets.npy"


@dataclass(frozen=True)
class Encoded:
    """What the frozen parts made of a folder (``encode``), mapped from the data cache; with the frozen parts run
    during training (``live``), the images' buckets only, and the images and captions themselves (``listed``)."""

    moments: tuple[np.ndarray, ...] | None  # per bucket, [n, 2, C, h, w] fp32: the VAE's mean and log-variance
    prompt_embeds: np.ndarray | None  # [N, L, D] fp32
    pooled: np.ndarray | None  # [N, P] fp32
    captions_cut: int  # captions longer than L tokens
    sizes: tuple[tuple[int, int], ...]  # each bucket's (width, height) in px: one square without data.aspect_buckets
    bucket: np.ndarray  # [N] each image's bucket
    slot: np.ndarray  # [N] each image's row in its bucket's moments
    text_tokens: int  # the prompt embeddings' tokens (SD3: its CLIPs' and T5's)
    latent: tuple[int, int]  # the VAE's (latent channels, blocks)
    listed: Any = None  # the images and captions (``captioned_images.Captioned``), read at each step when live

    @property
    def live(self) -> bool:
        return self.moments is None

    def latent_shape(self, bucket: int) -> tuple[int, int, int]:
        """[C, h, w] of the latents of an image of bucket ``bucket``."""
        (width, height), (channels, blocks) = self.sizes[bucket], self.latent
        return channels, latent_side(height, blocks), latent_side(width, blocks)

    def described(self) -> str:
        """How many images, of what side (or, in buckets, how many in each bucket's size)."""
        n = len(self.bucket)
        if len(self.sizes) == 1 and self.sizes[0][0] == self.sizes[0][1]:
            return f"{n} captioned images of {self.sizes[0][0]} px"
        counts = np.bincount(self.bucket, minlength=len(self.sizes))
        held = ", ".join(f"{w}x{h}: {c}" for (w, h), c in zip(self.sizes, counts, strict=True) if c)
        return f"{n} captioned images in buckets (px: images) {held}"


@dataclass(frozen=True)
class EncodedImages:
    """Examples of captioned images (``Encoded``) and how they are noised (``denoise_batch.Noiser``)."""

    encoded: Encoded
    noiser: Noiser
    seed: int
    description: str
    text_len: int  # the T5 tokens a caption is cut or padded to (data.seq_len)
    index: np.ndarray | None = None
    train: bool = True  # draws keyed by the global position (training); False: by the example (fixed evaluations)
    cache_note: str | None = None
    bucketed: bool = False  # data.aspect_buckets: each global batch from one bucket (``row_groups``)

    seq_len = 1  # one example per row
    positions = None
    truncated = 0

    @property
    def num_rows(self) -> int:
        return len(self.encoded.bucket) if self.index is None else len(self.index)

    @property
    def examples(self) -> int:
        return self.num_rows

    @property
    def row_groups(self) -> np.ndarray | None:
        """Each row's aspect-ratio bucket (a global batch is drawn from one), or None without buckets."""
        if not self.bucketed:
            return None
        return self.encoded.bucket if self.index is None else self.encoded.bucket[self.index]

    def at(self, rows: np.ndarray) -> np.ndarray:
        return rows if self.index is None else self.index[rows]

    def subset(self, index: np.ndarray, description: str, train: bool = True) -> EncodedImages:
        return dataclasses.replace(self, index=self.at(index), description=description, train=train)

    def micro_batch(self, rows: np.ndarray, seen: np.ndarray | None = None) -> DenoiseBatch | ImageBatch:
        """Examples ``rows`` (0-based among these) noised by their own draws (``seen``: each row's position in the
        global order; None or an evaluation: the example's own index): from the data cache, or, with the frozen
        parts run during training, the images and captions with their draws (``ImageBatch``)."""
        at = self.at(rows)
        keys = at if seen is None or not self.train else seen
        buckets = np.unique(self.encoded.bucket[at])
        if len(buckets) != 1:  # the order draws each batch from one bucket: a broken invariant, not bad input
            raise RuntimeError(f"a micro-batch of images from {len(buckets)} aspect-ratio buckets")
        bucket = int(buckets[0])
        drawn = self.noiser.draws(self.seed, keys, self.encoded.latent_shape(bucket))
        labels = torch.zeros(len(at), dtype=torch.int64)
        if self.encoded.live:
            listed, size = self.encoded.listed, self.encoded.sizes[bucket]
            pixels = torch.stack([pixels_of(listed, int(i), size) for i in at])
            captions = tuple(listed.captions[int(i)] for i in at)
            return ImageBatch(pixels, captions, drawn, labels, self.noiser, self.text_len)
        assert self.encoded.moments is not None and self.encoded.prompt_embeds is not None
        moments = torch.from_numpy(np.array(self.encoded.moments[bucket][self.encoded.slot[at]])).unbind(1)
        text = (torch.from_numpy(np.array(self.encoded.prompt_embeds[at])),
                torch.from_numpy(np.array(self.encoded.pooled[at])))  # fmt: skip
        return self.noiser.batch(moments, drawn, text, labels)


def pixels_of(listed: Any, i: int, size: tuple[int, int]) -> torch.Tensor:
    """Image ``i`` of ``listed`` fitted to ``size`` (width, height): [3, height, width] in [-1, 1]."""
    from bigtrain.data.aspect_buckets import fitted_pixels
    from bigtrain.data.pixels import rgb_array

    with listed.picture(i) as image:
        array = np.ascontiguousarray(rgb_array(image))
    return fitted_pixels(torch.from_numpy(array).permute(2, 0, 1), size)


def frozen_dtype(device: torch.device, mixed_precision: str) -> torch.dtype:
    """The frozen parts' dtype: on a GPU bf16 (diffusers' scripts cast them to the training's dtype; fp16 too is bf16
    here, where T5's activations overflow), fp32 for an fp32 run; on the host fp32. Whatever they ran in, the cache
    keeps fp32 values: a cache built on a CPU node serves a GPU run."""
    if device.type != "cuda" or mixed_precision == "fp32":
        return torch.float32
    return torch.bfloat16


def encoding_device() -> torch.device:
    """Where the data cache's pass runs: the first GPU of the process that builds it, else the host."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def read_encoded(
    data_cfg: Any,
    key: str,
    path: str,
    pipeline: str,
    sizes: list[tuple[int, int]],
    text_len: int,
    latent: tuple[int, int],
    live: bool = False,
    mixed_precision: str = "fp32",
) -> tuple[Encoded, str]:
    """The folder ``path``'s images and captions through ``pipeline``'s frozen parts, from the data cache (built
    now if no process has): (what they made, the cache's line). ``sizes``: the buckets' (width, height), one square
    without buckets; ``latent``: the VAE's (latent channels, blocks); ``live``: the frozen parts run during training
    (``parallel.frozen_parts``), so the cache keeps each image's bucket and its captions' count only;
    ``mixed_precision``: train.mixed_precision (the parts' dtype on a GPU, ``frozen_dtype``)."""
    from bigtrain.data.captioned_images import list_captioned
    from bigtrain.data.records import is_dataset_path

    folder = Path(path)
    if not folder.is_dir() and not is_dataset_path(path):
        raise ConfigError(
            f"{key}={path!r} is neither a folder nor a HF dataset; give a folder of images with a metadata.jsonl "
            "(file_name and text per row) or a .txt caption beside each image, or a HF dataset with an image column "
            "(a save_to_disk folder, .parquet or .arrow files)"
        )
    listed = list_captioned(key, folder, split=data_cfg.split)
    parts = {
        "source": cache.files_identity(listed.paths),
        "captions": listed.captions,
        "pipeline": cache.files_identity(_frozen_files(Path(pipeline))),
        "sizes": [list(size) for size in sizes],
        "text_len": text_len,
    }
    dtype = frozen_dtype(encoding_device(), mixed_precision)

    def build(out: Path) -> dict[str, Any]:
        if live:
            return _index(listed, Path(pipeline), sizes, text_len, out)
        return _encode(listed, Path(pipeline), sizes, text_len, dtype, out)

    kind = "image-buckets" if live else "encoded-images"
    found = cache.entry(cache.cache_dir_of(data_cfg), kind, key, parts, build)
    meta, n = found.meta, len(listed.captions)
    bucket = np.load(found.folder / BUCKETS)
    counts = np.bincount(bucket, minlength=len(sizes))
    slot = np.empty(n, dtype=np.int64)
    for k, count in enumerate(counts):
        slot[bucket == k] = np.arange(count)
    cut, sizes_held = int(meta["captions_cut"]), tuple(sizes)
    if live:
        encoded = Encoded(None, None, None, cut, sizes_held, bucket, slot, int(meta["text_tokens"]), latent, listed)
        return encoded, found.note(key)
    moments = tuple(
        np.lib.format.open_memmap(found.folder / moments_file(k), mode="r") if count else np.empty(0, np.float32)
        for k, count in enumerate(counts)
    )  # fmt: skip
    for k, array in enumerate(moments):
        assert array.shape[0] == counts[k] or not counts[k], (moments_file(k), array.shape, counts[k])
    text = [np.lib.format.open_memmap(found.folder / f, mode="r") for f in TEXT_FILES]
    for name, array in zip(TEXT_FILES, text, strict=True):
        assert list(array.shape) == [n, *meta["shapes"][name]], (name, array.shape)
    encoded = Encoded(moments, *text, cut, sizes_held, bucket, slot, int(text[0].shape[1]), latent)
    return encoded, found.note(key)


def moments_file(bucket: int) -> str:
    return f"moments-{bucket}.npy"


def _frozen_files(pipeline: Path) -> list[Path]:
    """The files of the frozen parts (VAE, text encoders, tokenizers) whose bytes decide what they make."""
    return sorted(
        f for part in ("vae", "text_encoder", "text_encoder_2", "text_encoder_3", "tokenizer", "tokenizer_2",
                       "tokenizer_3")
        for f in (pipeline / part).glob("*") if f.is_file()
    )  # fmt: skip


def _buckets_of(listed: Any, sizes: list[tuple[int, int]]) -> np.ndarray:
    """Each image's bucket: the one nearest its aspect ratio (its header read), or the one square."""
    from bigtrain.data.aspect_buckets import nearest_bucket

    n = len(listed.captions)
    if len(sizes) == 1:
        return np.zeros(n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    for i in cache.counted(range(n), "data.path", "reading sizes", "images"):
        with listed.picture(i) as image:
            out[i] = nearest_bucket(*image.size, sizes)
    return out


def _encode(
    listed: Any, pipeline: Path, sizes: list[tuple[int, int]], text_len: int, dtype: torch.dtype, out: Path
) -> dict[str, Any]:
    """Every image through the VAE (at its bucket's size) and every caption through the text encoders, written to
    ``out``: each bucket's latent moments, every caption's embeddings, each image's bucket."""
    device = encoding_device()
    pipe = frozen_pipeline(pipeline, dtype)
    pipe.to(device)
    n = len(listed.captions)
    cut = captions_cut(t5_tokenizer(pipe), listed.captions, text_len)
    bucket = _buckets_of(listed, sizes)
    np.save(out / BUCKETS, bucket)
    # chunks of a bucket's images: (bucket, their indices, where they go in the bucket's moments)
    chunks = [
        (k, rows[start : start + ENCODE_BATCH], start)
        for k in range(len(sizes)) for rows in [np.flatnonzero(bucket == k)]
        for start in range(0, len(rows), ENCODE_BATCH)
    ]  # fmt: skip
    files: dict[str, Any] = {}

    def write(name: str, rows: int, value: np.ndarray, at: Any) -> None:
        if name not in files:
            files[name] = np.lib.format.open_memmap(
                out / name, mode="w+", dtype=np.float32, shape=(rows, *value.shape[1:])
            )
        files[name][at] = value

    with torch.no_grad():
        for k, rows, start in cache.counted(chunks, "data.path", "encoding", f"x{ENCODE_BATCH} images"):
            pixels = torch.stack([pixels_of(listed, int(i), sizes[k]) for i in rows])
            dist = pipe.vae.encode(pixels.to(device, dtype)).latent_dist
            moments = torch.stack([dist.mean, dist.logvar], dim=1).float().cpu().numpy()
            write(moments_file(k), int((bucket == k).sum()), moments, slice(start, start + len(rows)))
            with quiet_pipeline():
                embeds, pooled = prompt_embeddings(pipe, [listed.captions[i] for i in rows], device, text_len)
            for name, value in zip(TEXT_FILES, (embeds, pooled), strict=True):
                write(name, n, value.float().cpu().numpy(), rows)
    for array in files.values():
        array.flush()
    shapes = {name: list(array.shape[1:]) for name, array in files.items()}
    return {"shapes": shapes, "captions_cut": cut}


def _index(listed: Any, pipeline: Path, sizes: list[tuple[int, int]], text_len: int, out: Path) -> dict[str, Any]:
    """What the data cache keeps when the frozen parts run during training: each image's bucket (written to
    ``out``), and the captions cut and the prompt embeddings' tokens, read from the tokenizers alone."""
    from transformers import AutoTokenizer

    def tokenizer(name: str) -> Any:
        with quiet_pipeline():
            return AutoTokenizer.from_pretrained(str(pipeline / name), local_files_only=True)

    long = "tokenizer_3" if (pipeline / "tokenizer_3").is_dir() else "tokenizer_2"  # t5_tokenizer's
    cut = captions_cut(tokenizer(long), listed.captions, text_len)
    # SD3's prompt embeddings (with its T5 or without: zeros in its place): its CLIPs' tokens (the first tokenizer's
    # length), then T5's
    sd3 = json.loads((pipeline / "model_index.json").read_text()).get("_class_name", "").startswith("StableDiffusion3")
    tokens = text_len + (tokenizer("tokenizer").model_max_length if sd3 else 0)
    np.save(out / BUCKETS, _buckets_of(listed, sizes))
    return {"captions_cut": cut, "text_tokens": tokens}


def frozen_pipeline(pipeline: Path, dtype: torch.dtype) -> Any:
    """The pipeline's frozen parts (its VAE, text encoders and tokenizers; no transformer), on the host."""
    with quiet_pipeline():
        from diffusers import DiffusionPipeline

        return DiffusionPipeline.from_pretrained(str(pipeline), transformer=None, dtype=dtype, local_files_only=True)


def captions_cut(tokenizer: Any, captions: list[str], text_len: int) -> int:
    """The captions longer than ``text_len`` of the T5 tokenizer's tokens."""
    with quiet_pipeline():  # the tokenizer's note on rows longer than its model's: counted here
        return sum(len(tokenizer(c).input_ids) > text_len for c in captions)


def t5_tokenizer(pipe: Any) -> Any:
    """The tokenizer of the pipeline's T5, which reads the long prompt (FLUX's second, SD3's third)."""
    return getattr(pipe, "tokenizer_3", None) or pipe.tokenizer_2


def prompt_embeddings(pipe: Any, captions: list[str], device: Any, text_len: int) -> tuple[Any, Any]:
    """(the prompt embeddings, the pooled vectors) of ``captions`` through the pipeline's own ``encode_prompt``:
    FLUX's T5 states and CLIP's pooled vector; SD3's two CLIPs' penultimate states (padded to T5's width) then T5's
    states, and the CLIPs' pooled projections side by side."""
    if hasattr(pipe, "tokenizer_3"):  # SD3: prompt_2 and prompt_3 are the caption too; no negative prompts
        embeds, _, pooled, _ = pipe.encode_prompt(
            captions, None, None, device=device, do_classifier_free_guidance=False, max_sequence_length=text_len
        )
        return embeds, pooled
    embeds, pooled, _ = pipe.encode_prompt(captions, None, device=device, max_sequence_length=text_len)
    return embeds, pooled


def latent_side(image_size: int, vae_blocks: int) -> int:
    """The latents' side of an image of ``image_size`` px (the VAE halves it at each block but the last)."""
    return image_size // 2 ** (vae_blocks - 1)


def check_packable(key: str, image_size: int, vae_blocks: int) -> None:
    """FLUX packs 2 x 2 latents, SD3 patches them 2 x 2: the image's side must give an even latent side."""
    side = latent_side(image_size, vae_blocks)
    if side % 2:
        step = 2**vae_blocks
        near = [s for s in (math.floor(image_size / step) * step, math.ceil(image_size / step) * step) if s > 0]
        raise ConfigError(
            f"{key}={image_size} gives latents of {side} x {side}, which the transformer's 2 x 2 patches do not tile; "
            f"use a multiple of {step} (e.g. {' or '.join(map(str, sorted(set(near))))})"
        )
