"""Aspect-ratio buckets (``data.aspect_buckets``): the buckets of a side, an image's bucket and pixels, and the order
that draws each global batch from one bucket, the same for every plan."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bigtrain.data.aspect_buckets import bucket_sizes, epoch_batches, fitted_pixels, nearest_bucket
from bigtrain.data.loader import EvalLoader
from bigtrain.data.order import GlobalOrder


def test_flux_buckets_at_512_are_kohya_s_and_none_exceeds_the_square():
    sizes = bucket_sizes(512, 16)
    assert sizes == [(384, 640), (448, 576), (512, 512), (576, 448), (640, 384)]
    assert all(w * h <= 512 * 512 and w % 64 == 0 and h % 64 == 0 for w, h in sizes)
    big = bucket_sizes(1024, 16)
    assert (1024, 1024) in big and all(w * h <= 1024**2 and max(w / h, h / w) <= 2 for w, h in big)


@pytest.mark.parametrize("side", [528, 576, 672, 800, 1344])
def test_the_square_is_the_one_square_bucket_and_every_bucket_turns_both_ways(side):
    sizes = bucket_sizes(side, 16)
    assert [s for s in sizes if s[0] == s[1]] == [(side, side)]
    assert sorted(sizes) == sorted((h, w) for w, h in sizes)
    assert all(w * h <= side * side and w % 16 == 0 and h % 16 == 0 and max(w / h, h / w) <= 2 for w, h in sizes)


def test_the_tiny_pipeline_s_buckets_tile_its_patches():
    # the tiny VAE halves once and FLUX packs 2 x 2: sides of multiples of 4 px
    assert bucket_sizes(16, 4) == [(12, 20), (16, 16), (20, 12)]


def test_an_image_goes_to_the_bucket_nearest_its_aspect_ratio():
    sizes = bucket_sizes(512, 16)
    assert sizes[nearest_bucket(1920, 1080, sizes)] == (640, 384)  # 16:9 -> 5:3
    assert sizes[nearest_bucket(1080, 1920, sizes)] == (384, 640)
    assert sizes[nearest_bucket(1000, 1010, sizes)] == (512, 512)
    assert sizes[nearest_bucket(4000, 3000, sizes)] == (576, 448)  # 4:3 -> 9:7


def test_pixels_cover_the_bucket_and_keep_the_centre():
    image = torch.zeros(3, 40, 80, dtype=torch.uint8)
    image[:, :, 30:50] = 255  # a white band at the centre
    out = fitted_pixels(image, (20, 12))  # scaled by 0.3 to 12 x 24, 2 columns cut each side
    assert out.shape == (3, 12, 20) and float(out.min()) >= -1 and float(out.max()) <= 1
    assert (out[:, :, 8:12] > 0.999).all() and (out[:, :, :5] < -0.999).all()  # the band, 6 px wide, at the centre
    torch.testing.assert_close(out, out.flip(-1))  # cropped at the centre
    square = fitted_pixels(image, (12, 12))
    assert square.shape == (3, 12, 12)


def test_each_global_batch_comes_from_one_bucket_and_an_epoch_drops_only_remainders():
    buckets = np.array([0] * 10 + [1] * 7 + [2] * 3)
    epoch = epoch_batches(buckets, 4, np.random.default_rng(5))
    assert epoch.shape == (3, 4)  # 2 batches of bucket 0, 1 of bucket 1, none of bucket 2 (3 < 4)
    assert all(len(set(buckets[b])) == 1 for b in epoch)
    assert len(set(epoch.ravel())) == 12
    unshuffled = epoch_batches(buckets, 4, None)
    assert unshuffled.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [10, 11, 12, 13]]


def test_every_plan_reads_the_same_global_batch_and_epochs_reshuffle():
    buckets = np.random.default_rng(0).integers(0, 3, size=50)
    order = GlobalOrder(50, 8, shuffle=True, seed=2, groups=buckets)
    per_epoch = order.steps_per_epoch
    assert per_epoch == sum(int((buckets == b).sum()) // 8 for b in range(3))
    for step in range(2 * per_epoch + 1):
        batch = order.global_batch(step)
        assert len(set(buckets[batch])) == 1
        for dp, micro in ((1, 8), (2, 2), (4, 1), (2, 4)):
            read = np.concatenate([order.micro_batches(step, r, dp, micro).ravel() for r in range(dp)])
            assert (read == batch).all()
    first, second = (np.concatenate([order.global_batch(e * per_epoch + k) for k in range(per_epoch)]) for e in (0, 1))
    assert sorted(first) != sorted(second) or (first != second).any()


def test_held_out_images_are_read_bucket_by_bucket_with_fillers_of_their_own_bucket():
    class Rows:
        num_rows = 7
        row_groups = np.array([1, 0, 1, 1, 0, 1, 1])

        def micro_batch(self, rows, seen=None):
            assert len(set(self.row_groups[rows])) == 1
            return Batch(rows)

    class Batch:
        def __init__(self, rows):
            self.rows, self.labels = rows, torch.zeros(len(rows))

        def without_labels(self, mask):
            self.filler = mask.numpy()
            return self

        def to(self, device):
            return self

    read = []
    for rank in range(2):
        loader = EvalLoader(Rows(), rank, 2, 1, torch.device("cpu"), global_batch_size=4, count=len)
        read.append([[m.rows.tolist() for m in step.micro_batches] for step in loader])
    # bucket 0: rows 1, 4 (one chunk, two fillers); bucket 1: rows 0, 2, 3, 5 then 6 (three fillers)
    assert read[0] == [[[1], [4]], [[0], [2]], [[6], [0]]]
    assert read[1] == [[[1], [1]], [[3], [5]], [[0], [0]]]


@pytest.mark.parametrize("batch", [4, 8])
def test_bucket_notes_say_what_is_never_trained_and_refuse_a_batch_no_bucket_holds(batch):
    from types import SimpleNamespace

    from bigtrain.errors import ConfigError
    from bigtrain.tasks.text_to_image import bucket_notes

    encoded = SimpleNamespace(sizes=((12, 20), (16, 16), (20, 12)))
    data = SimpleNamespace(encoded=encoded, row_groups=np.array([0] * 2 + [1] * 7), num_rows=9)
    if batch == 8:
        with pytest.raises(
            ConfigError, match=r"no bucket holds train.global_batch_size=8 images \(12x20: 2, 16x16: 7\)"
        ):
            bucket_notes(data, batch)
        return
    assert bucket_notes(data, batch, shuffle=False)[1].endswith("the 3 left over never train (data.shuffle: false)")
    assert bucket_notes(data, batch) == [
        "data.aspect_buckets: 2 image(s) are never trained: their buckets hold fewer than a global batch (4): 12x20: 2",
        "data.aspect_buckets: each epoch trains 4 of 9 images, in whole global batches of one bucket; the 3 left over "
        "wait for a later epoch's shuffle",
    ]
