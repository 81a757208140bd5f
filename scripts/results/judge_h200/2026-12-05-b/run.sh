#!/bin/bash
# How this session's H200 calls ran: bash scripts/results/judge_h200/2026-12-05-b/run.sh WHAT
# (on the device machine, from the repository root, after `source .gpubundle/activate`).
set -u
what=$1
KB=kb_full/KernelBench
RKB=kb_full/rkb
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$out/gpu_$what.txt" 2>&1
case $what in
  level1|level2|level3)
    n=${what#level}
    python scripts/reference_sweep.py --kernelbench $KB --levels $n --out "$out/$what.json" > "$out/$what.log" 2>&1
    tail -6 "$out/$what.log"
    if [ "$n" = 2 ]; then     # the device-memory tests: caches now emptied only when the device is short
      python -m pytest -q -m gpu tests/test_judge_gpu.py -k "memory" -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
      tail -3 "$out/gpu_tests.txt"
    fi
    if [ "$n" = 3 ]; then     # robust-kbench's slowest-looking forward references, judged again
      python scripts/reference_sweep.py --rkb $RKB --set eval.suite_time_budget_s=1 \
        --tasks task_11,task_97,task_85,task_24,task_41,task_23,task_74,task_96,task_84,task_52 \
        --out "$out/rkb_low.json" > "$out/rkb_low.log" 2>&1
      tail -6 "$out/rkb_low.log"
    fi ;;
esac
