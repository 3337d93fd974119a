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
#else
#define M3_HAVE_FP8_CVT 0
#endif

#endif
