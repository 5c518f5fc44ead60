"""Vision-language data as start-up reads it: labels on the assistant's tokens only, never an image token; bad input
one line on every rank before any process group (``TrainingJob`` as each rank of a 2-rank job builds it)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from helpers import REPO, recipe_dict, write_recipe

from bigtrain.errors import ConfigError

sys.path.insert(0, str(REPO / "recipes"))
from make_vlm_demo import save_tiny_vlm  # noqa: E402

SEQ_LEN = 160


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "qwen", "qwen2_5_vl")


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "llava", "llava")


def chats(folder, data_path="builtin:image_chat", **data):
    from bigtrain.config.schema import DataConfig
    from bigtrain.data.image_chat_cache import load_image_chats
    from bigtrain.data.processor import load_processor

    processor = load_processor(str(folder), "model.name_or_path", data.get("min_pixels"), data.get("max_pixels"))
    config = DataConfig(path=str(data_path), seq_len=data.get("seq_len", SEQ_LEN))
    return load_image_chats(config, "data.path", str(data_path), processor, 0)


def test_labels_are_the_assistant_turns_and_never_image_tokens(qwen):
    data = chats(qwen)
    tokenizer, image_id = data.processor.tokenizer, data.processor.image_token_id
    batch = data.micro_batch(np.arange(6))
    labelled = batch.labels != -100
    assert not (batch.labels == image_id).any() and (batch.input_ids == image_id).any()
    for row in range(6):
        said = tokenizer.decode(batch.labels[row][labelled[row]])
        answer = data.texts[row].rsplit("<|im_start|>assistant\n", 1)[1]  # through its <|im_end|>\n
        assert said == answer, (said, answer)
    # the images arrive as the processor makes them: 16 image tokens per 32 x 32 picture (4-pixel patches, 2 x 2 merge)
    assert int((batch.input_ids == image_id).sum()) == 16 * int(batch.inputs["image_grid_thw"].shape[0])


def test_image_tokens_are_never_labels_even_inside_the_assistant_s_turn(qwen, tmp_path):
    """The real data path (chat template, Qwen2.5-VL processor, ``load_image_chats``, ``micro_batch``) on a record
    whose user *and* assistant turns each hold the 24 x 24 picture. Counted by hand: 24 px / 4-pixel patches = 6 x 6
    patches, merged 2 x 2 = 9 image tokens per picture; the assistant's turn is <|vision_start|>, 9 x <|image_pad|>,
    <|vision_end|>, "A cat." (6 bytes of the byte tokenizer), <|im_end|>, "\\n": 19 tokens, of which the 9 image
    tokens must not be predicted. So 10 labelled positions, the loss's token count, and no label is an image token."""
    from bigtrain.data.labels import IGNORE_INDEX, labelled_positions

    record = _chat(["cat.png"], 1)
    record["messages"][1]["content"] = [{"type": "image", "image": "cat.png"}, {"type": "text", "text": "A cat."}]
    data = chats(qwen, data_path=_jsonl(tmp_path, [record]))
    batch = data.micro_batch(np.arange(1))
    image_id = data.processor.image_token_id
    ids, labels = batch.input_ids[0], batch.labels[0]
    assert int((ids == image_id).sum()) == 2 * 9  # the processor made what the hand count says
    assert not (labels == image_id).any()
    assert labelled_positions(batch.labels) == 10
    decode = data.processor.tokenizer.decode
    assert decode(labels[labels != IGNORE_INDEX]) == "<|vision_start|><|vision_end|>A cat.<|im_end|>\n"
    # the positions whose next token is an image token predict nothing: their cross-entropy terms are absent
    before_image = torch.nn.functional.pad(ids[1:] == image_id, (0, 1), value=False)
    assert (labels[before_image] == IGNORE_INDEX).all() and int(before_image.sum()) == 18


def test_a_pixel_budget_resizes_and_is_said(qwen):
    data = chats(qwen, max_pixels=16 * 16)
    assert data.resized == sum(len(i) for i in data.images)  # every 32 x 32 picture is above 256 pixels
    grid = data.micro_batch(np.arange(1)).inputs["image_grid_thw"]
    assert grid.prod(-1).tolist() == [16] * len(grid)  # 16 x 16 pixels: 4 x 4 patches of 4


def _jsonl(tmp_path, records) -> str:
    from PIL import Image

    Image.fromarray(np.zeros((24, 24, 3), dtype=np.uint8)).save(tmp_path / "cat.png")
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _chat(images: list, items: int, listed: list | None = None) -> dict:
    content = [{"type": "image", **({"image": images[i]} if i < len(images) else {})} for i in range(items)]
    record = {
        "messages": [
            {"role": "user", "content": [*content, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": "A cat."},
        ]
    }
    if listed is not None:
        record["images"] = listed
    return record


# (what is wrong, recipe changes given the test's folders and tmp_path, what the line must say)
CASES = {
    "an image that does not exist": (
        lambda r, f, t: r["data"].update(path=_jsonl(t, [_chat(["cat.png"], 1), _chat(["dog.png"], 1)])),
        "line 2 names the image 'dog.png', which does not exist",
    ),
    "more images than placeholders": (
        lambda r, f, t: r["data"].update(path=_jsonl(t, [_chat([], 1, ["cat.png", "cat.png"])])),
        "line 1: 2 images in its 'images'/'image' list but 1 image items in its messages take them",
    ),
    "fewer images than placeholders": (
        lambda r, f, t: r["data"].update(path=_jsonl(t, [_chat([], 2, ["cat.png"])])),
        "line 1: more image items in its messages than images in its 'images'/'image' list (1)",
    ),
    "rows too short for the image tokens": (
        lambda r, f, t: r["data"].update(seq_len=64),
        "conversations are longer than data.seq_len=64 with their image tokens",
    ),
    "a pixel budget for a family without one": (
        lambda r, f, t: r["model"].update(name_or_path=str(f["llava"])) or r["data"].update(max_pixels=4096),
        "data.min_pixels/data.max_pixels: the CLIPImageProcessorPil of model.name_or_path resizes every image",
    ),
    "a freeze name the model lacks": (
        lambda r, f, t: r["model"].update(freeze=["vision_encoder"]),
        "model.freeze: 'vision_encoder' is not a part of Qwen2_5_VLForConditionalGeneration; its parts are "
        "vision_tower (model.visual), projector (model.visual.merger), language_model (model.language_model)",
    ),
    "pipeline parallelism": (
        lambda r, f, t: r["parallel"].update(pp=2),
        "parallel.pp=2 with model.task=image-text-to-text is not built yet",
    ),
    "compile": (
        lambda r, f, t: r["train"].update(compile=True),
        "train.compile=true with model.task=image-text-to-text is not built yet",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("rank", [0, 1])
def test_every_rank_refuses_bad_vision_language_input_with_one_line(case, rank, tmp_path, qwen, llava):
    from bigtrain.config.load import load_recipe
    from bigtrain.runtime import LaunchEnv
    from bigtrain.train.run import TrainingJob

    breaker, expected = CASES[case]
    recipe = recipe_dict(
        tmp_path / "out",
        "builtin:image_chat",
        qwen,
        data={"seq_len": SEQ_LEN},
        train={"steps": 2, "global_batch_size": 2},
        parallel={"backend": "fsdp2"},
    )
    breaker(recipe, {"llava": llava}, tmp_path)
    env = LaunchEnv(rank=rank, world_size=2, local_rank=rank, local_world_size=2, launched=True)
    with pytest.raises(ConfigError) as e:
        TrainingJob(load_recipe(write_recipe(tmp_path / "bad.yaml", recipe)), env)
    assert expected in str(e.value)


def test_model_freeze_on_a_causal_lm_is_refused(tmp_path):
    from helpers import save_rows

    from bigtrain.config.load import load_recipe
    from bigtrain.runtime import LaunchEnv
    from bigtrain.train.run import TrainingJob

    recipe = recipe_dict(tmp_path / "out", save_rows(tmp_path / "rows.npy", num_rows=8, seq_len=9))
    recipe["model"]["freeze"] = ["vision_tower"]
    env = LaunchEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, launched=False)
    with pytest.raises(ConfigError, match="model.freeze=\\['vision_tower'\\] names parts of a vision-language model"):
        TrainingJob(load_recipe(write_recipe(tmp_path / "bad.yaml", recipe)), env)


def test_the_task_is_read_from_a_config_with_a_vision_tower():
    from transformers import AutoConfig

    from bigtrain.tasks import detect

    for family in ("qwen2_5_vl", "idefics3", "llava", "gemma3"):  # gemma3's class is also a causal LM's
        assert detect(AutoConfig.for_model(family)).name == "image-text-to-text", family
