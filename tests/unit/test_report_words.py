"""bigtrain report's memory plot says what was measured: a CPU run's peak RSS (Python and libraries included) is not
labelled as the tensor memory a GPU run's allocator peak is."""

from __future__ import annotations

from bigtrain.cli.report import _memory_words


def test_the_memory_plot_is_titled_by_what_was_measured():
    assert _memory_words([{"step": 1, "peak_mem_measures": "peak RSS"}])[1] == "GiB (RSS)"
    assert "RSS" in _memory_words([{"step": 1, "peak_mem_measures": "peak RSS"}])[0]
    cuda = [{"step": 1, "peak_mem_measures": "torch.cuda.max_memory_allocated"}]
    assert _memory_words(cuda) == ("Peak tensor memory (rank 0, torch.cuda.max_memory_allocated)", "GiB")
    assert _memory_words([{"step": 1}]) == ("Peak memory (rank 0)", "GiB")  # a run from before the field
