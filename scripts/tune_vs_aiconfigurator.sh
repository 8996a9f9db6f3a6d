#!/bin/sh
# tune_vs_aiconfigurator.sh -- the three deployment cases of docs/simulator.md ("Deployment
# search against aiconfigurator"): `tandem tune --gpus N` on the table cost model (make tables:
# aiconfigurator's own per-operator database) and, when build/acenv has it, aiconfigurator's
# `cli default` on the same model, GPUs, ISL/OSL and SLO pair. Outputs under build/tune-cases/.
#
#   scripts/tune_vs_aiconfigurator.sh [CASE...]     CASE: 70b-h200 8b-h100 70b-h100 (default: all)
#
# aiconfigurator: python3 -m venv build/acenv && build/acenv/bin/pip install aiconfigurator
# (0.12.0; its model configs ship in aiconfigurator-core, so no Hugging Face access is needed).
set -eu
cd "$(dirname "$0")/.."
B=${BUILD:-build}
OUT=$B/tune-cases
mkdir -p "$OUT"
test -x "$B/tandem" || { echo "build $B/tandem first (make)" >&2; exit 1; }
make --no-print-directory tables >/dev/null || { echo "make tables failed" >&2; exit 1; }
JOBS=${JOBS:-2}

run_case() {
    name=$1 model=$2 achw=$3 hw=$4 gpus=$5 isl=$6 osl=$7 ttft=$8 tpot=$9 nreq=${10}
    acmodel=meta-llama/Meta-Llama-3.1-$(echo "$model" | sed 's/llama-3.1-//; s/b$/B/')
    echo "== $name: $model on $gpus $hw, ISL $isl, OSL $osl, TTFT <= $ttft ms, TPOT <= $tpot ms ($(uptime))"
    if [ -x "$B/acenv/bin/aiconfigurator" ]; then
        "$B/acenv/bin/aiconfigurator" cli default --model-path "$acmodel" --total-gpus "$gpus" \
            --system "$achw" --backend vllm --isl "$isl" --osl "$osl" --ttft "$ttft" --tpot "$tpot" \
            --save-dir "$OUT/ac-$name" --no-color >"$OUT/ac-$name.log" 2>&1 || echo "aiconfigurator failed: $OUT/ac-$name.log"
        sed -n '/Best Experiment Chosen/,/Request Latency/p' "$OUT/ac-$name.log"
    fi
    /usr/bin/time -f "wall %e s, user %U s" "$B/tandem" tune configs/vllm-default.json --gpus "$gpus" \
        --model "$model" --hw "$B/tables/$hw.json" --isl "$isl" --osl "$osl" --max-requests "$nreq" \
        --warmup $((nreq / 10)) --slo-ttft-ms "$ttft" --slo-tpot-ms "$tpot" --jobs "$JOBS" \
        --out "$OUT/$name-best.json" --json "$OUT/$name-points.json" >"$OUT/$name.out" 2>"$OUT/$name.err"
    tail -n 1 "$OUT/$name.err"
    sed -n '/^ranked/,$p' "$OUT/$name.out"
}

# aiconfigurator 0.12.0's pick of a case (its best agg: replicas, TP, the vLLM flags its
# generated command sets, its total concurrency) run by tandem sim in closed loop at that
# concurrency: the step prices of the two tools at the same operating point.
ac_pick() {
    name=$1 model=$2 hw=$3 n=$4 tp=$5 seqs=$6 tokens=$7 conc=$8 isl=$9 osl=${10} ttft=${11} tpot=${12} nreq=${13}
    printf '{"name": "aiconfigurator-%s", "scheduler": {"max_num_seqs": %s, "max_num_batched_tokens": %s},\n "deployment": {"mode": "colocated", "instances": %s, "tp": %s}}\n' \
        "$name" "$seqs" "$tokens" "$n" "$tp" >"$OUT/ac-$name-pick.json"
    echo "-- aiconfigurator's pick ($n x TP$tp, concurrency $conc) in tandem sim:"
    "$B/tandem" sim "$OUT/ac-$name-pick.json" --model "$model" --hw "$B/tables/$hw.json" --isl "$isl" \
        --osl "$osl" --concurrency "$conc" --max-requests "$nreq" --slo-ttft-ms "$ttft" --slo-tpot-ms "$tpot" \
        --quiet --json "$OUT/ac-$name-closed.json" | sed -n '3,11p'
}

CASES=${*:-70b-h200 8b-h100 70b-h100}
for c in $CASES; do
    case $c in
    70b-h200) run_case 70b-h200 llama-3.1-70b h200_sxm h200 8 4000 500 600 40 1000
              ac_pick 70b-h200 llama-3.1-70b h200 2 4 512 6012 80 4000 500 600 40 800 ;;
    8b-h100) run_case 8b-h100 llama-3.1-8b h100_sxm h100-sxm 8 1024 1024 300 20 2000
             ac_pick 8b-h100 llama-3.1-8b h100-sxm 8 1 512 3036 1152 1024 1024 300 20 6000
             ac_pick 8b-h100-tp2 llama-3.1-8b h100-sxm 4 2 512 3036 1152 1024 1024 300 20 6000 ;;
    70b-h100) run_case 70b-h100 llama-3.1-70b h100_sxm h100-sxm 8 8000 200 2000 50 600
              ac_pick 70b-h100 llama-3.1-70b h100-sxm 2 4 512 10012 24 8000 200 2000 50 600 ;;
    *) echo "unknown case $c" >&2; exit 2 ;;
    esac
done
