"""Images per second: ``bigtrain train`` on a ResNet against torchvision's reference training loop written by hand.

    python bench/vision_speed.py              # ~4 minutes on 2 CPU cores: the table of results/vision_speed_cpu.md
    python bench/vision_speed.py --reps 1     # one round

Both are 2-rank gloo jobs under torchrun, fp32, on the same model (a ResNet from its transformers config: basic
blocks, widths 32-256, one block per stage) and the same data (the built-in shapes, upscaled to 64 px by the crop),
global batch 64 = 32 images per rank, one micro-batch:
- ``bigtrain ddp``: ``bigtrain train`` (its data path: random-resized crop and flip per image, seeded per image and
  position; its loss over the global batch, clipping, AdamW, BatchNorm's statistics averaged after each step, logs);
- ``hand ddp``: the loop of torchvision's ``references/classification/train.py`` reduced to what runs here: a
  random-resized crop and flip per image (torchvision's parameters, written on tensors: its wheel does not load
  beside a CPU torch), ``DistributedDataParallel``, mean cross-entropy, ``clip_grad_norm_``, AdamW.
channels_last and autocast are left out of both: on this CPU (no AVX-512) bf16 convolutions take the slow reference
path, and channels-last (``parallel.channels_last``) made recipes/image_classifier.yaml slower here (227 against 1,358
images/s over 20 steps, one run each: oneDNN reorders around small convolutions); both are GPU measurements. Runs
alternate (each contender once per round, ``--reps`` rounds); a run's time is the median of its steps after the first
two, the table's the median over rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MODEL = dict(model_type="resnet", embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1])
MODEL["layer_type"] = "basic"
SIZE, PER_RANK, STEPS, LR = 64, 32, 12, 1e-3
CONTENDERS = ["bigtrain ddp", "hand ddp"]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def crop_box(height: int, width: int, torch) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3, ten tries, then the centre)."""
    area = height * width
    for _ in range(10):
        target = area * torch.empty(1).uniform_(0.08, 1.0).item()
        ratio = math.exp(torch.empty(1).uniform_(math.log(3 / 4), math.log(4 / 3)).item())
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            return int(torch.randint(0, height - h + 1, (1,))), int(torch.randint(0, width - w + 1, (1,))), h, w
    return 0, 0, height, width


def hand_worker() -> None:
    """One rank of the hand-written loop (under torchrun); rank 0 prints one JSON line of step times."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from transformers import AutoConfig, AutoModelForImageClassification

    from bigtrain.data.synthetic_images import shapes

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    images, labels = shapes()
    spec = {k: v for k, v in MODEL.items() if k != "model_type"}
    torch.manual_seed(0)
    model = AutoModelForImageClassification.from_config(AutoConfig.for_model("resnet", num_labels=10, **spec))
    model = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
    generator = torch.Generator().manual_seed(1)
    times = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        order = torch.randint(0, len(labels), (PER_RANK * world,), generator=generator)[rank * PER_RANK :][:PER_RANK]
        pictures = []
        for i in order.tolist():
            image = torch.from_numpy(images[i]).permute(2, 0, 1).float() / 255.0
            top, left, h, w = crop_box(image.shape[1], image.shape[2], torch)
            out = F.interpolate(image[None, :, top : top + h, left : left + w], size=(SIZE, SIZE), mode="bilinear",
                                antialias=True, align_corners=False)[0]  # fmt: skip
            if torch.rand(()) < 0.5:
                out = out.flip(-1)
            pictures.append((out - mean) / std)
        logits = model(pixel_values=torch.stack(pictures)).logits
        loss = F.cross_entropy(logits, torch.from_numpy(labels[order.numpy()]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        float(loss)  # what a loop that logs its loss waits for
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"step_times": times}))
    dist.destroy_process_group()


def torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29533", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return proc


def run_bigtrain(folder: Path) -> list[float]:
    recipe = {
        "model": {"config": dict(MODEL)},
        "data": {"path": "builtin:shapes", "image_size": SIZE, "augment": "crop_flip"},
        "train": {"steps": STEPS, "global_batch_size": 2 * PER_RANK, "lr": LR, "grad_clip": 1.0},
        "parallel": {"backend": "ddp", "micro_batch_size": PER_RANK},
        "checkpoint": {"every": 0, "save_final_model": False},
        "output_dir": str(folder / "out"),
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    torchrun(["-m", "bigtrain", "train", str(path)], folder)
    rows = [json.loads(line) for line in (folder / "out" / "metrics.jsonl").read_text().splitlines()]
    return [2 * PER_RANK / r["images_per_s"] for r in rows]


def run_hand(folder: Path) -> list[float]:
    proc = torchrun([str(Path(__file__).resolve()), "--worker"], folder)
    return json.loads(proc.stdout.strip().splitlines()[-1])["step_times"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        hand_worker()
        return
    rounds: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    for _ in range(args.reps):
        for contender in CONTENDERS:
            with tempfile.TemporaryDirectory(dir=REPO) as tmp:
                times = (run_bigtrain if contender.startswith("bigtrain") else run_hand)(Path(tmp))
            rounds[contender].append(statistics.median(times[2:]))
    hand = statistics.median(rounds["hand ddp"])
    print("| contender | s/step (median of rounds) | rounds | images/s | vs hand-written |")
    print("|---|---|---|---|---|")
    for contender, seconds in rounds.items():
        step = statistics.median(seconds)
        ratio = f"{hand / step:.2f}x" if contender != "hand ddp" else ""
        shown = ", ".join(f"{s:.3f}" for s in seconds)
        print(f"| {contender} | {step:.3f} | {shown} | {2 * PER_RANK / step:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
