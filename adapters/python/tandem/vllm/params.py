"""The kv_transfer_params TandemConnector exchanges through the host (no vllm import here).

The prefill side's request_finished returns a superset of what vLLM's NixlConnector returns,
so that a host or router that only knows NixlConnector's protocol (Dynamo's disaggregated
flow, vLLM's toy proxy) can carry them unchanged:

    do_remote_prefill, do_remote_decode, remote_block_ids, remote_engine_id,
    remote_request_id (the prefill side's vLLM request id), remote_host, remote_port
    (the engine's tcp listen endpoint: Tandem's handshake port, as NixlConnector's side
    channel), tp_size

plus Tandem's own: remote_endpoint (any tcp:// or ipc:// endpoint), remote_num_tokens,
remote_block_size. The decode side accepts either remote_endpoint or remote_host +
remote_port, and remote_request_id as the string (hashed to the transfer's 63-bit id
exactly as the prefill side did) or as that integer.
"""
from __future__ import annotations

import hashlib
from typing import Optional


def request_id_u64(req_id: str) -> int:
    """The 63-bit transfer request id of a vLLM request id (stable across processes)."""
    return int.from_bytes(hashlib.blake2b(req_id.encode(), digest_size=8).digest(),
                          "little") & ((1 << 63) - 1)


def endpoint_host_port(endpoint: Optional[str]):
    """(host, port) of a tcp://HOST:PORT endpoint, else (None, None)."""
    if not endpoint or not endpoint.startswith("tcp://"):
        return None, None
    host, sep, port = endpoint[6:].rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None, None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def make_transfer_params(engine_id: str, endpoint: Optional[str], req_id: str, block_ids,
                         num_tokens: int, block_size: int, tp_size: int = 1) -> dict:
    """What the prefill side's request_finished returns for a request it keeps for a pull."""
    host, port = endpoint_host_port(endpoint)
    return {"do_remote_prefill": True, "do_remote_decode": False,
            "remote_block_ids": [int(b) for b in block_ids], "remote_engine_id": engine_id,
            "remote_request_id": req_id, "remote_host": host, "remote_port": port,
            "tp_size": int(tp_size),
            "remote_endpoint": endpoint, "remote_num_tokens": int(num_tokens),
            "remote_block_size": int(block_size)}


def parse_transfer_params(params: dict):
    """(transfer request id, remote engine id, endpoint) of a decode request's params.
    Raises ValueError saying which field is missing or malformed."""
    engine = params.get("remote_engine_id")
    if not isinstance(engine, str) or not engine:
        raise ValueError("kv_transfer_params: remote_engine_id missing")
    rid = params.get("remote_request_id")
    if isinstance(rid, str) and rid:
        rid = request_id_u64(rid)
    elif isinstance(rid, bool) or not isinstance(rid, int) or not 0 <= rid < (1 << 63):
        raise ValueError("kv_transfer_params: remote_request_id must be a request id string "
                         "or a 63-bit integer")
    ep = params.get("remote_endpoint")
    if not ep:
        host, port = params.get("remote_host"), params.get("remote_port")
        if not isinstance(host, str) or not host or isinstance(port, bool) or \
                not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError("kv_transfer_params: neither remote_endpoint nor a valid "
                             "remote_host + remote_port")
        ep = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
    if not isinstance(ep, str) or not (ep.startswith("tcp://") or ep.startswith("ipc://")):
        raise ValueError("kv_transfer_params: remote_endpoint must be tcp:// or ipc://")
    return rid, engine, ep
