#!/usr/bin/env bash
# The split judge on one H200 (issues 24 and 25), from the repo root on the GPU machine, with
# KernelBench's problem files at $KB/level1, $KB/level3 and its adversarial kernels
# (src/kernelbench/unit_tests/test_kernels) at $KB/adv; results under $OUT. STEPS picks the parts:
#   tests  the judge's GPU tests (hostile ModelNew files, a BatchNorm reference) and the cuda backend's
#   adv    KernelBench's three adversarial kernels on level1/1, each built and judged
#   refs   full-size references as their own kernels (level1/19_ReLU timed end to end, 1, 33; level3 ones)
#   bench  evaluations a minute of one warm evaluator, in-judge (cuda kf_forward) and split (ModelNew)
set -u
KB=${KB:-kb_upstream}
OUT=${OUT:-out}
STEPS=${STEPS:-tests adv refs bench}
mkdir -p "$OUT" /tmp/refs
export KFRAY_CACHE=${KFRAY_CACHE:-/tmp/kfray-cache}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
verify() {   # task file, kernel file, tag
    /usr/bin/time -f "%e s wall" -o "$OUT/$3.time" timeout 420 \
        python -m kfray.cli verify "kernelbench:$1" "$2" > "$OUT/$3.txt" 2>&1
    echo "== $3: $(tail -1 "$OUT/$3.time")"; grep -E "^  (result|reason|speedup)" "$OUT/$3.txt" | cut -c1-400
}
case " $STEPS " in *" adv "*)
    for k in result_reuse_kernel zero_out_kernel non_default_stream_kernel; do
        verify "$KB/level1/1_Square_matrix_multiplication_.py" "$KB/adv/$k.py" "adv_$k" > "$OUT/adv_$k.summary" &
    done ;;
esac
case " $STEPS " in *" tests "*)
    timeout 240 python -m pytest -q -m gpu tests/test_judge_gpu.py -p no:cacheprovider 2>&1 | tail -15 ;;
esac
wait
cat "$OUT"/adv_*.summary 2>/dev/null
case " $STEPS " in *" refs "*)
    for p in level1/19_ReLU level1/33_BatchNorm level3/9_ResNet18 level3/41_GRUBidirectional; do
        n=$(basename "$p")
        sed -E 's/\bModel\b/ModelNew/g' "$KB/$p.py" > "/tmp/refs/${n}_new.py"
        verify "$KB/$p.py" "/tmp/refs/${n}_new.py" "ref_$n"
    done ;;
esac
case " $STEPS " in *" bench "*)
    timeout 100 python scripts/bench_judge.py --backend cuda --task axpb --n 40 2>&1 | tail -1
    timeout 120 python scripts/bench_judge.py --backend torch_ext_cuda --task "kernelbench:$KB/level1/19_ReLU.py" \
        --n 6 2>&1 | tail -1 ;;
esac
