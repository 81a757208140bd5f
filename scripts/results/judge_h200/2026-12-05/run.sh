#!/bin/bash
# How this session's H200 calls ran: bash scripts/results/judge_h200/2026-12-05/run.sh WHAT
# (on the device machine, from the repository root, after `source .gpubundle/activate`).
set -u
what=$1
KB=kb_full/KernelBench
RKB=kb_full/rkb
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$out/gpu.txt" 2>&1
case $what in
  smoke)
    python -m pytest -q -m gpu tests/test_judge_gpu.py tests/test_suite_gpu.py -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
    tail -3 "$out/gpu_tests.txt"
    python scripts/reference_sweep.py --kernelbench $KB --levels 1,3 \
      --tasks 19_ReLU,23_Softmax,38_L1Norm,2_Standard,12_Matmul,54_conv,97_Scaled,9_ResNet18,35_LSTM,48_Mamba2ReturnY,43_MinGPT \
      --out "$out/smoke.json" > "$out/smoke.log" 2>&1
    tail -12 "$out/smoke.log"
    python scripts/reference_sweep.py --rkb $RKB --set eval.suite_time_budget_s=1 \
      --tasks task_11,task_97,task_85,task_24,task_41,task_23,task_74,task_96,task_84,task_52 \
      --out "$out/rkb_low.json" > "$out/rkb_low.log" 2>&1
    tail -8 "$out/rkb_low.log" ;;
  level1|level2|level3)
    n=${what#level}
    if [ "$n" = 1 ]; then       # three problems first: a judge that breaks on the GPU stops here
      python scripts/reference_sweep.py --kernelbench $KB --levels 1 --tasks 19_ReLU,2_Standard,23_Softmax \
        --out "$out/first3.json" > "$out/first3.log" 2>&1 || { tail -20 "$out/first3.log"; exit 1; }
      tail -4 "$out/first3.log"
    fi
    python scripts/reference_sweep.py --kernelbench $KB --levels $n --out "$out/$what.json" > "$out/$what.log" 2>&1
    tail -8 "$out/$what.log"
    if [ "$n" = 3 ]; then
      python scripts/reference_sweep.py --rkb $RKB --set eval.suite_time_budget_s=1 \
        --tasks task_11,task_97,task_85,task_24,task_41,task_23,task_74,task_96,task_84,task_52 \
        --out "$out/rkb_low.json" > "$out/rkb_low.log" 2>&1
      tail -6 "$out/rkb_low.log"
    fi ;;
  subset)    # level 1's first 40 problems: the spares forked a job ahead, against level1.json's rows
    python scripts/reference_sweep.py --kernelbench $KB --levels 1 --tasks $(seq -s, -f '%g_' 1 40) \
      --out "$out/level1_first40.json" > "$out/level1_first40.log" 2>&1
    tail -5 "$out/level1_first40.log" ;;
  tests)
    python -m pytest -q -m gpu tests/test_judge_gpu.py tests/test_suite_gpu.py -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
    tail -5 "$out/gpu_tests.txt" ;;
  rkb)
    python scripts/reference_sweep.py --rkb $RKB --set eval.suite_time_budget_s=1 --tasks "${2:-}" \
      --out "$out/rkb.json" > "$out/rkb.log" 2>&1
    tail -8 "$out/rkb.log" ;;
esac
