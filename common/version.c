/*
 * version.c -- version queries and the names of status codes.
 */
#include "tandem.h"

unsigned tdm_version_number(void) { return TDM_VERSION_NUMBER; }
const char *tdm_version_string(void) { return TDM_VERSION_STRING; }
unsigned tdm_abi_version(void) { return TDM_ABI_VERSION; }

const char *tdm_strerror(int status)
{
    switch (status) {
    case TDM_OK: return "ok";
    case TDM_E_INVAL: return "invalid argument";
    case TDM_E_NOMEM: return "out of memory";
    case TDM_E_NOT_FOUND: return "not found";
    case TDM_E_EXISTS: return "already exists";
    case TDM_E_STATE: return "invalid state for this call";
    case TDM_E_RANGE: return "value out of range";
    case TDM_E_CONFIG: return "invalid configuration";
    case TDM_E_NO_SPACE: return "no space left";
    case TDM_E_AGAIN: return "try again";
    case TDM_E_TIMEOUT: return "timed out";
    case TDM_E_PROTOCOL: return "protocol error";
    case TDM_E_IO: return "I/O error";
    case TDM_E_NO_CUDA: return "CUDA not available";
    case TDM_E_CUDA: return "CUDA error";
    case TDM_E_VERSION: return "version mismatch";
    case TDM_E_LAYOUT: return "incompatible KV layout";
    case TDM_E_AUTH: return "authentication refused";
    case TDM_E_CANCELLED: return "cancelled";
    case TDM_E_PEER: return "peer error";
    case TDM_E_UNSUPPORTED: return "not supported";
    case TDM_E_INTERNAL: return "internal error";
    case TDM_E_TRUNCATED: return "buffer too small";
    case TDM_E_PLUGIN: return "plug-in error";
    default: return "unknown error";
    }
}
