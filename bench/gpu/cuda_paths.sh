#!/usr/bin/env bash
# Every CUDA path of the trainer, run for real on one GPU (what CPU CI cannot reach): NCCL through torch's launcher,
# FSDP2 bf16, DDP bf16 autocast and fp16 loss scaling, parameter offload to the CPU, torch.compile, `plan: auto`
# from the detected GPU, checkpoint + resume, the planner's detection and simulation.
#   bash bench/gpu/cuda_paths.sh OUT_DIR
# Each run prints its key log lines; a failed run prints its log's end, the others still run; exit 1 if any failed.
set -uo pipefail
out=${1:-/tmp/cuda_paths}
mkdir -p "$out"
q=recipes/quickstart.yaml
failed=()
run() {  # name, then bigtrain arguments
  local name=$1; shift
  echo "=== $name: bigtrain $*"
  local start=$SECONDS
  if ! python3 -m bigtrain "$@" >"$out/$name.log" 2>&1; then
    tail -30 "$out/$name.log"; echo "FAILED: $name"; failed+=("$name"); return
  fi
  grep -E "done:|chose|resumed|error|plan " "$out/$name.log" | cut -c1-400 | tail -6
  echo "--- $name ok in $((SECONDS - start)) s"
}
run fsdp2-bf16-nccl train $q --nproc 1 --set train.steps=40 --set train.mixed_precision=bf16 \
  --set checkpoint.every=20 --set output_dir="$out/r1"
run fsdp2-bf16-resume train $q --nproc 1 --set train.steps=60 --set train.mixed_precision=bf16 \
  --set checkpoint.every=20 --set output_dir="$out/r1"
run ddp-bf16-autocast train $q --nproc 1 --set train.steps=30 --set train.mixed_precision=bf16 \
  --set parallel.backend=ddp --set parallel.zero_stage=0 --set output_dir="$out/r2"
run ddp-fp16-scaler train $q --nproc 1 --set train.steps=30 --set train.mixed_precision=fp16 \
  --set parallel.backend=ddp --set parallel.zero_stage=0 --set output_dir="$out/r3"
run fsdp2-fp16-scaler train $q --nproc 1 --set train.steps=30 --set train.mixed_precision=fp16 --set output_dir="$out/r4"
run fsdp2-offload train $q --nproc 1 --set train.steps=30 --set train.mixed_precision=bf16 \
  --set parallel.offload_params=true --set output_dir="$out/r5"
run fsdp2-compile-ac train $q --nproc 1 --set train.steps=30 --set train.mixed_precision=bf16 \
  --set train.compile=true --set parallel.activation_checkpointing=full --set output_dir="$out/r6"
run no-launcher train $q --set train.steps=20 --set output_dir="$out/r7"
run auto-plan train recipes/auto_quickstart.yaml --nproc 1 --set train.steps=30 --set output_dir="$out/r8"
run plan-detect plan --model qwen2.5-0.5b --seq-len 4096 --global-batch-size 64
echo "=== llama-3-8b on the detected GPU (exit 3 = nothing fits is an answer too)"
python3 -m bigtrain plan --model llama-3-8b --seq-len 4096 --global-batch-size 64 2>&1 | tail -25 || true
run plan-simulate plan --model qwen2.5-0.5b --seq-len 2048 --global-batch-size 16 --simulate
run export export-model "$out/r1" -o "$out/r1_hf"
if [ ${#failed[@]} -gt 0 ]; then echo "failed: ${failed[*]}"; exit 1; fi
echo "all CUDA paths ran"
