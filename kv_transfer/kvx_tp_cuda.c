/*
 * kvx_tp_cuda.c -- the CUDA IPC transport, as a capability: it would export the sender's
 * staging buffer with cudaIpcGetMemHandle and let the receiver's unpack kernel read it over
 * NVLink/PCIe. libtandem.so never links CUDA; until the CUDA loader of libtandem_cuda.so
 * offers IPC entry points, every method reports TDM_E_NO_CUDA and the handshake never
 * selects this transport (it is not offered unless tdm__kvx_cuda_ipc_available()).
 */
#include "kvx_internal.h"

int tdm__kvx_cuda_ipc_available(void) { return 0; }

static int cuda_acquire(void *ctx, size_t nbytes, void **buf, uint32_t *slot)
{
    (void)ctx; (void)nbytes; (void)buf; (void)slot;
    return TDM_E_NO_CUDA;
}

static void cuda_abandon(void *ctx, void *buf, uint32_t slot) { (void)ctx; (void)buf; (void)slot; }

static int cuda_resolve(void *ctx, zmq_msg_t *frame, uint32_t slot, size_t nbytes, const void **bytes)
{
    (void)ctx; (void)frame; (void)slot; (void)nbytes; (void)bytes;
    return TDM_E_NO_CUDA;
}

const tdm__kvx_transport tdm__kvx_cuda_ipc_transport = {
    .version = TDM__KVX_TRANSPORT_VERSION,
    .name = "cuda_ipc",
    .kind = TDM_KVX_TRANSPORT_CUDA_IPC,
    .acquire = cuda_acquire,
    .make_frame = NULL,
    .abandon = cuda_abandon,
    .credit = NULL,
    .resolve = cuda_resolve,
    .destroy = NULL,
};
