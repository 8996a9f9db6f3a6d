# mk/wheel.mk -- the self-contained Python wheel `tandem-serving` (docs/adapters.md,
# "Installing"). Included at the end of the Makefile.
#
#   make wheel        $(WHEELHOUSE)/tandem_serving-<v>-py3-none-manylinux_<glibc>_<arch>.whl:
#                     libtandem.so.1, the `tandem` executable (a console entry point execs it),
#                     libtandem_cuda.so when built, the Python package, and every non-system
#                     dependency (libzmq, libsodium, msgpack-c, jansson, libxxhash, libcrypto...)
#                     grafted by auditwheel (scripts/build-wheel; build and auditwheel from PyPI
#                     in $(WHEEL_VENV), Debian's patchelf)
#   make test-wheel-quick  (part of `make test`) builds the wheel, installs it into a fresh
#                     virtualenv and runs adapters/python/tests_wheel/smoke.py there with no
#                     TANDEM_* variable -> $(RESULTS)/wheel-quick.counts (one skip, with the
#                     reason, when PyPI or patchelf is missing)
#   make test-wheel   (not part of `make test`; root, network) the wheel in a fresh Debian chroot
#                     (debootstrap minbase + python3, python3-venv: no compiler, no -dev package):
#                     the smoke checks, `tandem sim` on a trace from ../shared/traces, then
#                     TandemScheduler against vLLM from PyPI (scripts/test-wheel-chroot)

WHEEL_VENV ?= $(BUILD)/venv-wheel
WHEELHOUSE ?= $(BUILD)/wheelhouse

.PHONY: wheel wheel-venv test-wheel-quick test-wheel

TEST_SUITES += test-wheel-quick

wheel-venv:
	@scripts/wheel-venv $(WHEEL_VENV) $(PYTHON3)

wheel: all wheel-venv
	@scripts/build-wheel $(BUILD) $(WHEEL_VENV) $(WHEELHOUSE) $(HAVE_CUDA)

test-wheel-quick: all
	@scripts/wheel-check $(BUILD) $(WHEEL_VENV) $(WHEELHOUSE) $(RESULTS)/wheel-quick.counts \
	  $(PYTHON3) $(HAVE_CUDA)

# The chroot is rebuilt from a cached base (debootstrap is slow) for every run; the trace is
# copied in at test time. WHEEL_VLLM_PKG: the vLLM that TandemScheduler is checked against.
WHEEL_CHROOT   ?= $(BUILD)/wheel-chroot
WHEEL_TRACE    ?= ../shared/traces/azure2023_code.csv
WHEEL_VLLM_PKG ?= vllm==0.33.0

test-wheel: wheel
	@mkdir -p $(RESULTS)
	@scripts/test-wheel-chroot $(WHEEL_CHROOT) $(WHEELHOUSE) $(WHEEL_TRACE) '$(WHEEL_VLLM_PKG)' \
	  $(RESULTS)/wheel.counts
