"""The plan table as a person reads it, on golden outputs for three requests: the legend names every abbreviation a
row shows, every row that beats the choice on a column says why it was not chosen, columns align and carry units.
Regenerate after a deliberate change with ``python tests/unit/test_plan_table.py`` and read the diff."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import bigtrain
from bigtrain.planner.explain import LEGEND

GOLDEN = Path(__file__).parent.parent / "golden"
REQUESTS = {
    "llama-3-8b-8xH100": dict(model="llama-3-8b", gpus=8, gpu="H100"),
    "llama-3-70b-2x24GB": dict(model="llama-3-70b", gpus=2, gpu_memory="24GB"),
    "llama-3-8b-128k-8xH100": dict(model="llama-3-8b", gpus=8, gpu="H100", seq_len=131072, global_batch_size=8),
}


def table(name: str) -> str:
    kwargs = dict(REQUESTS[name])
    result = bigtrain.plan(kwargs.pop("model"), **kwargs)
    text = result.explain()
    advice = result.what_would_fit()
    return text + (f"\n\nno plan fits: {advice}" if advice else "") + "\n"


@pytest.mark.parametrize("name", REQUESTS)
def test_the_table_is_the_golden_one(name):
    assert table(name) == (GOLDEN / f"{name}.txt").read_text()


@pytest.mark.parametrize("name", REQUESTS)
def test_every_abbreviation_shown_is_in_the_legend_and_every_row_that_beats_the_choice_says_why(name):
    text = (GOLDEN / f"{name}.txt").read_text()
    head, _, rest = text.partition("\nplan ")
    # a plan's row starts with its method or engine; the notes below the rows (near tie, offload, ...) do not
    rows = [
        line
        for line in rest.split("\n\n")[0].splitlines()[1:]
        if re.match(r"[* ] (ddp|fsdp2|deepspeed|lora|qlora) ", line)
    ]
    legend = text.split("legend (bigtrain plan --legend for all):\n")[1].split("\n\n")[0].splitlines()
    keys = {line.split()[0] for line in legend}
    for key, pattern, _ in LEGEND:
        if any(re.search(pattern, row.split("  ")[0]) for row in rows):
            assert key in keys, (key, name)
    if not rows:  # nothing fits: the rejected plans and the advice say why
        assert "no plan fits: Would fit with" in text
        return
    chosen = rows[0]
    assert chosen.startswith("* ")
    peak, step = float(chosen.split()[-5]), float(chosen.split()[-3])
    for row in rows[1:]:
        values = row[: len(chosen)].split()[-5:]
        other_peak, other_step = float(values[0]), float(values[2])
        if other_peak < peak or other_step < step:
            assert row[len(chosen) :].strip(), f"{row!r} beats the choice and gives no reason"
        assert len(row[: len(chosen)]) == len(chosen)  # aligned: every row's numbers end where the choice's do


def test_no_fit_advice_tries_adapters_before_more_gpus():
    result = bigtrain.plan("llama-3-70b", gpus=2, gpu="RTX4090")
    advice = result.what_would_fit()
    assert advice.startswith("Would fit with qlora adapters (method='qlora'"), advice
    assert advice.index("qlora") < advice.index("GPUs (gpus=")


if __name__ == "__main__":
    GOLDEN.mkdir(exist_ok=True)
    for request in REQUESTS:
        (GOLDEN / f"{request}.txt").write_text(table(request))
        print(f"wrote {GOLDEN / request}.txt", file=sys.stderr)
