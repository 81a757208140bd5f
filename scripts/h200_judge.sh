#!/usr/bin/env bash
# The split judge on one H200 (issue 24), from the repo root on the GPU machine, with KernelBench's
# problem files at $KB/level1 and its adversarial kernels (src/kernelbench/unit_tests/test_kernels)
# at $KB/adv; results under $OUT:
#   - the judge's GPU tests (hostile ModelNew files, a BatchNorm reference) and the cuda backend's;
#   - KernelBench's three adversarial kernels on level1/1, each built and judged;
#   - full-size references as their own kernels: level1/19_ReLU (timed end to end), 1 and 33.
set -u
KB=${KB:-kb_upstream}
OUT=${OUT:-out}
mkdir -p "$OUT" /tmp/refs
export KFRAY_CACHE=${KFRAY_CACHE:-/tmp/kfray-cache}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
verify() {   # task file, kernel file, tag
    /usr/bin/time -f "%e s wall" -o "$OUT/$3.time" timeout 420 \
        python -m kfray.cli verify "kernelbench:$1" "$2" > "$OUT/$3.txt" 2>&1
    echo "== $3: $(cat "$OUT/$3.time")"; grep -iE "verdict|correct|reject|flag|speedup|tier|reason|error" "$OUT/$3.txt" | head -8
}
for k in result_reuse_kernel zero_out_kernel non_default_stream_kernel; do
    verify "$KB/level1/1_Square_matrix_multiplication_.py" "$KB/adv/$k.py" "adv_$k" > "$OUT/adv_$k.summary" &
done
timeout 300 python -m pytest -q -m gpu tests/test_judge_gpu.py tests/test_cuda_gpu.py 2>&1 | tail -30 \
    | tee "$OUT/gpu_tests.txt"
wait
cat "$OUT"/adv_*.summary
for p in 19_ReLU 1_Square_matrix_multiplication_ 33_BatchNorm; do
    sed -E 's/\bModel\b/ModelNew/g' "$KB/level1/$p.py" > "/tmp/refs/${p}_new.py"
    verify "$KB/level1/$p.py" "/tmp/refs/${p}_new.py" "ref_$p"
done
