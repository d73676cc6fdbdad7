#!/usr/bin/env bash
# The whole GPU pass in one command of at most 10 minutes on one H100 / H200 with 16 cores, from the repo root:
#   bash scripts/gpu_pass.sh            run every step; logs, JSON and RESULTS.md land in $OUT/gpu_pass.tgz
#   bash scripts/gpu_pass.sh --list     print each step, its time budget and its commands; run nothing
# Steps (STEPS="compile tests" runs only those; each step's budget is a hard timeout, B_<step>=S changes it):
#   env        GPU, driver, nvcc, Python and torch versions
#   compile    in the background, every variant the GPU cases and the benchmarks load (scripts/gpu_pass_variants.py,
#              derived on the CPU: both schedules, both models), in parallel into $DSV4_JIT_CACHE_DIR on all cores
#              but two; its budget runs from its start, beside the next two steps
#   floors     meanwhile on the GPU: the floors (bench_floor.py) and the MMA peaks (bench_mma_peak.py)
#   tests      then, beside the compile, every GPU test (every family's cases on the native sm_90a schedule and on the
#              SM120 schedule compiled for it, both models) with a few pytest-xdist workers: the cases run in the
#              order the list compiles, and a test whose variant is still compiling waits for it off its GPU turn;
#              the cases' worst errors go to gpu_cases.jsonl. The step ends when the compile has; the log names the
#              variants compiled beyond the list (none when the list is complete)
#   bench      each family's benchmark at the scoreboard's points, both schedules (DSV4_JIT_BENCH_REP_MS=50): the
#              commands and points of scripts/gpu_pass_variants.py's BENCH_STEPS
#   scoreboard goal_table.py (goals.json) and results.py (RESULTS.md) from this pass's JSON
# Extra steps, for a call of their own (STEPS="container plugin"): container (BUNDLE=path: a bundle built with no GPU,
# imported and run with compiles forbidden, scripts/container_case.py; CONTAINER_ARGS adds families), plugin (the vLLM
# plugin on both models), warm_load and host (warm-start and host-overhead benchmarks).
# The GPU machine needs the toolchain (tilelang, nvcc) and, for the peer columns, .peers (scripts/fetch_peers.sh).
# $OUT gets gpu_pass.tgz (everything), summary.log and RESULTS.md: the device returns at most 8 files.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=run
case "${1:-}" in
  --list|--dry-run) mode=list ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  "") ;;
  *) echo "gpu_pass.sh: unknown argument '$1' (--list, --help)" >&2; exit 2 ;;
esac
OUT=${OUT:-bench_out}
P=$OUT/gpu_pass
STEPS=${STEPS:-"env compile floors tests bench scoreboard"}
J=${JOBS:-$(nproc)}
CJ=$(( J > 4 ? J - 2 : J ))        # compile workers: two cores stay with the GPU's work meanwhile
TJ=${TEST_JOBS:-4}                 # GPU test workers: they take turns on the GPU; more only wait
# time budgets in seconds. compile runs beside floors and tests and ends inside them; the others run one after
# another: env + floors + tests + bench + scoreboard = 555, which leaves a 600 s device call 45 s for its setup
B_env=${B_env:-10} B_compile=${B_compile:-320} B_floors=${B_floors:-130} B_tests=${B_tests:-190}
B_bench=${B_bench:-215} B_scoreboard=${B_scoreboard:-10}
B_container=${B_container:-300} B_plugin=${B_plugin:-200} B_warm_load=${B_warm_load:-60} B_host=${B_host:-60}
export PYTHONUNBUFFERED=1 DSV4_JIT_CACHE_DIR=${DSV4_JIT_CACHE_DIR:-/tmp/dsv4-jit-cache} DSV4_JIT_BENCH_REP_MS=${DSV4_JIT_BENCH_REP_MS:-50}
status=0
t_pass=$SECONDS

step() { case " $STEPS " in *" $1 "*) return 0;; *) return 1;; esac; }
# run LOG SECONDS CMD...: the command under its own timeout, its output in $P/LOG.log (and the summary on failure)
run() {
  local log=$1 limit=$2; shift 2
  if [ "$mode" = list ]; then printf '      %4ss  %s\n' "$limit" "$*"; return 0; fi
  timeout "$limit" "$@" > "$P/$log.log" 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "  $log: exit $rc$([ "$rc" -eq 124 ] && echo " (over its ${limit} s)"); last lines:"
    tail -5 "$P/$log.log" | sed 's/^/    /'
  else
    echo "  $log: ok"
  fi
  return "$rc"
}
begin() {
  if [ "$mode" = list ]; then echo "$1 (budget $2 s)"; else echo "== $1 (budget $2 s, pass at $((SECONDS - t_pass)) s)"; fi
  t_step=$SECONDS
}
end() { [ "$mode" = list ] || echo "   $1 took $((SECONDS - t_step)) s"; }
entries() { find "$DSV4_JIT_CACHE_DIR/v1/ac" -name '*.json' 2>/dev/null | wc -l; }

[ "$mode" = list ] || { rm -rf "$P"; mkdir -p "$P"; exec > >(tee "$OUT/summary.log") 2>&1; }

if step env; then
  begin env "$B_env"
  run env "$B_env" bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
    nvcc --version | tail -1; nproc; python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__)"'
  end env
fi

if step compile; then
  begin compile "$B_compile"
  # the pool starts no compile in the budget's last 40 s, so the ones running finish inside it
  if [ "$mode" = list ]; then
    run compile "$B_compile" python3 scripts/gpu_pass_variants.py -j "$CJ" --time-budget $((B_compile - 40)) --json "$P/variants.json"
  else
    run compile "$B_compile" python3 scripts/gpu_pass_variants.py -j "$CJ" --time-budget $((B_compile - 40)) \
      --json "$P/variants.json" &
    compile_pid=$!
    echo "   compile started in the background"
  fi
fi

if step floors; then
  begin floors "$B_floors"
  run bench_floor 110 python3 benchmarks/bench_floor.py --out "$P/bench_floor.json"
  run mma_peak 20 python3 benchmarks/bench_mma_peak.py --out "$P/mma_peak.json"
  end floors
fi

if step tests; then
  begin tests "$B_tests"
  export DSV4_JIT_GPU_REPORT=$P/gpu_cases.jsonl
  xdist=(); python3 -c "import xdist" 2>/dev/null && xdist=(-n "$TJ")
  run gpu_tests $((B_tests - 20)) python3 -m pytest -q -m gpu -p no:cacheprovider "${xdist[@]}" --durations=25 tests
  if [ "$mode" != list ] && [ -n "${compile_pid:-}" ]; then
    wait "$compile_pid" || status=1   # the background step's own status is its exit code
    echo "   compile ended at $((SECONDS - t_pass)) s"
  fi
  run beyond_list 20 python3 scripts/gpu_pass_variants.py --beyond
  [ "$mode" = list ] || sed 's/^/  /' "$P/beyond_list.log"
  end tests
fi

if step bench; then
  begin bench "$B_bench"
  while read -r log budget cmd; do
    # shellcheck disable=SC2086  (the command's words: paths and flags, no spaces)
    run "$log" "$budget" $cmd
  done < <(python3 scripts/gpu_pass_variants.py --bench-steps "$P")
  end bench
fi

if step scoreboard; then
  begin scoreboard "$B_scoreboard"
  run goal_table 5 python3 benchmarks/goal_table.py "$P"
  run results 5 python3 benchmarks/results.py "$P" --out "$P/RESULTS.md"
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
  echo "total budget $total s (steps: $STEPS; compile runs beside floors and tests)"
  exit 0
fi
echo "pass took $((SECONDS - t_pass)) s; exit $status"
[ -f "$P/RESULTS.md" ] && cp "$P/RESULTS.md" "$OUT/RESULTS.md"
cp "$OUT/summary.log" "$P/summary.log"
tar czf "$OUT/gpu_pass.tgz" -C "$OUT" gpu_pass && rm -rf "$P"
exit $status
