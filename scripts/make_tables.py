#!/usr/bin/env python3
"""make_tables.py -- convert measured per-operator profiles into the compact table format of
the table cost model (docs/cost_model.md) and write one hardware JSON per GPU.

Sources:
  aiconfigurator's per-operator database (the aiconfigurator-core wheel, Apache-2.0):
    systems/data/<gpu>/{gemm,attention,comm}/vllm/<version>/*.parquet (read with pyarrow)
    -> gemm, attn_context, attn_generation, allreduce
  Vidur's per-operator profiles (../shared/profiles/vidur/*_mlp.csv, MIT)
    -> elementwise (norms, activation, rope, add of one layer) for the A100 and the H100, and
       per profiled model a set vidur-<gpu>-<model> whose GEMM and element-wise tables are
       Vidur's (2023 PyTorch kernels; the model's shapes only), the rest aiconfigurator's

usage: make_tables.py --wheel WHEEL.whl --shared ../shared --out build/tables
The outputs are build artefacts: never commit them.
"""
import argparse
import collections
import csv
import io
import json
import os
import sys
import zipfile

# tandem hardware preset -> (aiconfigurator system, vLLM database version, Vidur file prefix,
# roofline numbers of the preset that the JSON keeps for memory sizing and fallbacks)
HW = {
    "a100-80g": ("a100_sxm", "0.14.0", "a100", dict(peak_tflops=312, hbm_gbps=2039, eff_compute=0.70,
                  eff_memory=0.75, interconnect_gbps=300, mem_gib=80, peak_fp8_tflops=0)),
    "h100-sxm": ("h100_sxm", "0.24.0", "h100", dict(peak_tflops=989, hbm_gbps=3350, eff_compute=0.74,
                  eff_memory=0.78, interconnect_gbps=450, mem_gib=80, peak_fp8_tflops=1979)),
    "h200": ("h200_sxm", "0.24.0", None, dict(peak_tflops=989, hbm_gbps=4800, eff_compute=0.74,
              eff_memory=0.78, interconnect_gbps=450, mem_gib=141, peak_fp8_tflops=1979)),
}
KEYS = {
    "gemm": ["m", "n", "k"],
    "attn_context": ["batch", "isl", "heads", "kv_heads", "head_dim"],
    "attn_generation": ["batch", "ctx", "heads", "kv_heads", "head_dim"],
    "allreduce": ["tp", "bytes"],
    "elementwise": ["tokens", "width"],
}
# Per-step host overhead the JSONs carry (us): the modern-stack value of the presets (H100/
# H200); `make calibrate` reports the value fitted to each measured stack.
OVERHEAD_US = {"a100-80g": 2500, "h100-sxm": 1000, "h200": 1000}


def write_table(path, op, rows, source):
    """rows: {(dtype, key...): us}"""
    with open(path, "w") as f:
        f.write(f"# {source}\ntandem-table 1\nop {op}\ncolumns dtype {' '.join(KEYS[op])} us\n")
        for key in sorted(rows):
            f.write(" ".join([key[0]] + [f"{v:g}" for v in key[1:]]) + f" {rows[key]:.6g}\n")
    return len(rows)


def parquet(zf, member):
    import pyarrow.parquet as pq
    return pq.read_table(io.BytesIO(zf.read(member))).to_pylist()


def keep_min(rows, key, us):
    if us > 0 and (key not in rows or us < rows[key]):
        rows[key] = us


def from_aiconfigurator(zf, system, version):
    base = f"aiconfigurator_core/systems/data/{system}"
    out = {}
    g = {}
    for r in parquet(zf, f"{base}/gemm/vllm/{version}/gemm_perf.parquet"):
        dt = {"bfloat16": "bf16", "fp8": "fp8"}.get(r["gemm_dtype"])
        if dt:  # per-tensor fp8 only (fp8_block is a different recipe)
            keep_min(g, (dt, r["m"], r["n"], r["k"]), r["latency"] * 1e3)
    out["gemm"] = g
    for fname, op, ctx in (("context_attention_perf", "attn_context", 0),
                           ("generation_attention_perf", "attn_generation", 1)):
        a = {}
        for r in parquet(zf, f"{base}/attention/vllm/{version}/{fname}.parquet"):
            if r.get("window_size", 0) or r.get("beam_width", 1) != 1:
                continue
            dt = {"bfloat16": "bf16", "fp8": "fp8"}.get(r["kv_cache_dtype"])
            if not dt:
                continue
            # generation rows: "step" tokens already in the cache plus the new one
            s = r["step"] + 1 if ctx else r["isl"]
            keep_min(a, (dt, r["batch_size"], s, r["num_heads"], r["num_key_value_heads"],
                         r["head_dim"]), r["latency"] * 1e3)
        out[op] = a
    ar = {}
    for r in parquet(zf, f"{base}/comm/vllm/{version}/custom_allreduce_perf.parquet"):
        if r["allreduce_dtype"] != "bfloat16" or "graph" not in r["kernel_source"]:
            continue
        # message_size counts elements (bf16: 2 bytes each)
        keep_min(ar, ("bf16", r["num_gpus"], r["message_size"] * 2), r["latency"] * 1e3)
    out["allreduce"] = ar
    return out


EW_OPS = ["input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add"]


def vidur_elementwise(shared, prefix):
    acc = collections.defaultdict(list)
    names = sorted(n for n in os.listdir(f"{shared}/profiles/vidur")
                   if n.startswith(prefix + "_") and n.endswith("_mlp.csv"))
    for n in names:
        with open(f"{shared}/profiles/vidur/{n}") as f:
            for r in csv.DictReader(f):
                tp = int(r["num_tensor_parallel_workers"])
                us = sum(float(r[f"time_stats.{o}.median"]) for o in EW_OPS) * 1e3
                # width: activation elements per token that the ops stream (hidden + ffn/tp)
                key = ("bf16", int(r["num_tokens"]), int(r["n_embd"]) + int(r["n_expanded_embd"]) // tp)
                acc[key].append(us)
    return {k: sum(v) / len(v) for k, v in acc.items()}, names


VIDUR_GEMMS = ["attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"]


def vidur_gemms(path):
    """Vidur's four projections of one layer as GEMM rows (bf16, m = tokens, us)."""
    acc = collections.defaultdict(list)
    with open(path) as f:
        for r in csv.DictReader(f):
            tp = int(r["num_tensor_parallel_workers"])
            h, heads, kvh = int(r["n_embd"]), int(r["n_head"]), int(r["n_kv_head"])
            ffn, hd, m = int(r["n_expanded_embd"]), int(r["n_embd"]) // int(r["n_head"]), int(r["num_tokens"])
            nk = [((heads + 2 * kvh) * hd // tp, h), (h, heads * hd // tp), (2 * ffn // tp, h), (h, ffn // tp)]
            for op, (n, k) in zip(VIDUR_GEMMS, nk):
                acc[("bf16", m, n, k)].append(float(r[f"time_stats.{op}.median"]) * 1e3)
    return {k: sum(v) / len(v) for k, v in acc.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--shared", default=None)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    zf = zipfile.ZipFile(a.wheel)
    wheel = os.path.basename(a.wheel)
    for hw, (system, version, vprefix, roof) in HW.items():
        d = os.path.join(a.out, hw)
        os.makedirs(d, exist_ok=True)
        tables = from_aiconfigurator(zf, system, version)
        counts = {}
        paths = {}
        for op, rows in tables.items():
            counts[op] = write_table(f"{d}/{op}.txt", op, rows,
                                     f"aiconfigurator {wheel} {system} vllm {version}")
            paths[op] = f"{hw}/{op}.txt"
        if vprefix and a.shared and os.path.isdir(f"{a.shared}/profiles/vidur"):
            rows, names = vidur_elementwise(a.shared, vprefix)
            if rows:
                counts["elementwise"] = write_table(f"{d}/elementwise.txt", "elementwise", rows,
                                                    "vidur " + " ".join(names))
                paths["elementwise"] = f"{hw}/elementwise.txt"
        j = dict(name=f"{hw}-table", cost_model="table", tables=paths,
                 step_overhead_us=OVERHEAD_US[hw], **roof)
        j["source"] = f"aiconfigurator {system} vllm {version}" + (f" + vidur {vprefix}" if "elementwise" in paths else "")
        with open(os.path.join(a.out, f"{hw}.json"), "w") as f:
            json.dump(j, f, indent=2)
            f.write("\n")
        print(f"tables {hw}: " + ", ".join(f"{k} {v} rows" for k, v in counts.items()))
        # Vidur's own GEMMs for the models it profiled on this GPU
        if not (vprefix and a.shared and os.path.isdir(f"{a.shared}/profiles/vidur")):
            continue
        for n in sorted(os.listdir(f"{a.shared}/profiles/vidur")):
            if not (n.startswith(vprefix + "_") and n.endswith("_mlp.csv")):
                continue
            name = f"vidur-{hw}-{n[len(vprefix) + 1:-len('_mlp.csv')].replace('_', '-')}"
            vd = os.path.join(a.out, name)
            os.makedirs(vd, exist_ok=True)
            rows = vidur_gemms(f"{a.shared}/profiles/vidur/{n}")
            ng = write_table(f"{vd}/gemm.txt", "gemm", rows, f"vidur {n}")
            vpaths = dict(paths, gemm=f"{name}/gemm.txt")
            vj = dict(j, name=name, tables=vpaths, source=f"vidur {n} + " + j["source"])
            with open(os.path.join(a.out, f"{name}.json"), "w") as f:
                json.dump(vj, f, indent=2)
                f.write("\n")
            print(f"tables {name}: gemm {ng} rows (vidur), the rest as {hw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
