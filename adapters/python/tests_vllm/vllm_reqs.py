"""Print the requirements of the installed vllm distribution, one a line, for pip -r.

`pip install vllm==X` fails when one of vLLM's exact pins is missing from PyPI (vLLM 0.34.0
pins flashinfer-python==0.7.3, which PyPI does not carry). `make test-vllm` then installs vLLM
with --no-deps and this script turns its own metadata into a requirements list: every
Requires-Dist whose environment marker holds here (extras dropped), except the names given
with --drop (GPU kernels the scheduler never imports).

    python vllm_reqs.py [--dist vllm] [--drop flashinfer-python ...]
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
    ns = ap.parse_args(argv)
    drop = {canonicalize_name(n) for n in ns.drop}
    out = []
    for line in md.distribution(ns.dist).requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(req.name) in drop:
            continue
        out.append(str(req).split(";")[0].strip())
    print("\n".join(sorted(set(out))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
