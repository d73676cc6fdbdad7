#!/usr/bin/env bash
# The open goals judged in one device call each (run on the GPU machine from the repo root, after
# `source .gpu/env.sh`): a part's floors and its family benchmarks in the same call, then goal_table.py.
#   bash scripts/goal_pass.sh attention_indexer     # #9 and #10 (~230 s on an H100 / H200)
#   bash scripts/goal_pass.sh gemm_moe              # #12 (~300 s)
# Everything lands in $OUT/r and comes back as one $OUT/r.tgz (the device returns at most 8 files).
set -u
part=${1:?"usage: goal_pass.sh attention_indexer|gemm_moe"}
case $part in attention_indexer|gemm_moe) ;; *) echo "goal_pass.sh: unknown part '$part' (attention_indexer or gemm_moe)" >&2; exit 2 ;; esac
export DSV4_JIT_CACHE_DIR=${DSV4_JIT_CACHE_DIR:-/tmp/dcache} PYTHONUNBUFFERED=1
OUT=${OUT:-bench_out}
O=$OUT/r; mkdir -p "$O"
case $part in
  attention_indexer)
    dsv4-jit warmup --model deepseek-v4-flash --arch sm_90a --family indexer,attention -j 12 > "$O/warm.log" 2>&1 &
    W=$!
    timeout 200 python3 benchmarks/bench_floor.py --issues 9 10 --out "$O/bench_floor_9_10.json" > "$O/bench_floor_9_10.log" 2>&1
    echo "floor rc $?"; wait $W
    timeout 150 python3 benchmarks/indexer/bench_indexer.py --no-torch --out "$O/indexer.json" > "$O/indexer.log" 2>&1; echo "indexer rc $?"
    timeout 220 python3 benchmarks/attention/bench_attention.py --heads 64 16 --batch 8 64 --out "$O/attention.json" \
      > "$O/attention.log" 2>&1; echo "attention rc $?" ;;
  gemm_moe)
    ( dsv4-jit warmup --model deepseek-v4-flash --arch sm_90a --family gemm,moe -j 12 > "$O/warm_flash.log" 2>&1
      dsv4-jit warmup --model deepseek-v4-pro --arch sm_90a --family gemm,moe -j 12 --vllm-args -tp 8 \
        > "$O/warm_pro.log" 2>&1 ) &
    W=$!
    timeout 170 python3 benchmarks/bench_floor.py --issues 12 --out "$O/bench_floor_12.json" > "$O/bench_floor_12.log" 2>&1
    echo "floor rc $?"
    timeout 40 python3 benchmarks/bench_mma_peak.py --out "$O/mma_peak.json" > "$O/mma_peak.log" 2>&1; echo "peak rc $?"
    wait $W
    timeout 100 python3 benchmarks/gemm/bench_gemm.py --out "$O/gemm_flash.json" > "$O/gemm_flash.log" 2>&1; echo "gemm rc $?"
    timeout 80 python3 benchmarks/gemm/bench_gemm.py --model deepseek-v4-pro --tp 8 --out "$O/gemm_pro8.json" \
      > "$O/gemm_pro8.log" 2>&1; echo "gemm pro rc $?"
    timeout 100 python3 benchmarks/moe/bench_moe.py --tokens 1 8 64 --layers 8 --out "$O/moe_flash.json" \
      > "$O/moe_flash.log" 2>&1; echo "moe rc $?"
    timeout 70 python3 benchmarks/moe/bench_moe.py --model deepseek-v4-pro --tp 8 --tokens 1 8 64 --layers 8 \
      --out "$O/moe_pro8.json" > "$O/moe_pro8.log" 2>&1; echo "moe pro rc $?" ;;
esac
python3 benchmarks/goal_table.py "$O" 2>&1 | tee "$O/goal_table.log"
rc=${PIPESTATUS[0]}
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
exit "$rc"
