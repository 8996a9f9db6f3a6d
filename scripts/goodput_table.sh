#!/bin/sh
# goodput_table.sh -- the goodput table of docs/simulator.md: configs/slo-adaptive.json against
# the static grid (vllm-default; vllm mode with 512 and 2048 token budgets; decode-first with
# 20 and 50 ms TBT targets; all 256 sequences) on the three real traces, with
# `tandem ab --goodput` at TTFT <= 300 ms, TPOT <= 25 ms, 90% attainment.
#   scripts/goodput_table.sh [colocated|disagg|70b] [TRACE...]
# SLO_TTFT_MS / SLO_TPOT_MS (default 300 / 25) change the SLO pair, e.g. for a larger model.
# colocated: llama-3-8b on one h100-sxm; disagg: the configs/disagg-1p1d.json deployment (a
# prefill h100-sxm, a decode h200) with each config's scheduler in both pools; 70b: llama-3-70b at TP4 on h100-sxm. The hardware is
# the table cost model (build/tables/h100-sxm.json, `make tables`) when it exists, else the
# roofline. Generated configs go to build/goodput/. Several minutes per trace.
set -eu
cd "$(dirname "$0")/.."
SET=${1:-colocated}
[ $# -gt 0 ] && shift
SHARED=${SHARED:-../shared}
if [ $# -eq 0 ]; then
    set -- "$SHARED/traces/azure2023_code.csv" "$SHARED/traces/mooncake_fast25_conversation_trace.jsonl" \
        "$SHARED/traces/azure2023_conv.csv"
fi
TOOL=${TOOL:-build/tandem}
OUT=build/goodput/$SET
mkdir -p "$OUT"
HW=h100-sxm HW_DEC=h200
[ -f build/tables/h100-sxm.json ] && HW=build/tables/h100-sxm.json
[ -f build/tables/h200.json ] && HW_DEC=build/tables/h200.json
EXTRA=""
TTFT=${SLO_TTFT_MS:-300} TPOT=${SLO_TPOT_MS:-25}
[ "$SET" = 70b ] && EXTRA="--model llama-3-70b --tp 4"

# name|scheduler JSON
GRID='vllm-default|{"mode": "vllm", "max_num_batched_tokens": 8192, "max_num_seqs": 256, "enable_chunked_prefill": true, "enable_prefix_caching": true, "policy": "fcfs"}
vllm-512|{"mode": "vllm", "max_num_batched_tokens": 512, "max_num_seqs": 256}
vllm-2048|{"mode": "vllm", "max_num_batched_tokens": 2048, "max_num_seqs": 256}
df-tbt20|{"mode": "decode_first", "tbt_target_ms": 20, "max_num_batched_tokens": 8192, "max_num_seqs": 256}
df-tbt50|{"mode": "decode_first", "tbt_target_ms": 50, "max_num_batched_tokens": 8192, "max_num_seqs": 256}
slo-adaptive|'"$(python3 -c 'import json;print(json.dumps(json.load(open("configs/slo-adaptive.json"))["scheduler"]))')"

CONFIGS=""
echo "$GRID" | while IFS='|' read -r name sched; do
    if [ "$SET" = disagg ]; then
        # the disagg-1p1d deployment, the config's scheduler in both pools (the pools' own
        # budgets dropped: the config under test sets them)
        cat > "$OUT/$name.json" <<JSON
{"name": "$name", "scheduler": $sched,
 "deployment": {"mode": "disaggregated", "router": "kv_aware", "kv_gbps": 50, "kv_latency_ms": 0.5,
  "prefill": {"instances": 1, "hw": "$HW"}, "decode": {"instances": 1, "hw": "$HW_DEC"}}}
JSON
    else
        echo "{\"name\": \"$name\", \"scheduler\": $sched}" > "$OUT/$name.json"
    fi
done
for n in vllm-default vllm-512 vllm-2048 df-tbt20 df-tbt50 slo-adaptive; do CONFIGS="$CONFIGS $OUT/$n.json"; done

for t in "$@"; do
    echo "== $(basename "$t") ($SET, TTFT <= $TTFT ms, TPOT <= $TPOT ms)"
    # shellcheck disable=SC2086
    $TOOL ab $CONFIGS --trace "$t" --hw "$HW" $EXTRA --slo-ttft-ms "$TTFT" --slo-tpot-ms "$TPOT" \
        --goodput --goodput-target 0.9 --quiet | grep -E '^  (metric|goodput|best attainment|SLO attainment)'
done
