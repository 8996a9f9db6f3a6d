/*
 * serve_check.c -- what `tandem serve` learns about a request message before decoding it,
 * without allocating: the structural pre-check (every length and element count fits in the
 * bytes that remain, bounded nesting, no trailing bytes: run before msgpack-c's unpacker, whose
 * zone would otherwise allocate what a 5-byte header claims; at most TDM_SERVE_MAX_ELEMENTS
 * elements, which bounds what one decode allocates, 24 bytes each), and the peek: the "op" and the
 * headers of the top-level values, read within a fixed budget of elements, so that a request
 * larger than its operation allows (a 16 MiB "ping", a prompt beyond --max-prompt-tokens) is
 * refused in microseconds instead of after a decode that costs up to 24 bytes per element.
 */
#include <stdio.h>
#include <string.h>

#include "serve.h"

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* One msgpack header at *pp: advances past it and its payload bytes (strings, bin, ext,
 * numbers); *items: the elements that follow it (2 per map entry), *is_container, and for a
 * str/bin/array/map its length or count in *count. 0, or -1 with e filled. */
static int header(const unsigned char **pp, const unsigned char *end, uint64_t *items,
                  int *is_container, uint64_t *count, tdm__serve_err *e)
{
    const unsigned char *p = *pp;
    if (p >= end) return tdm__serve_fail(e, TDM_E_PROTOCOL, "truncated msgpack message"), -1;
    unsigned b = *p++;
    uint64_t skip = 0, n = 0;
    int lenb = 0, container = 0;
    *items = 0;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        /* one byte */
    } else if (b >= 0x80 && b <= 0x8f) { n = b & 0x0f; container = 2; }
    else if (b >= 0x90 && b <= 0x9f) { n = b & 0x0f; container = 1; }
    else if (b >= 0xa0 && b <= 0xbf) { skip = n = b & 0x1f; }
    else switch (b) {
    case 0xc4: case 0xd9: lenb = 1; break;            /* bin8, str8 */
    case 0xc5: case 0xda: lenb = 2; break;            /* bin16, str16 */
    case 0xc6: case 0xdb: lenb = 4; break;            /* bin32, str32 */
    case 0xc7: lenb = 1; skip = 1; break;             /* ext8: len, type */
    case 0xc8: lenb = 2; skip = 1; break;
    case 0xc9: lenb = 4; skip = 1; break;
    case 0xca: skip = 4; break;
    case 0xcb: skip = 8; break;
    case 0xcc: case 0xd0: skip = 1; break;
    case 0xcd: case 0xd1: skip = 2; break;
    case 0xce: case 0xd2: skip = 4; break;
    case 0xcf: case 0xd3: skip = 8; break;
    case 0xd4: skip = 2; break;                       /* fixext: type + data */
    case 0xd5: skip = 3; break;
    case 0xd6: skip = 5; break;
    case 0xd7: skip = 9; break;
    case 0xd8: skip = 17; break;
    case 0xdc: lenb = 2; container = 1; break;        /* array16 */
    case 0xdd: lenb = 4; container = 1; break;        /* array32 */
    case 0xde: lenb = 2; container = 2; break;        /* map16 */
    case 0xdf: lenb = 4; container = 2; break;        /* map32 */
    default:
        return tdm__serve_fail(e, TDM_E_PROTOCOL, "malformed msgpack message (byte 0x%02x)", b), -1;
    }
    if (lenb) {
        if ((size_t)(end - p) < (size_t)lenb)
            return tdm__serve_fail(e, TDM_E_PROTOCOL, "truncated msgpack message"), -1;
        n = be(p, lenb);
        p += lenb;
        if (!container) skip += n;
    }
    if ((uint64_t)(end - p) < skip)
        return tdm__serve_fail(e, TDM_E_PROTOCOL, "truncated msgpack message"), -1;
    p += skip;
    if (container) {
        *items = container == 2 ? 2 * n : n;
        /* Every element takes at least one byte: a count beyond what is left is a lie. */
        if (*items > (uint64_t)(end - p))
            return tdm__serve_fail(e, TDM_E_PROTOCOL, "truncated msgpack message (a container "
                                   "claims %llu elements)", (unsigned long long)*items), -1;
    }
    *is_container = container;
    *count = n;
    *pp = p;
    return 0;
}

int tdm__serve_precheck(const char *msg, size_t len, tdm__serve_err *e)
{
    const unsigned char *p = (const unsigned char *)msg, *end = p + len;
    uint64_t stack[TDM_SERVE_PRECHECK_DEPTH + 1];
    int depth = 0;
    uint64_t elements = 0;
    stack[0] = 1; /* one top-level object */
    while (depth >= 0) {
        if (stack[depth] == 0) { depth--; continue; }
        stack[depth]--;
        if (++elements > TDM_SERVE_MAX_ELEMENTS)
            return tdm__serve_fail(e, TDM_E_RANGE, "a request of more than %u msgpack elements",
                                   TDM_SERVE_MAX_ELEMENTS);
        uint64_t items, n;
        int container;
        if (header(&p, end, &items, &container, &n, e)) return e->status;
        if (container && items) {
            if (depth + 1 > TDM_SERVE_PRECHECK_DEPTH)
                return tdm__serve_fail(e, TDM_E_PROTOCOL, "msgpack nesting deeper than %d",
                                       TDM_SERVE_PRECHECK_DEPTH);
            stack[++depth] = items;
        }
    }
    if (p != end)
        return tdm__serve_fail(e, TDM_E_PROTOCOL, "%zu trailing bytes after the request",
                               (size_t)(end - p));
    return 0;
}

/* Skips one object at *pp within *budget elements (nesting counted by a running total, so
 * no stack is needed). 0 done, 1 budget exhausted, -1 malformed. */
static int skip_one(const unsigned char **pp, const unsigned char *end, uint64_t *budget,
                    tdm__serve_err *e)
{
    uint64_t left = 1;
    while (left) {
        if (*budget == 0) return 1;
        (*budget)--;
        left--;
        uint64_t items, n;
        int container;
        if (header(pp, end, &items, &container, &n, e)) return -1;
        left += items;
    }
    return 0;
}

int tdm__serve_peek(const char *msg, size_t len, tdm__serve_peek_info *pi)
{
    const unsigned char *p = (const unsigned char *)msg, *end = p + len;
    tdm__serve_err e;
    uint64_t items, n, budget = TDM_SERVE_PEEK_BUDGET;
    int container;
    memset(pi, 0, sizeof *pi);
    pi->prompt_n = -1;
    if (header(&p, end, &items, &container, &n, &e) || container != 2) return -1;
    for (uint64_t i = 0; i < n; i++) {
        const unsigned char *k = p;
        uint64_t kn;
        if (header(&p, end, &items, &container, &kn, &e)) return -1;
        int is_str = (*k >= 0xa0 && *k <= 0xbf) || *k == 0xd9 || *k == 0xda || *k == 0xdb;
        const char *key = is_str ? (const char *)p - kn : "";
        if (!is_str) kn = 0;
        const unsigned char *v = p;
        uint64_t vitems, vn;
        int vcont;
        if (header(&v, end, &vitems, &vcont, &vn, &e)) return -1;
        int v_str = (*p >= 0xa0 && *p <= 0xbf) || *p == 0xd9 || *p == 0xda || *p == 0xdb;
        int v_bin = *p == 0xc4 || *p == 0xc5 || *p == 0xc6;
        if (kn == 2 && !memcmp(key, "op", 2) && v_str && vn < sizeof pi->op) {
            if (!pi->have_op) { /* the first, as the decoded map's lookup takes */
                memcpy(pi->op, v - vn, vn);
                pi->op[vn] = '\0';
                pi->have_op = 1;
            }
        } else if (kn == 6 && !memcmp(key, "prompt", 6) && pi->prompt_n < 0 &&
                   (vcont == 1 || v_bin)) {
            pi->prompt_n = (int64_t)(vcont == 1 ? vn : vn / 4); /* bin: packed int32 */
        }
        if (vcont == 1 && vn > pi->max_array) pi->max_array = vn;
        int r = skip_one(&p, end, &budget, &e);
        if (r) return r < 0 ? -1 : 0;
    }
    pi->complete = 1;
    return 0;
}

/* Ops whose requests may be large (prompts, outputs, block lists, KV data); the others take
 * at most TDM_SERVE_SMALL_MSG bytes. Not configs: converting a 16 MiB config to JSON and
 * parsing it took the loop over a second; a real one is a few hundred bytes (create,
 * configure, kvx_create), nor drafts (at most num_lookahead_tokens <= 1024 tokens). */
static int large_op(const char *op)
{
    static const char *const big[] = {"add", "update", "kvx_send", "kvx_recv", "kvx_write"};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        if (!strcmp(op, big[i])) return 1;
    return 0;
}

int tdm__serve_early_check(const tdm__serve_state *st, const char *msg, size_t len,
                           tdm__serve_err *e)
{
    if (len > st->max_msg_bytes)
        return tdm__serve_fail(e, TDM_E_RANGE, "message of %zu bytes exceeds the limit of %zu",
                               len, st->max_msg_bytes);
    if (len <= TDM_SERVE_SMALL_MSG) return 0; /* decoded at once: cheap */
    tdm__serve_peek_info pi;
    if (tdm__serve_peek(msg, len, &pi) != 0) return 0; /* the pre-check names the error */
    if (pi.have_op && !large_op(pi.op))
        return tdm__serve_fail(e, TDM_E_RANGE, "a \"%s\" request of %zu bytes: this op takes "
                               "at most %u bytes", pi.op, len, TDM_SERVE_SMALL_MSG);
    if (pi.have_op && !strcmp(pi.op, "add") && pi.prompt_n >= 0 &&
        (uint64_t)pi.prompt_n > st->lim.max_prompt_tokens)
        return tdm__serve_fail(e, TDM_E_RANGE, "prompt of %lld tokens exceeds --max-prompt-tokens "
                               "(%llu)", (long long)pi.prompt_n,
                               (unsigned long long)st->lim.max_prompt_tokens);
    if (pi.max_array > TDM_SERVE_MAX_ARRAY)
        return tdm__serve_fail(e, TDM_E_INVAL, "an array of %llu elements (at most %u)",
                               (unsigned long long)pi.max_array, TDM_SERVE_MAX_ARRAY);
    return 0;
}
