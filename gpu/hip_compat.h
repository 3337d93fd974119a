/* gpu/hip_compat.h: the one file that names a GPU vendor's headers (docs/style.md B2 fence).
 *
 * gpu/ sources are written in the HIP spelling. Under hipcc (AMD) this header includes
 * <hip/hip_runtime.h> and, when present, hipBLAS. Under nvcc (-x cu) it maps exactly the HIP
 * names m3kit uses onto the CUDA runtime and cuBLAS. The list is deliberately short: a name
 * that is missing here is a compile error on NVIDIA that says "add it to hip_compat.h".
 * Debian 12's HIP 5.2 headers do not compile under CUDA 13, so nvcc never sees them.
 *
 * Also defined here, for both vendors:
 *   M3_WARP             threads per warp/wavefront: 64 on CDNA (gfx90a, gfx942, gfx950), 32 on NVIDIA
 *   M3_MAX_WARPS        upper bound of warps per block of <= 1024 threads for any M3_WARP (32)
 *   M3_SYNCWARP()       orders shared-memory accesses among the lanes of one warp
 *   m3_warp_sum/max()   butterfly reductions over a full warp; every lane gets the result
 *   m3_shfl()           one lane's value to every lane (float / uint32_t)
 *   m3_ballot/any()     the warp's vote on a predicate: one bit a lane / whether any lane
 *   m3_block_sum/max()  reductions over a whole block (any blockDim.x that is a multiple of
 *                       M3_WARP), through a caller-provided shared array of M3_MAX_WARPS floats
 *   M3_HAVE_BLAS        1 when a vendor BLAS is available (cuBLAS; hipBLAS under hipcc if found)
 * Kernels never write 32 or 64 for the warp width: they use M3_WARP.
 *
 * Reductions: the butterfly order is fixed for a given M3_WARP, so a kernel's result is
 * deterministic run to run, but it differs from the reference's index-order sum by rounding
 * (tolerance rows say how much). */
#ifndef M3_HIP_COMPAT_H
#define M3_HIP_COMPAT_H

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
/* ---------------------------------------------------------------- AMD: the real HIP ---- */
#define M3_HIP_AMD 1
#include <hip/hip_runtime.h>
#if defined(__has_include)
#if __has_include(<hipblas/hipblas.h>)
#include <hipblas/hipblas.h>
#define M3_HAVE_BLAS 1
#elif __has_include(<hipblas.h>)
#include <hipblas.h>
#define M3_HAVE_BLAS 1
#endif
#endif
#ifndef M3_HAVE_BLAS
#define M3_HAVE_BLAS 0 /* Debian 12 ships hipcc but no hipBLAS: linear.hip uses its own GEMM */
#endif
#if M3_HAVE_BLAS
/* hipBLAS >= 6 takes a compute type; HIP 5.x took a datatype. We only use 32-bit float math. */
#if defined(HIPBLAS_V2) || (defined(hipblasVersionMajor) && hipblasVersionMajor >= 2)
#define M3_BLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#else
#define M3_BLAS_COMPUTE_32F HIPBLAS_R_32F
#endif
#define M3_BLAS_R_16BF HIPBLAS_R_16B
#define M3_BLAS_R_32F HIPBLAS_R_32F
#define M3_BLAS_GEMM_DEFAULT HIPBLAS_GEMM_DEFAULT
#endif

/* HIP 5.2 has only the mask-less shuffles; a wavefront always runs converged here. */
#define M3_SHFL_XOR(v, lane_mask) __shfl_xor((v), (lane_mask))
/* Order shared-memory accesses among the lanes of one wavefront (lockstep hardware; this
 * stops the compiler from moving loads and stores across it). */
#define M3_SYNCWARP() __builtin_amdgcn_wave_barrier()

#else
/* ---------------------------------------------------------- NVIDIA: HIP names -> CUDA --- */
#define M3_HIP_NVIDIA 1
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#define M3_HAVE_BLAS 1

/* errors */
#define hipError_t cudaError_t
#define hipSuccess cudaSuccess
#define hipErrorNotReady cudaErrorNotReady
#define hipGetErrorString cudaGetErrorString
#define hipGetErrorName cudaGetErrorName
#define hipGetLastError cudaGetLastError
#define hipPeekAtLastError cudaPeekAtLastError
/* device */
#define hipDeviceProp_t cudaDeviceProp
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipSetDevice cudaSetDevice
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipMemGetInfo cudaMemGetInfo
#define hipFuncSetAttribute cudaFuncSetAttribute
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
/* memory */
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipHostMalloc(p, n, flags) cudaMallocHost((p), (n))
#define hipHostFree cudaFreeHost
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemsetAsync cudaMemsetAsync
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
/* streams and events */
#define hipStream_t cudaStream_t
#define hipStreamCreateWithFlags cudaStreamCreateWithFlags
#define hipStreamNonBlocking cudaStreamNonBlocking
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamSynchronize cudaStreamSynchronize
#define hipEvent_t cudaEvent_t
#define hipEventCreate cudaEventCreate
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
/* BLAS (hipBLAS names -> cuBLAS) */
#define hipblasHandle_t cublasHandle_t
#define hipblasStatus_t cublasStatus_t
#define HIPBLAS_STATUS_SUCCESS CUBLAS_STATUS_SUCCESS
#define hipblasCreate cublasCreate
#define hipblasDestroy cublasDestroy
#define hipblasSetStream cublasSetStream
#define hipblasGemmEx cublasGemmEx
#define hipblasOperation_t cublasOperation_t
#define HIPBLAS_OP_N CUBLAS_OP_N
#define HIPBLAS_OP_T CUBLAS_OP_T
#define M3_BLAS_R_16BF CUDA_R_16BF
#define M3_BLAS_R_32F CUDA_R_32F
#define M3_BLAS_COMPUTE_32F CUBLAS_COMPUTE_32F /* true fp32: no TF32, no fast bf16x3 */
#define M3_BLAS_GEMM_DEFAULT CUBLAS_GEMM_DEFAULT
/* cuBLAS has no hipblasStatusToString; ours is enough for one-line messages */
static inline const char *m3_blas_status_str(cublasStatus_t s) { return cublasGetStatusString(s); }

#define M3_SHFL_XOR(v, lane_mask) __shfl_xor_sync(0xffffffffu, (v), (lane_mask))
#define M3_SYNCWARP() __syncwarp()
#endif

#if defined(M3_HIP_AMD) && M3_HAVE_BLAS
static inline const char *m3_blas_status_str(hipblasStatus_t s) {
    return s == HIPBLAS_STATUS_SUCCESS ? "success" : "hipBLAS error";
}
#endif

/* ---- warp width ------------------------------------------------------------------------ */
#if defined(M3_HIP_AMD)
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define M3_WARP __AMDGCN_WAVEFRONT_SIZE /* device pass: the compiler knows the target */
#else
#define M3_WARP 64 /* host pass: CDNA targets only (gfx90a, gfx942, gfx950) */
#endif
#else
#define M3_WARP 32
#endif
#define M3_MAX_WARPS 32 /* 1024 threads / narrowest warp (32) */

/* ---- reductions (device) --------------------------------------------------------------- */
#if defined(__CUDACC__) || defined(__HIPCC__)
/* Lane src's v within groups of `width` lanes (a power of two <= M3_WARP), every lane of the
 * full warp taking part (HIP 5.2 has only the mask-less, int / float shuffles). */
static __device__ __forceinline__ float m3_shfl(float v, int src, int width = M3_WARP) {
#if defined(M3_HIP_AMD)
    return __shfl(v, src, width);
#else
    return __shfl_sync(0xffffffffu, v, src, width);
#endif
}
static __device__ __forceinline__ uint32_t m3_shfl(uint32_t v, int src, int width = M3_WARP) {
#if defined(M3_HIP_AMD)
    return (uint32_t)__shfl((int)v, src, width);
#else
    return __shfl_sync(0xffffffffu, v, src, width);
#endif
}
/* The warp's vote on p, one bit a lane (32- or 64-lane warps), and whether any lane voted. */
static __device__ __forceinline__ uint64_t m3_ballot(bool p) {
#if defined(M3_HIP_AMD)
    return (uint64_t)__ballot(p);
#else
    return (uint64_t)__ballot_sync(0xffffffffu, p);
#endif
}
static __device__ __forceinline__ bool m3_any(bool p) {
#if defined(M3_HIP_AMD)
    return __any(p);
#else
    return __any_sync(0xffffffffu, p);
#endif
}
/* Butterfly over all M3_WARP lanes: log2(M3_WARP) steps, every lane ends with the total. */
static __device__ __forceinline__ float m3_warp_sum(float v) {
#pragma unroll
    for (int m = M3_WARP / 2; m > 0; m >>= 1) v += M3_SHFL_XOR(v, m);
    return v;
}

static __device__ __forceinline__ float m3_warp_max(float v) {
#pragma unroll
    for (int m = M3_WARP / 2; m > 0; m >>= 1) v = fmaxf(v, M3_SHFL_XOR(v, m));
    return v;
}

/* Block-wide sum; blockDim.x must be a multiple of M3_WARP. `sh` is a __shared__ float
 * array of M3_MAX_WARPS entries. Every thread returns the total. Contains barriers: call
 * it from all threads of the block. The order is fixed: warp butterflies, then warp
 * partials in warp order (by one warp), so results are reproducible. */
static __device__ __forceinline__ float m3_block_sum(float v, float *sh) {
    const int lane = (int)threadIdx.x % M3_WARP, wid = (int)threadIdx.x / M3_WARP;
    const int n_warp = (int)blockDim.x / M3_WARP;
    v = m3_warp_sum(v);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float t = lane < n_warp ? sh[lane] : 0.0f;
    return m3_warp_sum(t);
}

static __device__ __forceinline__ float m3_block_max(float v, float *sh) {
    const int lane = (int)threadIdx.x % M3_WARP, wid = (int)threadIdx.x / M3_WARP;
    const int n_warp = (int)blockDim.x / M3_WARP;
    v = m3_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float t = lane < n_warp ? sh[lane] : -INFINITY;
    return m3_warp_max(t);
}
#endif

/* ---- tensor-core tile (device) ----------------------------------------------------------
 * m3_mma_bf16_16816(c, a, b): c[16x8] += a[16x16] * b[16x8], bf16 inputs, fp32 accumulate,
 * one warp (NVIDIA sm_80+ mma.sync.m16n8k16.row.col). Fragment layout per lane (g = lane/4,
 * t = lane%4): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] =
 * A[g+8][2t+8..]; b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g] (pairs packed low first);
 * c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1].
 * M3_HAVE_MMA is 1 only in an NVIDIA device pass for sm_80+; kernels keep a portable path
 * (plain fp32 FMAs from shared memory) for AMD and for the host pass. */
#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define M3_HAVE_MMA 1
static __device__ __forceinline__ void m3_mma_bf16_16816(float *c, const uint32_t *a,
                                                         const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* the same with fp16 inputs (the same fragment layouts): e4m3 codes unpacked to fp16 are exact */
static __device__ __forceinline__ void m3_mma_f16_16816(float *c, const uint32_t *a,
                                                        const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#else
#define M3_HAVE_MMA 0
#endif

/* ---- fp8 e4m3fn decode (device) -----------------------------------------------------------
 * M3_HAVE_FP8_CVT: NVIDIA sm_89+ converts two e4m3fn codes to two halves in one instruction
 * (cvt.rn.f16x2.e4m3x2); every e4m3fn value, NaN included, is exact in fp16 and fp32, so this
 * equals ref/num/fp8.h's m3_fp8_to_f32 code for code (tests/gpu_moe.c checks it through the
 * MXFP8 GEMMs). m3_e4m3x4_to_f32 decodes the four codes of q (byte i = element i). Without
 * the instruction it calls m3_fp8_to_f32 (include ref/num/fp8.h before using it). */
#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define M3_HAVE_FP8_CVT 1
static __device__ __forceinline__ void m3_e4m3x4_to_f32(uint32_t q, float *v) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(q & 0xFFFFu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(q >> 16), __NV_E4M3);
    const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&hi));
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
}
/* the four codes of q as fp16 pairs for an mma fragment: lo = bytes 0, 1, hi = bytes 2, 3 (the
 * 16-bit halves split by a mov, so each half feeds its unpack without a shift); a NaN code
 * gives an fp16 NaN */
static __device__ __forceinline__ void m3_e4m3x4_to_f16x2(uint32_t q, uint32_t &lo, uint32_t &hi) {
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.rn.f16x2.e4m3x2 %0, l; cvt.rn.f16x2.e4m3x2 %1, h; }"
        : "=r"(lo), "=r"(hi) : "r"(q));
}
#else
#define M3_HAVE_FP8_CVT 0
#endif

/* ---- Hopper warpgroup MMA (wgmma) and its ordering primitives (helper wg, session 7) ----------
 * M3_HAVE_WGMMA is 1 only in an NVIDIA device pass for the arch-specific target sm_90a
 * (__CUDA_ARCH_FEAT_SM90_ALL; the Makefile builds -gencode arch=compute_90a,code=sm_90a):
 * wgmma is not part of plain sm_90 nor of any later arch's PTX. Kernels using it keep another
 * path (tile2_k in gpu/moe.hip) and the host launches them only where the device pass had it.
 * PTX ISA facts these rely on (section "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
 *   - a warpgroup is 4 consecutive warps, the first with a warp index divisible by 4; the four
 *     execute every wgmma instruction together (.sync.aligned: all threads, same operands).
 *   - wgmma.mma_async is asynchronous: its accumulator registers and shared-memory operands
 *     must not be touched until a wgmma.wait_group says its group completed.
 *   - wgmma.fence orders this warpgroup's earlier register accesses (and shared-memory writes
 *     seen through the async proxy) before the following wgmma.mma_async; it is required
 *     before the first wgmma and whenever the accumulators were written by other instructions.
 *   - wgmma.commit_group closes the uncommitted wgmma operations into one group;
 *     wgmma.wait_group N waits until at most N groups of this warpgroup are pending.
 *   - the tensor cores read shared memory through the async proxy: shared memory written by
 *     ordinary stores or by (non-bulk) cp.async needs fence.proxy.async.shared::cta in the
 *     writing thread, after the writes are complete, before the barrier that hands them over.
 * Operand layout used here ("K-major", 128-byte swizzle): a 64-deep bf16 k-slice of R rows is
 * R rows of 128 bytes; 8-row groups are 1024 bytes apart (the stride byte offset); inside a
 * group the 16-byte chunk c of row r sits at chunk c ^ (r % 8). The tile base must be 1024-byte
 * aligned (the swizzle is a function of the address bits 4-9). A k16 step inside the slice is
 * addressed by adding 32 bytes to the descriptor's start address (the hardware applies the
 * same XOR on the resulting address). Accumulators of m64nNk16 (per warp w of the warpgroup,
 * lane g = lane / 4, t = lane % 4): d[4j + 0..1] = D[16w + g][8j + 2t .. +1], d[4j + 2..3] =
 * D[16w + g + 8][8j + 2t .. +1]: mma.sync's C fragment for each 8-column block j. */
#if defined(M3_HIP_NVIDIA) && defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define M3_HAVE_WGMMA 1
/* matrix descriptor (PTX "Matrix Descriptor Format"): bits 0-13 start address >> 4, 16-29
 * leading byte offset >> 4 (unused by swizzled K-major layouts whose k extent fits the 128-byte
 * row; 1 by convention), 32-45 stride byte offset >> 4 (1024: next 8-row group), 49-51 base
 * offset (0: 1024-byte aligned tiles), 62-63 swizzle mode (1 = 128-byte) */
static __device__ __forceinline__ uint64_t m3_wgmma_desc_sw128(uint32_t smem_addr) {
    return (uint64_t)((smem_addr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) |
           ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
static __device__ __forceinline__ void m3_wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void m3_wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void m3_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* an empty asm that claims to read and write r: keeps an accumulator in one float register
 * across the wgmma issue / wait (otherwise the compiler may move it through other registers,
 * and ptxas then inserts its own warpgroup waits: warning C7517 / C7519) */
static __device__ __forceinline__ void m3_wgmma_pin(float &r) { asm volatile("" : "+f"(r)::"memory"); }
/* the writing thread's shared-memory stores (generic proxy) made visible to the async proxy */
static __device__ __forceinline__ void m3_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* the accumulator operands of the wrappers below: 8 a macro ("+f" ties each register to d[i],
 * so the compiler keeps them live and untouched between issue and wait), and the first 64
 * register names of the instruction's accumulator list */
#define M3_WG_D8(b)                                                                               \
    "+f"(d[(b)]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3]), "+f"(d[(b) + 4]),          \
        "+f"(d[(b) + 5]), "+f"(d[(b) + 6]), "+f"(d[(b) + 7])
#define M3_WG_D64                                                                                 \
    M3_WG_D8(0), M3_WG_D8(8), M3_WG_D8(16), M3_WG_D8(24), M3_WG_D8(32), M3_WG_D8(40), M3_WG_D8(48), \
        M3_WG_D8(56)
#define M3_WG_R64                                                                                 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "    \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "    \
    "%56, %57, %58, %59, %60, %61, %62, %63"
/* d[64] (+)= A[64 x 16] * B[16 x 128]^T: bf16 from shared memory through descriptors (both
 * K-major: no transpose), fp32 accumulate; acc 0 overwrites d (scale-d false), 1 adds (the
 * caller waits before reading d) */
static __device__ __forceinline__ void m3_wgmma_m64n128k16_bf16(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" M3_WG_R64 "}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : M3_WG_D64
                 : "l"(da), "l"(db), "r"(acc));
}
/* the same for N = 192 (96 accumulators; wgmma's N runs in steps of 8 up to 256): the
 * accumulator layout extends by 8-column blocks j as above */
static __device__ __forceinline__ void m3_wgmma_m64n192k16_bf16(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {" M3_WG_R64 ", "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
                 "%96, %97, p, 1, 1, 0, 0;\n}\n"
                 : M3_WG_D64, M3_WG_D8(64), M3_WG_D8(72), M3_WG_D8(80), M3_WG_D8(88)
                 : "l"(da), "l"(db), "r"(acc));
}
#else
#define M3_HAVE_WGMMA 0
#endif
#if defined(M3_HIP_NVIDIA)
#define hipMemcpyFromSymbol cudaMemcpyFromSymbol /* (the host's question: was wgmma built?) */
#endif

#endif
