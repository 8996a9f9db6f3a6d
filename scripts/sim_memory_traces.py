#!/usr/bin/env python3
"""Write the simulator's memory-check workloads as Tandem JSONL (docs/simulator.md, Memory):

  six.jsonl   the six shared traces one after another (each keeps its own arrivals; the
              two length-only files get Poisson arrivals at the Azure conversation trace's
              rate), Mooncake hash ids offset per trace so that traces share no prefix;
  week.jsonl  a synthetic week at six.jsonl's mean arrival rate: Poisson arrivals, each
              request's lengths drawn from six.jsonl's requests (no hash ids).

Usage: sim_memory_traces.py SHARED_DIR OUT_DIR [--days D]
"""
import csv, json, random, sys
from datetime import datetime

def azure(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            ts = r["TIMESTAMP"]
            t = datetime.strptime(ts[:26], "%Y-%m-%d %H:%M:%S.%f").timestamp()
            rows.append((t, int(r["ContextTokens"]), int(r["GeneratedTokens"]), None))
    t0 = min(r[0] for r in rows)
    return sorted((t - t0, p, o, h) for t, p, o, h in rows)

def mooncake(path):
    rows = []
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            rows.append((j["timestamp"] / 1000.0, j["input_length"], j["output_length"], j["hash_ids"]))
    return rows

def lengths(path, rate, rng):
    rows, t = [], 0.0
    with open(path) as f:
        for r in csv.DictReader(f):
            t += rng.expovariate(rate)
            rows.append((t, int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]), None))
    return rows

def main():
    shared, out = sys.argv[1], sys.argv[2]
    days = float(sys.argv[sys.argv.index("--days") + 1]) if "--days" in sys.argv else 7.0
    rng = random.Random(42)
    tr = shared + "/traces/"
    conv = azure(tr + "azure2023_conv.csv")
    rate = len(conv) / conv[-1][0]
    parts = [azure(tr + "azure2023_code.csv"), conv,
             mooncake(tr + "mooncake_fast25_conversation_trace.jsonl"),
             mooncake(tr + "mooncake_fast25_synthetic_trace.jsonl"),
             lengths(tr + "sarathi_sharegpt_8k_filtered_lengths_llama2.csv", rate, rng),
             lengths(tr + "vidur_arxiv_summarization_lengths_llama2.csv", rate, rng)]
    base, hoff, n, lens = 0.0, 0, 0, []
    with open(out + "/six.jsonl", "w") as f:
        for rows in parts:
            top = 0
            for t, p, o, h in rows:
                j = {"arrival_s": round(base + t, 6), "input_tokens": p, "output_tokens": max(o, 1)}
                if h:
                    j["hash_ids"] = [x + hoff for x in h]
                    top = max(top, max(h) + 1)
                f.write(json.dumps(j) + "\n")
                lens.append((p, max(o, 1)))
                n += 1
            base += rows[-1][0] + 1.0
            hoff += top
    mean_rate = n / base
    end, t, m = days * 86400.0, 0.0, 0
    with open(out + "/week.jsonl", "w") as f:
        while True:
            t += rng.expovariate(mean_rate)
            if t >= end:
                break
            p, o = lens[rng.randrange(len(lens))]
            f.write('{"arrival_s": %.6f, "input_tokens": %d, "output_tokens": %d}\n' % (t, p, o))
            m += 1
    print("six.jsonl: %d requests over %.0f s (%.3f req/s); week.jsonl: %d requests over %.0f days"
          % (n, base, mean_rate, m, days))

if __name__ == "__main__":
    main()
