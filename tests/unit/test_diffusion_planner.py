"""docs/diffusion.md's plan commands, as written: FLUX.1-dev trained fully fits 4 A100-80GB GPUs on FSDP2 (DeepSpeed
does not), and with LoRA one L40S; SD3.5-Large is planned with its own frozen parts; the presets are recorded
(known_configs.json), so planning them measures nothing."""

from __future__ import annotations

from helpers import docs_commands


def test_the_docs_commands_flux_fits_four_a100s_fully_and_one_l40s_with_lora(cli_in_process):
    full, lora, sd3, on_device = docs_commands("diffusion-plan")
    fits = cli_in_process(full.split()[1:])
    assert fits.returncode == 0, fits.stderr
    assert "* fsdp2 zero2 dp=4" in fits.stdout and "img/s/dev" in fits.stdout and "11.90B params" in fits.stdout
    assert "deepspeed zero2 dp=4 tp=1 pp=1 ac=none mb=1      needs 92.9 GiB" in fits.stdout
    # what the cache saves: ZeRO-2's 69.0 GiB peak plus the frozen parts' 9.3 GiB would leave no margin
    assert "fsdp2 zero2 dp=4 tp=1 pp=1 ac=none mb=1 rs=micro      69.0       77.4" in fits.stdout
    assert "frozen parts: T5-XXL 4.76B, CLIP-L 0.12B, VAE 0.08B params, placed by parallel.frozen_parts" in fits.stdout
    assert "frozen parts: cached: their outputs computed once into the data cache" in fits.stdout
    assert "device instead: 87.5 GiB (peak + margin) of 79.2 GiB, 0.587 s/step (+7.9%): does not fit" in fits.stdout
    # offloaded: T5-XXL's 9.5 GiB on the device while it encodes is below the step's activations
    assert "offloaded instead: 77.4 GiB (peak + margin) of 79.2 GiB, 1.208 s/step (+122.1%): fits" in fits.stdout
    adapted = cli_in_process(lora.split()[1:])
    assert adapted.returncode == 0, adapted.stderr
    assert "* lora ddp dp=1 tp=1 pp=1 ac=none mb=1                       30.1       34.6" in adapted.stdout
    assert "LoRA r=16: 26.15M trained" in adapted.stdout
    planned = cli_in_process(sd3.split()[1:])
    assert planned.returncode == 0, planned.stderr
    assert "sd3_transformer text-to-image" in planned.stdout and "8.06B params" in planned.stdout
    assert "frozen parts: T5-XXL 4.76B, CLIP-G 0.69B, CLIP-L 0.12B, VAE 0.08B params" in planned.stdout
    assert "* fsdp2 zero2 dp=4" in planned.stdout and "device instead: 61.2 GiB" in planned.stdout
    # the frozen parts pinned on every GPU: ZeRO-2 no longer fits, ZeRO-3 does
    pinned = cli_in_process(on_device.split()[1:])
    assert pinned.returncode == 0, pinned.stderr
    assert "* fsdp2 zero3 dp=4 tp=1 pp=1 ac=none mb=1 rs=micro frozen_parts=device      64.7       72.6" in pinned.stdout
    assert "cached instead: 62.5 GiB (peak + margin) of 79.2 GiB, 0.550 s/step (-7.2%): fits" in pinned.stdout
