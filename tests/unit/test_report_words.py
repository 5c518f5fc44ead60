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


def test_the_memory_plot_starts_at_zero_so_a_small_rise_is_no_cliff(tmp_path, monkeypatch):
    """A 22 MiB rise on 1 GiB of RSS was drawn over the whole height of the plot; the axis now starts at zero."""
    import json

    import matplotlib.figure

    from bigtrain.cli.report import write_report

    start = 2**30
    records = [
        {"step": s, "loss": 1.0, "lr": 1e-3, "peak_mem_bytes": start + s * 2**20, "peak_mem_measures": "peak RSS"}
        for s in range(1, 23)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    limits = {}
    save = matplotlib.figure.Figure.savefig

    def keep_limits(fig, path, *args, **kwargs):
        limits[str(path).rsplit("/", 1)[1]] = fig.axes[0].get_ylim()
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep_limits)
    write_report(tmp_path)
    low, high = limits["memory.png"]
    assert low == 0 and 1.02 <= high < 1.2
    assert limits["loss.png"][0] != 0  # other plots keep matplotlib's own limits
