#!/bin/bash
# This session's device calls: bash scripts/results/judge_h200/2026-12-05-c/run.sh WHAT
# (on the device machine, from the repository root, after `source .gpubundle/activate`).
#   level1   the level-1 reference sweep under py-spy (non-blocking samples: where the judge's time goes)
#   level2   the level-2 sweep, then robust-kbench's tasks whose reference kfray flagged, then the GPU memory tests
#   level3   the level-3 sweep
#   quick    one short call where device time is short: four level-1 problems of up to 8 GiB a side (the
#            copies skipped), one level-2 problem, robust-kbench's four flagged tasks, the memory tests
set -u
what=$1
KB=kb_full/KernelBench
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$out/gpu_$what.txt" 2>&1
sweep() { python scripts/reference_sweep.py --kernelbench $KB --levels "$1" --out "$out/level$1.json"; }
case $what in
  level1)
    pip install -q --no-index .gpubundle/whl/py_spy-*.whl > /dev/null 2>&1
    py-spy record --nonblocking --subprocesses -r 40 -f raw -o "$out/level1.prof" -- \
      python scripts/reference_sweep.py --kernelbench $KB --levels 1 --out "$out/level1.json" > "$out/level1.log" 2>&1
    tail -5 "$out/level1.log" ;;
  level2)
    sweep 2 > "$out/level2.log" 2>&1; tail -5 "$out/level2.log"
    python scripts/reference_sweep.py --rkb kb_full/rkb --set eval.suite_time_budget_s=1 \
      --tasks task_11,task_23,task_97,task_85 --out "$out/rkb_flagged.json" > "$out/rkb_flagged.log" 2>&1
    tail -4 "$out/rkb_flagged.log"
    python -m pytest -q -m gpu tests/test_judge_gpu.py -k "memory" -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
    tail -3 "$out/gpu_tests.txt" ;;
  level3)
    sweep 3 > "$out/level3.log" 2>&1; tail -5 "$out/level3.log" ;;
  tiny)          # the quick call's first two parts only, where less than 300 s is left
    python scripts/reference_sweep.py --kernelbench $KB --levels 1 --tasks 38_L1Norm,39_L2Norm,19_ReLU,23_Softmax --out "$out/q1.json" > "$out/q1.log" 2>&1
    tail -4 "$out/q1.log"
    python scripts/reference_sweep.py --rkb kb_full/rkb --set eval.suite_time_budget_s=1 \
      --tasks task_11,task_23,task_97,task_85 --out "$out/rkb_flagged.json" > "$out/rkb_flagged.log" 2>&1
    tail -4 "$out/rkb_flagged.log" ;;
  quick)
    python scripts/reference_sweep.py --kernelbench $KB --levels 1 --tasks 38_L1Norm,39_L2Norm,19_ReLU,23_Softmax --out "$out/q1.json" > "$out/q1.log" 2>&1
    tail -4 "$out/q1.log"
    python scripts/reference_sweep.py --kernelbench $KB --levels 2 --tasks 40_Matmul_Scaling --out "$out/q2.json" > "$out/q2.log" 2>&1
    tail -4 "$out/q2.log"
    python scripts/reference_sweep.py --rkb kb_full/rkb --set eval.suite_time_budget_s=1 \
      --tasks task_11,task_23,task_97,task_85 --out "$out/rkb_flagged.json" > "$out/rkb_flagged.log" 2>&1
    tail -4 "$out/rkb_flagged.log"
    python -m pytest -q -m gpu tests/test_judge_gpu.py -k "memory" -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
    tail -3 "$out/gpu_tests.txt" ;;
esac
