#!/usr/bin/env bash
# gpu-check.sh -- the one device check of Tandem, for a machine with an NVIDIA GPU (sm_90).
#
#   scripts/gpu-check.sh [--build-only] [--quick]
#
# 1. Builds for sm_90: `make HAVE_CUDA=1 NVCC_GENCODE=sm_90 all kv-check`; when the full build
#    cannot run there (e.g. ZeroMQ/msgpack/jansson headers missing on a bare GPU image), it
#    builds the kernels part alone into build/gpu/ (libtandem.so from common/ + kernels/,
#    libtandem_cuda.so, kv_check, a `tandem profile` driver) -- that needs only cc and nvcc.
# 2. build/kv_check: pack/unpack throughput on the CPU vs memcpy; every CUDA kernel against
#    the CPU implementation on fresh random data (outputs poisoned, every byte compared);
#    pack and unpack timed against cudaMemcpy device-to-device in the same run.
# 2b. build/nixl_vram_check (full build only): both KV caches in VRAM, registered with NIXL,
#    64 MiB READ between two processes, direct and staged (HND receiver), every byte
#    compared, against cudaMemcpy D2D; needs the nixl-cu12 wheel (TANDEM_NIXL_DIR, or
#    build/venv-nixl, installed by `make test-nixl` when PyPI is reachable), else it is
#    reported as skipped, not failed. A few seconds.
# 3. `tandem profile --model llama-3-8b --out build/hw-profile.json` (cuBLAS roofline).
# 4. Prints a short table last. Exit: 0 ok, 1 a check failed, 3 no GPU, 2 usage.
# With --build-only it stops after step 1 (works without a GPU). Copies its logs and the
# profile JSON to $OUT when that is set (the device tool's output folder).
set -uo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
build_only=0
quick=
for a in "$@"; do
  case $a in
    --build-only) build_only=1 ;;
    --quick) quick=--quick ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown option $a" >&2; exit 2 ;;
  esac
done

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$PATH:$CUDA_HOME/bin"
export LD_LIBRARY_PATH="$CUDA_HOME/lib64:$CUDA_HOME/lib:${LD_LIBRARY_PATH:-}"
GENCODE="-gencode=arch=compute_90,code=sm_90"
JOBS=$(nproc 2>/dev/null || echo 2)
LOG=build/gpu-check.log
mkdir -p build
: > "$LOG"

if ! command -v nvcc >/dev/null 2>&1; then
  echo "gpu-check: nvcc not found (CUDA_HOME=$CUDA_HOME): cannot build the CUDA kernels" >&2
  exit 1
fi

# ---- 1. build ----------------------------------------------------------------------------
echo "== build (sm_90)"
mode=full
rm -f build/obj/kernels/*.cu.o build/libtandem_cuda.so   # rebuilt for the sm_90 gencode
if make -j"$JOBS" HAVE_CUDA=1 NVCC_GENCODE="$GENCODE" all kv-check nixl-vram-check >>"$LOG" 2>&1; then
  KV_CHECK=build/kv_check
  TANDEM="build/tandem"
  echo "   make: ok (build/libtandem.so, build/libtandem_cuda.so, build/tandem, build/kv_check)"
else
  mode=standalone
  echo "   make failed (last lines below); building the kernels part alone into build/gpu/"
  tail -n 5 "$LOG" | sed 's/^/   | /'
  G=build/gpu
  mkdir -p "$G"
  CFLAGS_K="-std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Iinclude -Icommon -fPIC -fvisibility=hidden"
  ok=1
  cc $CFLAGS_K -shared -Wl,--version-script=tandem.map -o "$G/libtandem.so" \
     common/alloc.c common/version.c kernels/*.c -ldl -lpthread -lm >>"$LOG" 2>&1 || ok=0
  if [ $ok = 1 ]; then
    nvcc -O3 -std=c++17 $GENCODE -Xcompiler -fPIC,-fvisibility=hidden -Iinclude -Icommon \
      -shared -o "$G/libtandem_cuda.so" kernels/*.cu -lcudart -lcublas >>"$LOG" 2>&1 || ok=0
  fi
  if [ $ok = 1 ]; then
    cc -std=c11 -D_GNU_SOURCE -O2 -Iinclude -Itests/unit/kernels -o "$G/kv_check" \
       tests/unit/kernels/kv_check.c -L"$G" -ltandem -Wl,-rpath,'$ORIGIN' -lm >>"$LOG" 2>&1 || ok=0
  fi
  if [ $ok = 1 ]; then
    printf 'int tdm_cmd_profile(int, char **);\nint main(int c, char **v) { return tdm_cmd_profile(c, v); }\n' \
      > "$G/profile_main.c"
    cc -std=c11 -D_GNU_SOURCE -O2 -Iinclude -Itools -o "$G/tandem-profile" "$G/profile_main.c" \
       tools/cmd_profile.c -L"$G" -ltandem -Wl,-rpath,'$ORIGIN' >>"$LOG" 2>&1 || ok=0
  fi
  if [ $ok = 0 ]; then
    echo "gpu-check: the standalone build failed too; see $LOG" >&2
    tail -n 20 "$LOG" >&2
    exit 1
  fi
  KV_CHECK="$G/kv_check"
  TANDEM="$G/tandem-profile"
  echo "   standalone: ok ($G/libtandem.so, libtandem_cuda.so, kv_check, tandem-profile)"
fi

if [ $build_only = 1 ]; then
  echo "gpu-check: built ($mode build); --build-only: not running anything"
  exit 0
fi

# ---- GPU present? --------------------------------------------------------------------------
probe=$("$KV_CHECK" --probe 2>&1); prc=$?
if [ $prc -ne 0 ]; then
  echo "gpu-check: no usable CUDA GPU found: $probe"
  echo "gpu-check: everything is built; run this script on a machine with an NVIDIA GPU"
  exit 3
fi
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/   gpu: /'

# ---- 2. kernels: correctness and timing -----------------------------------------------------
echo "== kv_check (CPU vs memcpy; CUDA kernels vs CPU; CUDA vs cudaMemcpy D2D)"
"$KV_CHECK" $quick > build/kv-check.out 2>&1; krc=$?
grep -E "^(FAIL|gpu correctness|kv_check)" build/kv-check.out | head -40

# ---- 2b. NIXL with both caches in VRAM --------------------------------------------------------
echo "== nixl_vram_check (VRAM registration, direct and staged READs, vs cudaMemcpy D2D)"
nrc=0
if [ "$mode" = full ] && [ -x build/nixl_vram_check ]; then
  [ -n "${TANDEM_NIXL_DIR:-}" ] || timeout 120 make --no-print-directory build/venv-nixl/.state >>"$LOG" 2>&1
  TANDEM_BUILD=build timeout 120 build/nixl_vram_check > build/nixl-vram.out 2>&1; nrc=$?
  tail -n 3 build/nixl-vram.out | sed 's/^/   /'
  [ $nrc -eq 3 ] && nrc=0   # no NIXL here: reported, not a failure
else
  echo "   skipped: not built ($mode build)" | tee build/nixl-vram.out
fi

# ---- 3. profile ----------------------------------------------------------------------------
echo "== tandem profile --model llama-3-8b"
prc=0
if [ "$mode" = full ]; then
  "$TANDEM" profile --model llama-3-8b --out build/hw-profile.json 2>&1 | tail -n 3; prc=${PIPESTATUS[0]}
else
  "$TANDEM" --model llama-3-8b --out build/hw-profile.json 2>&1 | tail -n 3; prc=${PIPESTATUS[0]}
fi

if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  cp build/kv-check.out build/nixl-vram.out "$LOG" "$OUT"/ 2>/dev/null
  [ -f build/hw-profile.json ] && cp build/hw-profile.json "$OUT"/
fi

# ---- 4. the table ----------------------------------------------------------------------------
echo
echo "== summary ($mode build, $(( $(date +%s) - t_start )) s)"
sed -n '/^kv copy (baseline/,/^$/p' build/kv-check.out
if [ $prc -eq 0 ] && [ -f build/hw-profile.json ]; then
  if command -v python3 >/dev/null 2>&1; then
    python3 - build/hw-profile.json <<'PY'
import json, sys
h = json.load(open(sys.argv[1])); m = h["measured"]
print("%-32s %s" % ("profile", h["name"]))
print("%-32s %.1f TFLOP/s (square 8192: %.1f)" % ("  peak bf16 GEMM", h["peak_tflops"], m["square_gemm_tflops"]))
print("%-32s %.0f GB/s read, memcpy D2D %.0f GB/s" % ("  HBM", h["hbm_gbps"], m["memcpy_d2d_gbps"]))
print("%-32s %.0f GB/s" % ("  attention KV read", m["attn_kv_gbps"]))
print("%-32s %.2f us (launch only %.2f us)" % ("  step overhead", h["step_overhead_us"], m["launch_us"]))
for ph, key in (("prefill", "tokens"), ("decode", "batch")):
    rows = m[ph]
    if not rows: continue
    big = max(r[key] for r in rows); small = min(r[key] for r in rows)
    for r in rows:
        if r[key] in (small, big):
            print("  %-7s %-7s %s=%-5d %9.1f us %8.1f TFLOP/s %7.0f GB/s" % (ph, r["op"], key, r[key], r["us"], r["tflops"], r["gbps"]))
PY
  else
    grep -o '"peak_tflops": [0-9.e+]*\|"hbm_gbps": [0-9.e+]*\|"step_overhead_us": [0-9.e+]*' build/hw-profile.json
  fi
else
  echo "profile: failed (exit $prc)"
fi
echo "kernels: $(tail -n 1 build/kv-check.out)"
echo "nixl vram: $(tail -n 1 build/nixl-vram.out)"
[ $krc -eq 0 ] && [ $prc -eq 0 ] && [ $nrc -eq 0 ] && exit 0
exit 1
