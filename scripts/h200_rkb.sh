#!/usr/bin/env bash
# robust-kbench on one H200, as issue 14 measures it (run from the repo root on the GPU machine, with
# robust-kbench's files at $RKB, default .suites/rkb; results under $OUT):
#   scripts/h200_rkb.sh check   the suite-form GPU tests, then robust-kbench's four named published
#                               kernels the suite's way, with the torch.compile max-autotune column
#   scripts/h200_rkb.sh sweep   an offline kfray sweep over robust-kbench tasks, timed end to end
set -u
RKB=${RKB:-.suites/rkb}
OUT=${OUT:-out}
mkdir -p "$OUT"
export KFRAY_CACHE=${KFRAY_CACHE:-/tmp/kfray-cache}
case "${1:-}" in
check)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
    timeout 300 python -m pytest -q -m gpu tests/test_suite_gpu.py tests/test_cuda_edits.py tests/test_isolation.py \
        2>&1 | tail -25 | tee "$OUT/gpu_tests.txt"
    timeout 280 python scripts/bench_suites.py rkb --root "$RKB" --kernels four --workers 4 \
        --set eval.torch_compile=true --out "$OUT/rkb_four.json" 2>&1 | tail -30 | tee "$OUT/rkb_four.txt"
    ;;
sweep)
    # TASKS: name prefixes; LIMIT_S: stop proposing after this many seconds (the sweep then ends and
    # writes its tables); BUDGET: evaluations per task, shared (a task that runs dry gives the rest away)
    /usr/bin/time -v -o "$OUT/sweep_time.txt" timeout "${WALL_S:-560}" \
        python -m kfray.sweep "rkb:$RKB/tasks" --tasks "${TASKS:-layernorm,mnist,resnet,unet,task_1}" \
        --no-torch-compile --quiet --run-dir "$OUT/run" \
        --set eval.backend=torch_ext_cuda --set eval.evaluators=0 --set eval.compile_workers="${WORKERS:-14}" \
        --set search.budget="${BUDGET:-6}" --set search.time_limit_s="${LIMIT_S:-420}" \
        > "$OUT/sweep_stdout.txt" 2> "$OUT/sweep_stderr.txt"
    echo "rc=$?" >> "$OUT/sweep_time.txt"
    tail -60 "$OUT/sweep_stdout.txt"; grep -E "Elapsed|rc=" "$OUT/sweep_time.txt"; tail -5 "$OUT/sweep_stderr.txt"
    rm -rf "$OUT/run/cache" 2>/dev/null
    ;;
*)
    echo "usage: $0 check|sweep" >&2; exit 2 ;;
esac
