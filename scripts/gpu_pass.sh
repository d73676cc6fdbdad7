#!/usr/bin/env bash
# The GPU pass: two commands of at most 10 minutes each on one H100 / H200 with 16 cores, from the repo root:
#   bash scripts/gpu_pass.sh [cases]    every GPU test: each family's cases on the native sm_90a schedule and on the
#                                       SM120 schedule compiled for it, both models
#   bash scripts/gpu_pass.sh bench      the floors and each family's benchmark at the scoreboard's points, both
#                                       schedules; goals.json and RESULTS.md
#   bash scripts/gpu_pass.sh --list [cases|bench]   print each step, its time budget and commands; run nothing
# Each pass first compiles its own list in the background (scripts/gpu_pass_variants.py --pass cases|bench, derived on
# the CPU) into $DSV4_JIT_CACHE_DIR on all cores but two, and the GPU starts at once beside it.
# Steps (STEPS="..." runs only those; each budget is a hard timeout, B_<step>=S changes it):
#   env        GPU, driver, nvcc, Python and torch versions
#   compile    the pass's list, in the background; it ends inside the steps after it, which wait for it
#   tests      (cases) every GPU test with a few pytest-xdist workers taking turns on the GPU, beside the compile: the
#              cases run in the order the list compiles, and a test whose variant is still compiling waits for it off
#              its GPU turn; the worst errors go to gpu_cases.jsonl; then the variants compiled off the list (none
#              when the list is complete)
#   floors     (bench) beside the compile: the floors (bench_floor.py) and the MMA peaks (bench_mma_peak.py)
#   bench      (bench) once the compile has ended: the commands of gpu_pass_variants.py's BENCH_STEPS
#              (DSV4_JIT_BENCH_REP_MS=50), then the variants compiled off the list
#   scoreboard (bench) goal_table.py (goals.json) and results.py (RESULTS.md; CASES=path/gpu_cases.jsonl adds a cases
#              pass's results) from this pass's JSON
# FAMILIES="attention indexer" (bench): only those families' floors and benchmarks, into gpu_pass_bench (a re-run after
# changing a family; `results.py FULL_PASS_DIR THIS_DIR` judges them on this call's floors, the rest on the full pass's).
# Extra steps, for a call of their own (STEPS="container plugin"): container (BUNDLE=path: a bundle built with no GPU,
# imported and run with compiles forbidden, scripts/container_case.py; CONTAINER_ARGS adds families), plugin (the vLLM
# plugin on both models), warm_load and host (warm-start and host-overhead benchmarks), prefill (the MoE at prefill
# token counts, both models and schedules: STEPS="env compile floors bench prefill scoreboard" FAMILIES=moe; the
# bench list compiles its variants too).
# The GPU machine needs the toolchain (tilelang, nvcc) and, for the peer columns, .peers (scripts/fetch_peers.sh).
# $OUT gets gpu_pass.tgz (everything), summary.log and RESULTS.md: the device returns at most 8 files.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=run
PASS=cases
for arg in "$@"; do
  case "$arg" in
    --list|--dry-run) mode=list ;;
    cases|bench) PASS=$arg ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_pass.sh: unknown argument '$arg' (cases, bench, --list, --help)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-bench_out}
P=$OUT/gpu_pass_$PASS
if [ "$PASS" = cases ]; then STEPS=${STEPS:-"env compile tests"}; else STEPS=${STEPS:-"env compile floors bench scoreboard"}; fi
FAMILIES=${FAMILIES:-}
fam_args=(); [ -n "$FAMILIES" ] && fam_args=(--families $FAMILIES)
# bench_floor.py knows the scoreboard's families only
floor_fams=(); for f in $FAMILIES; do case "$f" in attention|indexer|gemm|moe) floor_fams+=("$f") ;; esac; done
floor_args=(); [ -n "$FAMILIES" ] && floor_args=(--families "${floor_fams[@]}")
J=${JOBS:-$(nproc)}
CJ=$(( J > 4 ? J - 2 : J ))        # compile workers: two cores stay with the GPU's work meanwhile
TJ=${TEST_JOBS:-4}                 # GPU test workers: they take turns on the GPU; more only wait
# time budgets in seconds; each pass's steps after the compile sum to under 600 s, with room for the call's setup
B_env=${B_env:-10} B_tests=${B_tests:-540} B_floors=${B_floors:-155} B_bench=${B_bench:-395} B_scoreboard=${B_scoreboard:-10}
if [ "$PASS" = cases ]; then B_compile=${B_compile:-420}; else B_compile=${B_compile:-200}; fi
B_container=${B_container:-300} B_plugin=${B_plugin:-200} B_warm_load=${B_warm_load:-60} B_host=${B_host:-60}
B_prefill=${B_prefill:-135}
export PYTHONUNBUFFERED=1 DSV4_JIT_CACHE_DIR=${DSV4_JIT_CACHE_DIR:-/tmp/dsv4-jit-cache} DSV4_JIT_BENCH_REP_MS=${DSV4_JIT_BENCH_REP_MS:-50}
status=0
t_pass=$SECONDS
t_start=$(date +%s)
compile_pid=

step() { case " $STEPS " in *" $1 "*) return 0;; *) return 1;; esac; }
# run LOG SECONDS CMD...: the command under its own timeout, its output in $P/LOG.log (and the summary on failure)
run() {
  local log=$1 limit=$2; shift 2
  if [ "$mode" = list ]; then printf '      %4ss  %s\n' "$limit" "$*"; return 0; fi
  local t0=$SECONDS
  timeout "$limit" "$@" > "$P/$log.log" 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "  $log: exit $rc after $((SECONDS - t0)) s$([ "$rc" -eq 124 ] && echo " (over its ${limit} s)"); last lines:"
    tail -5 "$P/$log.log" | sed 's/^/    /'
  else
    echo "  $log: ok ($((SECONDS - t0)) s)"
  fi
  return "$rc"
}
begin() {
  if [ "$mode" = list ]; then echo "$1 (budget $2 s)"; else echo "== $1 (budget $2 s, pass at $((SECONDS - t_pass)) s)"; fi
  t_step=$SECONDS
}
end() { [ "$mode" = list ] || echo "   $1 took $((SECONDS - t_step)) s"; }
# wait_compile: the background compile's end (its own status is its exit code)
wait_compile() {
  [ "$mode" = list ] || [ -z "$compile_pid" ] && return 0
  wait "$compile_pid" || status=1
  compile_pid=
  echo "   compile ended at $((SECONDS - t_pass)) s"
}
# bench_steps ARGS...: run each command gpu_pass_variants.py --bench-steps prints (ARGS: --families ..., --prefill)
bench_steps() {
  while read -r log budget cmd; do
    # shellcheck disable=SC2086  (the command's words: paths and flags, no spaces)
    run "$log" "$budget" $cmd
  done < <(python3 scripts/gpu_pass_variants.py --bench-steps "$P" "$@")
}
beyond() {
  run beyond_list 15 python3 scripts/gpu_pass_variants.py --beyond --pass "$PASS" --since "$t_start"
  [ "$mode" = list ] || sed 's/^/  /' "$P/beyond_list.log"
}

[ "$mode" = list ] || { rm -rf "$P"; mkdir -p "$P"; exec > >(tee "$OUT/summary.log") 2>&1; echo "GPU pass: $PASS"; }

if step env; then
  begin env "$B_env"
  run env "$B_env" bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
    nvcc --version | tail -1; nproc; python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__)"'
  # the vLLM peer columns need .peers (scripts/fetch_peers.sh, carried beside the bundle); without it they stay empty
  if [ "$mode" != list ]; then
    peers=$(ls -d .peers/vllm-* 2>/dev/null)
    if [ -n "$peers" ]; then echo "  peers: $peers"
    else echo "  peers: none (no .peers/vllm-*: the vLLM peer columns stay empty; bash scripts/fetch_peers.sh first)"; fi
  fi
  end env
fi

if step compile; then
  begin compile "$B_compile"
  # the pool starts no compile in the budget's last 40 s, so the ones running finish inside it
  cmd=(python3 scripts/gpu_pass_variants.py --pass "$PASS" -j "$CJ" --time-budget $((B_compile - 40))
       --json "$P/variants.json" "${fam_args[@]}")
  if [ "$mode" = list ]; then
    run compile "$B_compile" "${cmd[@]}"
  else
    run compile "$B_compile" "${cmd[@]}" &
    compile_pid=$!
    echo "   started in the background"
  fi
fi

if step tests; then
  begin tests "$B_tests"
  export DSV4_JIT_GPU_REPORT=$P/gpu_cases.jsonl
  xdist=(); python3 -c "import xdist" 2>/dev/null && xdist=(-n "$TJ")
  run gpu_tests $((B_tests - 30)) python3 -m pytest -q -m gpu -p no:cacheprovider "${xdist[@]}" --durations=30 tests
  wait_compile
  beyond
  end tests
fi

if step floors; then
  begin floors "$B_floors"
  if [ -z "$FAMILIES" ] || [ ${#floor_fams[@]} -gt 0 ]; then
    run bench_floor 130 python3 benchmarks/bench_floor.py --out "$P/bench_floor.json" "${floor_args[@]}"
  fi
  run mma_peak 25 python3 benchmarks/bench_mma_peak.py --out "$P/mma_peak.json"
  end floors
fi

if step bench; then
  begin bench "$B_bench"
  wait_compile
  bench_steps "${fam_args[@]}"
  beyond
  end bench
fi

if step prefill; then
  begin prefill "$B_prefill"
  wait_compile
  bench_steps --prefill
  end prefill
fi

if step scoreboard; then
  begin scoreboard "$B_scoreboard"
  run goal_table 5 python3 benchmarks/goal_table.py "$P"
  run results 5 python3 benchmarks/results.py "$P" ${CASES:+--cases "$CASES"} --out "$P/RESULTS.md"
  end scoreboard
fi

if step container; then
  begin container "$B_container"
  # shellcheck disable=SC2086
  run container_case "$B_container" python3 scripts/container_case.py "${BUNDLE:?container: set BUNDLE=path}" ${CONTAINER_ARGS:-}
  end container
fi

if step plugin; then
  begin plugin "$B_plugin"
  for model in deepseek-v4-flash deepseek-v4-pro; do
    run "plugin_check_$model" $((B_plugin / 2)) python3 scripts/gpu_engine_plugin_check.py --model "$model"
  done
  end plugin
fi

if step warm_load; then
  begin warm_load "$B_warm_load"
  run warm_load "$B_warm_load" python3 benchmarks/cache/bench_warm_load.py --repeat 5 --out "$P/warm_load.json"
  end warm_load
fi

if step host; then
  begin host "$B_host"
  run host_overhead "$B_host" python3 benchmarks/mhc/bench_host_overhead.py --out "$P/host_overhead.json"
  end host
fi

if [ "$mode" = list ]; then
  total=0; for s in $STEPS; do [ "$s" = compile ] && continue; b=B_$s; total=$((total + ${!b:-0})); done
  echo "total budget $total s (steps: $STEPS; compile runs in the background, inside the steps after it)"
  exit 0
fi
echo "pass took $((SECONDS - t_pass)) s; exit $status"
[ -f "$P/RESULTS.md" ] && cp "$P/RESULTS.md" "$OUT/RESULTS.md"
cp "$OUT/summary.log" "$P/summary.log"
tar czf "$OUT/gpu_pass_$PASS.tgz" -C "$OUT" "gpu_pass_$PASS" && rm -rf "$P"
exit $status
