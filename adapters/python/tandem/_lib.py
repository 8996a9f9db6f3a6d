"""Loading libtandem.so and declaring its C ABI for ctypes.

The library is found, in order, through: the environment variable TANDEM_LIBRARY (a path to
the shared object; when set, nothing else is tried: an explicit override always wins), the
library bundled in this package (tandem/_native/libtandem.so.1, present in the self-contained
wheel that `make wheel` builds, `pip install tandem-serving`), TANDEM_BUILD (a build directory
holding libtandem.so), the repository's build/ directory relative to this source file (a
checkout used in place), then the system loader (libtandem.so.<ABI>). The bundled library
comes before TANDEM_BUILD and build/ because it was built from the same sources as these
bindings; a stray build directory of another version must not shadow it. At import the loaded
library's tdm_abi_version() must equal ABI_VERSION, the version these bindings were written
for; otherwise ImportError.

Functions are bound lazily: a symbol the loaded library lacks (an older library) raises
TandemError(TDM_E_UNSUPPORTED) when it is first used, not at import.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char_p, c_double, c_int, c_int32, c_int64, c_size_t,
                    c_uint, c_uint8, c_uint32, c_uint64, c_void_p)
from pathlib import Path

#: The ABI version (TDM_ABI_VERSION of include/tandem.h) these bindings were written for.
ABI_VERSION = 1

c_token = c_int32


def search_paths(env_var, native_name, build_name, environ=None, package_dir=None):
    """(path, how) pairs where a native file is looked for, in order: the variable env_var (a
    path; when set and non-empty, nothing else), the copy bundled in this package's _native/
    (the self-contained wheel of `make wheel`: libtandem.so.1, the `tandem` executable,
    libtandem_cuda.so), TANDEM_BUILD/build_name, the repository's build/build_name (a
    checkout used in place). environ and package_dir default to os.environ and this package."""
    environ = os.environ if environ is None else environ
    here = Path(__file__).resolve().parent if package_dir is None else Path(package_dir)
    explicit = environ.get(env_var)
    if explicit:
        yield explicit, env_var
        return
    yield str(here / "_native" / native_name), "bundled"
    build = environ.get("TANDEM_BUILD")
    if build:
        yield str(Path(build) / build_name), "TANDEM_BUILD"
    # adapters/python/tandem/ -> the repository root is two levels up.
    if len(here.parents) > 2:
        yield str(here.parents[2] / "build" / build_name), "repository build/"


def _candidates(environ=None, package_dir=None):
    """(path, how) pairs in the order they are tried; see the module docstring."""
    environ = os.environ if environ is None else environ
    yield from search_paths("TANDEM_LIBRARY", f"libtandem.so.{ABI_VERSION}", "libtandem.so",
                            environ, package_dir)
    if environ.get("TANDEM_LIBRARY"):
        return
    yield f"libtandem.so.{ABI_VERSION}", "system loader"
    found = ctypes.util.find_library("tandem")
    if found:
        yield found, "system loader"


def _load():
    tried = []
    for path, how in _candidates():
        if how != "system loader" and not os.path.exists(path):
            tried.append(f"{path} ({how}: no such file)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path} ({how}: {e})")
    raise ImportError("tandem: cannot load libtandem.so; tried: " + "; ".join(tried) +
                      ". Install the self-contained wheel (pip install tandem-serving), build "
                      "the library with `make`, or set TANDEM_LIBRARY=/path/to/libtandem.so")


lib, path = _load()

lib.tdm_abi_version.restype = c_uint
lib.tdm_abi_version.argtypes = []
_abi = lib.tdm_abi_version()
if _abi != ABI_VERSION:
    raise ImportError(f"tandem: {path} has ABI version {_abi}, these bindings need "
                      f"{ABI_VERSION}; rebuild the library or install matching bindings")

lib.tdm_version_string.restype = c_char_p
lib.tdm_version_string.argtypes = []
lib.tdm_version_number.restype = c_uint
lib.tdm_version_number.argtypes = []
lib.tdm_strerror.restype = c_char_p
lib.tdm_strerror.argtypes = [c_int]

library_version = lib.tdm_version_string().decode()


# ---- structs (field order and types exactly as in include/tandem.h) ------------------------

class RequestDesc(Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("flags", c_uint32), ("id", c_uint64),
        ("prompt", POINTER(c_token)), ("num_prompt_tokens", c_uint32),
        ("max_tokens", c_uint32), ("min_tokens", c_uint32), ("eos_token_id", c_int32),
        ("stop_token_ids", POINTER(c_token)), ("num_stop_token_ids", c_uint32),
        ("priority", c_int32), ("arrival_time", c_double), ("ttft_slo", c_double),
        ("tpot_slo", c_double), ("cache_salt", c_void_p), ("cache_salt_len", c_uint32),
        ("num_remote_tokens", c_uint32), ("tenant", c_uint32),
        ("block_hashes", c_void_p), ("num_block_hashes", c_uint32), ("block_hash_size", c_uint32),
        ("prefix_hit_limit", c_uint32),
    ]


class BatchC(Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("num_reqs", c_uint32), ("step", c_uint64),
        ("total_tokens", c_uint32), ("num_prefill_reqs", c_uint32),
        ("req_ids", POINTER(c_uint64)), ("num_tokens", POINTER(c_uint32)),
        ("num_computed", POINTER(c_uint32)), ("kinds", POINTER(c_uint8)),
        ("num_spec", POINTER(c_uint32)), ("block_offsets", POINTER(c_uint32)),
        ("blocks", POINTER(c_uint32)),
        ("num_preempted", c_uint32), ("preempted_ids", POINTER(c_uint64)),
        ("num_finished", c_uint32), ("finished_ids", POINTER(c_uint64)),
        ("num_recv_ready", c_uint32), ("recv_ready_ids", POINTER(c_uint64)),
    ]


class StepOutputC(Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("num_reqs", c_uint32), ("req_ids", POINTER(c_uint64)),
        ("token_offsets", POINTER(c_uint32)), ("tokens", POINTER(c_token)), ("now", c_double),
    ]


class UpdateResultC(Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("num_reqs", c_uint32), ("req_ids", POINTER(c_uint64)),
        ("num_new_tokens", POINTER(c_uint32)), ("finish_reasons", POINTER(c_uint8)),
        ("stop_tokens", POINTER(c_int32)),
    ]


class RequestInfoC(Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("state", c_uint32), ("finish_reason", c_uint32),
        ("num_prompt_tokens", c_uint32), ("num_output_tokens", c_uint32),
        ("num_computed_tokens", c_uint32), ("num_cached_tokens", c_uint32),
        ("num_blocks", c_uint32), ("num_preemptions", c_uint32), ("priority", c_int32),
        ("arrival_time", c_double), ("first_scheduled_time", c_double),
        ("first_token_time", c_double), ("last_token_time", c_double),
        ("finish_time", c_double), ("max_token_gap", c_double),
    ]


class StatsC(Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("num_running", c_uint32), ("num_waiting", c_uint32),
        ("num_waiting_remote_kv", c_uint32), ("num_held", c_uint32),
        ("num_total_blocks", c_uint32), ("num_free_blocks", c_uint32),
        ("num_cached_blocks", c_uint32), ("kv_usage", c_double),
        ("prefix_queries", c_uint64), ("prefix_hits", c_uint64),
        ("prefix_hit_rate", c_double), ("evictions", c_uint64), ("preemptions", c_uint64),
        ("steps", c_uint64), ("scheduled_tokens", c_uint64), ("finished", c_uint64),
        ("kv_events_dropped", c_uint64),
    ]


class KVEventBatchC(Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("num_events", c_uint32),
        ("kinds", POINTER(c_uint8)), ("hash_sizes", POINTER(c_uint8)),
        ("hash_offsets", POINTER(c_uint32)), ("hashes", POINTER(c_uint8)),
        ("has_parent", POINTER(c_uint8)), ("parent_hashes", POINTER(c_uint8)),
        ("token_offsets", POINTER(c_uint32)), ("token_ids", POINTER(c_token)),
        ("req_ids", POINTER(c_uint64)), ("first_blocks", POINTER(c_uint32)),
        ("block_size", c_uint32), ("overflowed", c_uint32), ("num_dropped", c_uint64),
    ]


class KVLayoutC(Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("kind", c_uint32), ("num_layers", c_uint32),
        ("num_blocks", c_uint32), ("block_size", c_uint32), ("num_kv_heads", c_uint32),
        ("head_dim", c_uint32), ("dtype", c_uint32), ("stride_kv", c_int64),
        ("stride_block", c_int64), ("stride_token", c_int64), ("stride_head", c_int64),
    ]


class RequestViewC(Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("state", c_uint32), ("id", c_uint64), ("priority", c_int32),
        ("tenant", c_uint32), ("arrival_time", c_double), ("ttft_slo", c_double),
        ("tpot_slo", c_double), ("num_prompt_tokens", c_uint32), ("num_output_tokens", c_uint32),
        ("num_computed_tokens", c_uint32), ("num_preemptions", c_uint32), ("max_tokens", c_uint32),
        ("reserved0", c_uint32), ("admit_seq", c_uint64),
    ]


POLICY_COMPARE_FN = ctypes.CFUNCTYPE(c_int, c_void_p, POINTER(RequestViewC), POINTER(RequestViewC))
POLICY_VICTIM_FN = ctypes.CFUNCTYPE(c_uint32, c_void_p, POINTER(POINTER(RequestViewC)), c_uint32)
POLICY_DESTROY_FN = ctypes.CFUNCTYPE(None, c_void_p)


class PolicyC(Structure):
    _fields_ = [
        ("version", c_uint32), ("name", c_char_p), ("ctx", c_void_p),
        ("compare", POLICY_COMPARE_FN), ("pick_victim", POLICY_VICTIM_FN),
        ("destroy", POLICY_DESTROY_FN),
    ]


# ---- function prototypes ---------------------------------------------------------------------
# name -> (restype, argtypes). Bound on first use by fn().

_vp = c_void_p
_PROTOS = {
    "tdm_sched_create": (c_int, [POINTER(c_void_p)]),
    "tdm_sched_destroy": (None, [_vp]),
    "tdm_sched_errmsg": (c_char_p, [_vp]),
    "tdm_sched_configure": (c_int, [_vp, c_char_p]),
    "tdm_sched_get_config": (c_int, [_vp, c_char_p, c_size_t, POINTER(c_size_t)]),
    "tdm_sched_set_param": (c_int, [_vp, c_int, c_int64]),
    "tdm_sched_get_param": (c_int, [_vp, c_int, POINTER(c_int64)]),
    "tdm_request_desc_init": (c_int, [POINTER(RequestDesc)]),
    "tdm_sched_add": (c_int, [_vp, POINTER(RequestDesc)]),
    "tdm_sched_append_block_hashes": (c_int, [_vp, c_uint64, c_void_p, c_uint32, c_uint32]),
    "tdm_prefix_digests": (c_int, [c_int, c_uint32, c_void_p, c_uint32, c_void_p, c_uint32,
                                   c_void_p, c_size_t, POINTER(c_uint32)]),
    "tdm_prefix_errmsg": (c_char_p, []),
    "tdm_sched_abort": (c_int, [_vp, c_uint64]),
    "tdm_sched_finish": (c_int, [_vp, c_uint64, c_int]),
    "tdm_batch_init": (c_int, [POINTER(BatchC)]),
    "tdm_sched_step": (c_int, [_vp, c_double, POINTER(BatchC)]),
    "tdm_step_output_init": (c_int, [POINTER(StepOutputC)]),
    "tdm_update_result_init": (c_int, [POINTER(UpdateResultC)]),
    "tdm_sched_update": (c_int, [_vp, POINTER(StepOutputC), POINTER(UpdateResultC)]),
    "tdm_sched_update_step": (c_int, [_vp, c_uint64, POINTER(StepOutputC), POINTER(UpdateResultC)]),
    "tdm_sched_set_draft_tokens": (c_int, [_vp, c_uint64, POINTER(c_token), c_uint32]),
    "tdm_request_info_init": (c_int, [POINTER(RequestInfoC)]),
    "tdm_sched_request_info": (c_int, [_vp, c_uint64, POINTER(RequestInfoC)]),
    "tdm_sched_request_blocks": (c_int, [_vp, c_uint64, POINTER(POINTER(c_uint32)),
                                         POINTER(c_uint32)]),
    "tdm_sched_request_tokens": (c_int, [_vp, c_uint64, POINTER(POINTER(c_token)),
                                         POINTER(c_uint32)]),
    "tdm_sched_remote_kv_done": (c_int, [_vp, c_uint64, c_int, c_uint32]),
    "tdm_sched_release": (c_int, [_vp, c_uint64]),
    "tdm_sched_reset_prefix_cache": (c_int, [_vp, c_int]),
    "tdm_sched_stats_init": (c_int, [POINTER(StatsC)]),
    "tdm_sched_get_stats": (c_int, [_vp, POINTER(StatsC)]),
    "tdm_sched_num_unfinished": (c_int, [_vp, POINTER(c_uint32)]),
    "tdm_kv_event_batch_init": (c_int, [POINTER(KVEventBatchC)]),
    "tdm_sched_kv_events": (c_int, [_vp, POINTER(KVEventBatchC)]),
    "tdm_sched_load_policy": (c_int, [_vp, c_char_p, c_char_p]),
    "tdm_sched_set_policy": (c_int, [_vp, POINTER(PolicyC)]),
    "tdm_dtype_size": (c_size_t, [c_int]),
    "tdm_kv_layout_init": (c_int, [POINTER(KVLayoutC), c_int, c_uint32, c_uint32, c_uint32,
                                   c_uint32, c_uint32, c_int]),
}

_bound = {}


class MissingSymbol(Exception):
    """Raised by fn() when the loaded library lacks a symbol (converted to TandemError)."""


def has(name: str) -> bool:
    """Whether the loaded library exports `name`."""
    try:
        getattr(lib, name)
        return True
    except AttributeError:
        return False


def fn(name: str):
    """The bound C function `name`, with its prototype set."""
    f = _bound.get(name)
    if f is not None:
        return f
    try:
        f = getattr(lib, name)
    except AttributeError:
        raise MissingSymbol(f"{path} does not export {name} (library {library_version} is "
                            f"older than these bindings or not fully built)") from None
    proto = _PROTOS.get(name)
    if proto is not None:
        f.restype, f.argtypes = proto
    _bound[name] = f
    return f


def declare(name: str, restype, argtypes):
    """Add a prototype (used by modules for optional parts of the ABI, e.g. tdm_kvx_*)."""
    _PROTOS[name] = (restype, argtypes)
    _bound.pop(name, None)


def strerror(status: int) -> str:
    return lib.tdm_strerror(int(status)).decode()
