"""Image conversations through the data cache: built once (the processor run on every conversation and image),
then mapped by every later start; the rows, targets and micro-batches are those processing in memory gives. A dataset
holding its images (a HF image column) is processed in memory; a conversation too long is refused from the build."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from helpers import REPO

from bigtrain.config.schema import DataConfig
from bigtrain.errors import ConfigError

sys.path.insert(0, str(REPO / "recipes"))
from make_vlm_demo import save_tiny_vlm  # noqa: E402

SEQ_LEN = 160


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    from bigtrain.data.processor import load_processor

    folder = save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "qwen", "qwen2_5_vl")
    return load_processor(str(folder), "model.name_or_path", None, None)


def conversations(folder, count: int) -> str:
    """``count`` conversations over pictures of three sizes (so rows differ in their image tokens)."""
    from PIL import Image

    for side in (16, 24, 32):
        Image.fromarray(np.full((side, side, 3), side * 5, dtype=np.uint8)).save(folder / f"{side}.png")
    lines = []
    for i in range(count):
        side = (16, 24, 32)[i % 3]
        user = [{"type": "image", "image": f"{side}.png"}, {"type": "text", "text": f"What is {i}?"}]
        lines.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": f"A {i}."}]})
    path = folder / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return str(path)


def load(path: str, processor, cache_dir, seq_len: int = SEQ_LEN):
    from bigtrain.data.image_chat_cache import load_image_chats

    cfg = DataConfig(path=path, seq_len=seq_len, cache_dir=str(cache_dir))
    return load_image_chats(cfg, "data.path", path, processor, 0)


def test_conversations_are_processed_once_and_read_as_in_memory(processor, tmp_path):
    from bigtrain.data.image_chat import in_memory, records_of

    path = conversations(tmp_path, 12)
    first = load(path, processor, tmp_path / "cache")
    assert first.cache_note is not None and "built in" in first.cache_note
    again = load(path, processor, tmp_path / "cache")
    assert again.cache_note is not None and again.cache_note.endswith("(read)")
    cfg = DataConfig(path=path, seq_len=SEQ_LEN)
    records, root = records_of(cfg, "data.path", path, 0)
    held = in_memory(cfg, "data.path", path, processor, records, root)
    assert again.description == held.description and again.image_side == held.image_side
    assert again.images_per_row == held.images_per_row == 1.0
    np.testing.assert_array_equal(again.row_pixels, held.row_pixels)
    np.testing.assert_array_equal(np.asarray(again.ids, dtype=np.int64), held.ids.astype(np.int64))
    np.testing.assert_array_equal(np.asarray(again.targets), held.targets)
    rows = np.array([0, 4, 11])
    mapped, kept = again.micro_batch(rows), held.micro_batch(rows)
    torch.testing.assert_close(mapped.input_ids, kept.input_ids, rtol=0, atol=0)
    torch.testing.assert_close(mapped.labels, kept.labels, rtol=0, atol=0)
    for name, value in kept.inputs.items():
        torch.testing.assert_close(mapped.inputs[name], value, rtol=0, atol=0, msg=name)


def test_a_dataset_holding_its_images_is_processed_in_memory(processor, tmp_path):
    import datasets
    from PIL import Image

    picture = Image.fromarray(np.zeros((24, 24, 3), dtype=np.uint8))
    user = [{"type": "image"}, {"type": "text", "text": "What?"}]
    answer = [{"type": "text", "text": "A cat."}]
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    rows = {"messages": [messages] * 3, "images": [[picture]] * 3}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"))
    data = load(str(tmp_path / "saved"), processor, tmp_path / "cache")
    assert data.cache_note is None and data.num_rows == 3
    assert not list((tmp_path / "cache").glob("chats-*"))


def test_a_conversation_too_long_is_refused_by_the_build(processor, tmp_path):
    path = conversations(tmp_path, 3)
    for _ in range(2):  # the same line again on the next start: nothing half-built is kept
        with pytest.raises(ConfigError, match="conversations are longer than data.seq_len=20"):
            load(path, processor, tmp_path / "cache", seq_len=20)
    assert not list((tmp_path / "cache").glob("chats-*"))


def test_the_processor_s_pixel_budget_is_part_of_the_key(processor, tmp_path):
    """Another image processor setting (here a smaller pixel budget) builds another entry: its images expand into
    other tokens."""
    from bigtrain.data.processor import load_processor

    path = conversations(tmp_path, 6)
    first = load(path, processor, tmp_path / "cache")
    folder = processor.tokenizer.name_or_path
    smaller = load_processor(folder, "model.name_or_path", None, 16 * 16)
    again = load(path, smaller, tmp_path / "cache")
    assert again.cache_note is not None and "built in" in again.cache_note
    assert again.cache_note.split(" (")[0] != first.cache_note.split(" (")[0]
    assert again.image_tokens < first.image_tokens


def test_a_missing_data_path_is_one_line(processor, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(str(tmp_path / "nowhere.jsonl"), processor, tmp_path / "cache")
