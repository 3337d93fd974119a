/* gpu/copy.hip: m3_gpu_copy_kernel, a plain 16-byte device copy kernel. It is the bench's
 * reference for what a simple memory-bound kernel reaches next to the runtime's own
 * device-to-device copy (tests/gpu_bench.c bench_copy_kernel): the model never calls it.
 *
 * copy16_k: thread i of the grid moves chunks i*CPT .. in a span of 256*CPT chunks a block
 *   (chunk base + c*256: coalesced), all its loads issued before its stores. HINT: loads
 *   through the read-only path without an L1 line, streaming stores (gpu/mem16.h). PDL:
 *   launched as a programmatic dependent of the launch before it (flavor 3): the bench's floor
 *   for the dependent launches of the router, the decode-step and MoE T = 1 kernels.
 *
 * Also here: the test hook m3_gpu_set_elem_variant (variant 0 = the plain element-wise kernels of
 * gpu/norm.hip and gpu/mlp.hip), so a test can check the fast path writes the same bytes. */
#include "gpu/hip_compat.h"
#include "gpu/gpu_internal.h"
#include "gpu/mem16.h"

static int g_elem_variant = -1; /* -1: the fast path */

extern "C" void m3_gpu_set_elem_variant(int v) { g_elem_variant = v == 0 ? 0 : -1; }

int m3_elem_variant(void) { return g_elem_variant; }

template <int CPT, bool HINT, bool PDL = false>
static __global__ void __launch_bounds__(256) copy16_k(uint4 *dst, const uint4 *src, int64_t n) {
    /* PDL: the next launch may start at once, then wait for the earlier grid before any load or
     * store (qw_norm_k's order; the wait first, route_sel_k's, measured the same: session 15) */
    if (PDL) {
        m3_pdl_trigger();
        m3_pdl_wait();
    }
    const int64_t base = (int64_t)blockIdx.x * (256 * CPT) + threadIdx.x;
    uint4 v[CPT];
#pragma unroll
    for (int c = 0; c < CPT; c++)
        if (base + c * 256 < n) v[c] = HINT ? m3_ld16_ro(src + base + c * 256) : m3_ld16(src + base + c * 256);
#pragma unroll
    for (int c = 0; c < CPT; c++)
        if (base + c * 256 < n) {
            if (HINT) m3_st16_cs(dst + base + c * 256, v[c]);
            else m3_st16(dst + base + c * 256, v[c]);
        }
}

extern "C" m3_status m3_gpu_copy_kernel(m3_gpu *g, void *d_dst, const void *d_src, size_t bytes,
                                        int flavor) {
    if (bytes % 16 || !m3_aligned16(d_dst) || !m3_aligned16(d_src))
        return m3_errorf(M3_ERR_UNSUPPORTED,
                         "gpu copy kernel: %zu bytes / pointers not in 16-byte units", bytes);
    const int64_t n = (int64_t)(bytes / 16);
    if (n == 0) return M3_OK;
    uint4 *d = (uint4 *)d_dst;
    const uint4 *s = (const uint4 *)d_src;
    if (flavor == 0)
        copy16_k<1, false><<<m3_grid_1d(n, 256), 256, 0, g->stream>>>(d, s, n);
    else if (flavor == 1)
        copy16_k<1, true><<<m3_grid_1d(n, 256), 256, 0, g->stream>>>(d, s, n);
    else if (flavor == 2)
        copy16_k<4, true><<<m3_grid_1d(n, 1024), 256, 0, g->stream>>>(d, s, n);
    else
        M3_TRY(m3_gpu_launch_pdl(g, true, copy16_k<1, false, true>, dim3(m3_grid_1d(n, 256)), dim3(256),
                                 0, d, s, n));
    M3_LAUNCHED(g, "copy16_k");
    return M3_OK;
}
