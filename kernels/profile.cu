/* placeholder, replaced below */
#include "cuda_impl.h"
int tdm__cu_profile(const tdm_profile_spec *spec, char *json, size_t json_size, size_t *json_len,
                    char *msg, size_t msg_len)
{
    snprintf(msg, msg_len, "not implemented");
    return TDM_E_UNSUPPORTED;
}
