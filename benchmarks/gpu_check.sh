#!/usr/bin/env bash
# The GPU check: one prepared run, a few minutes, on a machine with a CUDA GPU.
#
#   bash benchmarks/gpu_check.sh [OUTDIR]     (default $OUT, else /tmp/paracube-gpu-check)
#
# It runs this checkout with the machine's own torch (nothing is installed; PYTHONPATH is
# the checkout) and writes to OUTDIR: gpu_check.log (everything below), calibration.json
# (the measured CPU and GPU) and train_<recompute>.jsonl (each run's per-step metrics).
#  1. versions and clocks;
#  2. pytest -m cuda: the CUDA paths (NCCL groups, ZeRO with bf16, the allocator's peak,
#     the offloaded optimizer, the phase timer's device sync);
#  3. paracube calibrate: bf16 GEMMs at several shapes, fp32/TF32, causal SDPA forward and
#     backward, HBM bandwidth — beside the planner's datasheet model;
#  4. paracube train of GPT-3 1.3B on one GPU, bf16, ZeRO-0, at each recompute mode, with
#     --predict: the planner's step time (calibrated and datasheet) beside the measured
#     one, counted memory beside torch.cuda.max_memory_allocated; and once in fp32.
# Each part has its own time limit and the next runs whatever the last one did.
set -u
out=${1:-${OUT:-/tmp/paracube-gpu-check}}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export PARACUBE_CALIBRATION=$out/calibration.json
section() { printf '\n=== %s (%s)\n' "$*" "$(date +%T)"; }
{
    section versions
    $py -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA', torch.version.cuda, '| cuDNN', torch.backends.cudnn.version(), '|', torch.cuda.get_device_name(0))"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv

    section "pytest -m cuda"
    timeout 300 $py -m pytest -m cuda -q -p no:cacheprovider tests

    section "paracube calibrate"
    timeout 180 $py -m paracube calibrate

    for recompute in none selective full; do
        section "paracube train gpt3-1.3b, bf16, ZeRO-0, micro-batch 8 x 2048, recompute $recompute"
        timeout 240 $py -m paracube train --model gpt3-1.3b --micro-batch 8 --steps 12 \
            --precision bf16 --zero 0 --recompute "$recompute" --lr 3e-4 --no-progress \
            --predict --metrics "$out/train_$recompute.jsonl"
    done

    section "paracube train gpt3-1.3b, fp32 (CUDA cores, TF32 off), ZeRO-0, micro-batch 4 x 2048"
    timeout 180 $py -m paracube train --model gpt3-1.3b --micro-batch 4 --steps 6 \
        --precision fp32 --zero 0 --lr 3e-4 --no-progress --predict \
        --metrics "$out/train_fp32.jsonl"

    section "clocks after"
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
} 2>&1 | tee "$out/gpu_check.log"
