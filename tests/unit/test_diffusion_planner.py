"""docs/diffusion.md's plan commands, as written: FLUX.1-dev trained fully fits 4 A100-80GB GPUs on FSDP2 (DeepSpeed
does not), and with LoRA one L40S; SD3.5-Large is planned with its own frozen parts; the presets are recorded
(known_configs.json), so planning them measures nothing."""

from __future__ import annotations

from helpers import docs_commands


def test_the_docs_commands_flux_fits_four_a100s_fully_and_one_l40s_with_lora(cli_in_process):
    full, lora, sd3 = docs_commands("diffusion-plan")
    fits = cli_in_process(full.split()[1:])
    assert fits.returncode == 0, fits.stderr
    assert "* fsdp2 zero2 dp=4" in fits.stdout and "img/s/dev" in fits.stdout and "11.90B params" in fits.stdout
    assert "deepspeed zero2 dp=4 tp=1 pp=1 ac=none mb=1      needs 92.9 GiB" in fits.stdout
    # what the cache saves: ZeRO-2's 69.0 GiB peak plus the frozen parts' 9.3 GiB would leave no margin
    assert "fsdp2 zero2 dp=4 tp=1 pp=1 ac=none mb=1 rs=micro      69.0       77.4" in fits.stdout
    assert "they would add 9.3 GiB to every plan's peak" in fits.stdout
    said = " ".join(fits.stdout.split())  # the note under the table, as one line
    assert "this plan would need 87.5 GiB (peak + margin) of 79.2 GiB: it fits because their outputs are cached" in said
    adapted = cli_in_process(lora.split()[1:])
    assert adapted.returncode == 0, adapted.stderr
    assert "* lora ddp dp=1 tp=1 pp=1 ac=none mb=1                       30.1       34.6" in adapted.stdout
    assert "LoRA r=16: 26.15M trained" in adapted.stdout
    planned = cli_in_process(sd3.split()[1:])
    assert planned.returncode == 0, planned.stderr
    assert "sd3_transformer text-to-image" in planned.stdout and "8.06B params" in planned.stdout
    assert "(T5-XXL 4.76B, CLIP-G 0.69B, CLIP-L 0.12B, VAE 0.08B params)" in planned.stdout
    assert "they would add 10.6 GiB" in planned.stdout and "* fsdp2 zero2 dp=4" in planned.stdout
