"""LoRA on Qwen2.5-VL-3B (its architecture, randomly initialised: nothing is downloaded) on one GPU, against the
planner: the measured peak of ``torch.cuda.max_memory_allocated`` and samples/s beside the planner's predicted peak
and step time for the same plan.

    python bench/gpu/vlm_lora.py --out OUT                    # 30 steps, 1 image of 448 px per conversation
    python bench/gpu/vlm_lora.py --out OUT --tiny --steps 3   # a 2-layer model on this machine (a check of the script)

The run is ``bigtrain train --nproc 1`` of a recipe written here: ``model.config`` Qwen2.5-VL-3B's architecture fields
(text: Qwen2.5-3B's, 36 layers of width 2048; vision: Qwen2.5-VL's 32-block tower of width 1280), the processor a
folder written here (Qwen2-VL's image processor at its published settings, 14-pixel patches merged 2 x 2; bigtrain's
byte tokenizer with Qwen's image tokens), the data 64 conversations of one drawn picture of ``--image-size`` pixels
(the built-in shapes at that size) and its answer. LoRA rank 16 on the language model, bf16, FSDP2 on one rank.
Measured: the peak of ``max_memory_allocated`` over the steps (metrics.jsonl's peak_mem_bytes) and the median step
time after the first 5 steps; predicted: ``bigtrain.plan(recipe=..., fix=the plan)``'s peak and step time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "recipes"))

QWEN25_VL_3B = {  # Qwen/Qwen2.5-VL-3B-Instruct's architecture fields
    "model_type": "qwen2_5_vl",
    "tie_word_embeddings": True,
    "text_config": {
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 128000,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1000000.0},
    },
    "vision_config": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "hidden_act": "silu",
        "out_hidden_size": 2048,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
    },
}
TINY = {
    **QWEN25_VL_3B,
    "text_config": {**QWEN25_VL_3B["text_config"], "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "bos_token_id": None,
                    "eos_token_id": None,
                    "rope_parameters": {"rope_type": "default", "mrope_section": [2, 2, 4], "rope_theta": 1e6}},
    "vision_config": {**QWEN25_VL_3B["vision_config"], "depth": 2, "hidden_size": 32, "intermediate_size": 64,
                      "num_heads": 2, "out_hidden_size": 64, "fullatt_block_indexes": [1]},
}  # fmt: skip


def write_processor(folder: Path) -> dict[str, int]:
    """Qwen2-VL's image processor at its published settings and a byte tokenizer with Qwen's image tokens; returns
    the token ids the model config names."""
    from make_vlm_demo import SPECIAL, TEMPLATE
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from bigtrain.data.tokenizer import save_byte_tokenizer

    save_byte_tokenizer(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *SPECIAL["qwen2_5_vl"]]})
    tokenizer.save_pretrained(folder)
    Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2).save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(
        TEMPLATE.replace("PLACEHOLDER", SPECIAL["qwen2_5_vl"][0] + "<|image_pad|><|vision_end|>")
    )
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2_5_VLProcessor"}))
    ids = tokenizer.convert_tokens_to_ids
    return {
        "image_token_id": ids("<|image_pad|>"),
        "video_token_id": ids("<|video_pad|>"),
        "vision_start_token_id": ids("<|vision_start|>"),
        "vision_end_token_id": ids("<|vision_end|>"),
    }


def write_data(folder: Path, image_size: int, count: int = 64) -> Path:
    from PIL import Image

    from bigtrain.data.synthetic_images import CLASSES, shapes

    folder.mkdir(parents=True, exist_ok=True)
    images, labels = shapes(count=count, side=image_size, seed=3)
    lines = []
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        Image.fromarray(image).save(folder / f"{i}.png")
        content = [{"type": "image", "image": f"{i}.png"}, {"type": "text", "text": "What is drawn in this picture?"}]
        answer = f"A {CLASSES[label].replace('_', ' ')}."
        lines.append({"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]})
    path = folder / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--micro", type=int, default=4)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_processor(out / "processor")
    data = write_data(out / "data", args.image_size)
    config = {**(TINY if args.tiny else QWEN25_VL_3B), **ids}
    recipe = {
        "model": {"config": config, "task": "image-text-to-text"},
        "data": {"path": str(data), "processor": str(out / "processor"), "seq_len": args.seq_len},
        "train": {"method": "lora", "steps": args.steps, "global_batch_size": args.batch, "lr": 1e-4,
                  "mixed_precision": "fp32" if args.tiny else "bf16"},
        "lora": {"r": 16, "alpha": 32},
        "parallel": {"backend": "fsdp2", "micro_batch_size": args.micro},
        "checkpoint": {"every": 0, "save_final_model": False},
        "output_dir": str(out / "run"),
    }  # fmt: skip
    path = out / "recipe.json"
    path.write_text(json.dumps(recipe))
    import yaml

    (out / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    proc = subprocess.run(
        [sys.executable, "-m", "bigtrain", "train", str(out / "recipe.yaml"), "--nproc", "1"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    (out / "train.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        return proc.returncode
    metrics = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    result = measured_against_planned(metrics, out, args)
    (out / "vlm_lora.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


def measured_against_planned(metrics: list[dict[str, Any]], out: Path, args: argparse.Namespace) -> dict[str, Any]:
    import bigtrain

    elapsed = [m["elapsed_s"] for m in metrics]
    steps = [b - a for a, b in zip(elapsed, elapsed[1:], strict=False)][4:] or [elapsed[-1]]
    step_s = statistics.median(steps)
    plan = json.loads((out / "run" / "plan.json").read_text())
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    hardware = {"gpus": 1, "gpu": gpu} if gpu else {"gpus": 1, "gpu": "H100"}
    predicted = bigtrain.plan(
        recipe=str(out / "recipe.yaml"), image_size=args.image_size, images_per_row=1, fix=plan, **hardware
    )
    chosen = predicted.to_dict()
    return {
        "gpu": gpu or "cpu",
        "torch": torch.__version__,
        "plan": plan,
        "image_size": args.image_size,
        "seq_len": args.seq_len,
        "global_batch": args.batch,
        "measured_peak_bytes": max(m["peak_mem_bytes"] for m in metrics),
        "measured_step_s": step_s,
        "measured_samples_per_s": args.batch / step_s,
        "predicted_peak_bytes": chosen["memory"]["total_bytes"],
        "predicted_step_s": chosen["time"]["step_s"],
        "predicted_samples_per_s": args.batch / chosen["time"]["step_s"],
    }


if __name__ == "__main__":
    raise SystemExit(main())
