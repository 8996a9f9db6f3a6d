"""Fixtures for the vLLM drop-in tests (run by `make test-vllm` in build/venv-vllm): vLLM
configs built the way vLLM's own tests/v1/core/utils.py builds them, but for a tiny local
model config (no download, no GPU), and both vLLM's Scheduler and TandemScheduler on them."""
import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

vllm = pytest.importorskip("vllm", reason="vllm is not installed (make test-vllm installs it)")
torch = pytest.importorskip("torch")

from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

EOS_TOKEN_ID = 50256

TINY = {
    "architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 64,
    "ffn_dim": 128, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 50272,
    "max_position_embeddings": 16384, "word_embed_proj_dim": 64,
    "do_layer_norm_before": True, "torch_dtype": "float16", "bos_token_id": 2,
    "eos_token_id": 2, "pad_token_id": 1, "activation_function": "relu", "enable_bias": True,
    "layer_norm_elementwise_affine": True,
}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-opt")
    (d / "config.json").write_text(json.dumps(TINY))
    return str(d)


def make_configs(model, max_num_seqs=16, max_num_batched_tokens=8192, num_blocks=10000,
                 block_size=16, enable_prefix_caching=True, long_prefill_token_threshold=0,
                 max_model_len=None, policy="fcfs", kv_transfer_config=None, sched_extra=None,
                 async_scheduling=False, enable_chunked_prefill=True, layer_names=("layer",),
                 num_kv_heads=1, head_size=1, kv_dtype=None):
    """sched_extra: more SchedulerConfig fields, those this vLLM version has. layer_names,
    num_kv_heads, head_size, kv_dtype: the one KV cache group (a worker-side connector
    matches them against the tensors it registers, by layer name)."""
    if max_model_len is None:
        max_model_len = max_num_batched_tokens
    fields = getattr(SchedulerConfig, "__dataclass_fields__", {})
    extra = {k: v for k, v in (sched_extra or {}).items() if k in fields}
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         max_model_len=max_model_len,
                         long_prefill_token_threshold=long_prefill_token_threshold,
                         enable_chunked_prefill=enable_chunked_prefill, is_encoder_decoder=False,
                         async_scheduling=async_scheduling, policy=policy, **extra)
    mc = ModelConfig(model=model, dtype="float16", seed=42, skip_tokenizer_init=True,
                     max_model_len=max_model_len)
    cc = CacheConfig(block_size=block_size, gpu_memory_utilization=0.9, cache_dtype="auto",
                     enable_prefix_caching=enable_prefix_caching)
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc,
                    device_config=DeviceConfig(device="cpu"),
                    kv_transfer_config=kv_transfer_config)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(list(layer_names), FullAttentionSpec(
            block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size,
            dtype=kv_dtype if kv_dtype is not None else torch.float32))])
    cc.num_gpu_blocks = num_blocks
    return vc, kv


def make_pair(model, **kw):
    """(vLLM's Scheduler, TandemScheduler) on identical configs."""
    from tandem.vllm import TandemScheduler
    vc, kv = make_configs(model, **kw)
    block_size = kw.get("block_size", 16)
    ref = Scheduler(vllm_config=vc, kv_cache_config=kv, log_stats=True, block_size=block_size,
                    structured_output_manager=StructuredOutputManager(vc))
    vc2, kv2 = make_configs(model, **kw)
    ours = TandemScheduler(vllm_config=vc2, kv_cache_config=kv2, log_stats=True,
                           block_size=block_size,
                           structured_output_manager=StructuredOutputManager(vc2))
    return ref, ours


def make_mro(req_ids, sampled_token_ids, **kw):
    """A ModelRunnerOutput for the scheduled ids in order: vLLM <= 0.33 also wants
    req_id_to_index (0.34 dropped it; the scheduler looks the ids up itself)."""
    from vllm.v1.outputs import ModelRunnerOutput
    fields = getattr(ModelRunnerOutput, "__dataclass_fields__", {})
    if "req_id_to_index" in fields:
        kw["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
    return ModelRunnerOutput(req_ids=list(req_ids), sampled_token_ids=sampled_token_ids, **kw)


def resumed_ids(so, seen) -> list:
    """The requests the output resumes: vLLM <= 0.33 lists them in
    CachedRequestData.resumed_req_ids; 0.34 sends them as new requests (ids seen before)."""
    c = so.scheduled_cached_reqs
    if hasattr(c, "resumed_req_ids"):
        return sorted(c.resumed_req_ids)
    return sorted(n.req_id for n in so.scheduled_new_reqs if n.req_id in seen)


_none_hash = False


def make_requests(num_requests, num_tokens=10, max_tokens=16, stop_token_ids=None,
                  same_prompt=False, block_size=16, prompts=None, priorities=None,
                  arrival0=1000.0):
    global _none_hash
    if not _none_hash:
        init_none_hash(sha256)
        _none_hash = True
    hasher = get_request_block_hasher(block_size, sha256)
    reqs = []
    for i in range(num_requests):
        sp = SamplingParams(ignore_eos=False, max_tokens=max_tokens, stop_token_ids=stop_token_ids)
        sp.update_from_generation_config({}, EOS_TOKEN_ID)
        prompt = prompts[i] if prompts else ([0] * num_tokens if same_prompt else [i] * num_tokens)
        reqs.append(Request(request_id=f"{i}", prompt_token_ids=list(prompt), sampling_params=sp,
                            pooling_params=None, block_hasher=hasher,
                            arrival_time=arrival0 + i * 1e-3,
                            priority=priorities[i] if priorities else 0))
    return reqs
