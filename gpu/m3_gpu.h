/* gpu/m3_gpu.h: the C ABI of the GPU backend (plain C, no HIP types). Every entry point
 * m3_gpu_<component> has a reference twin m3_<component> in ref/ with the same argument
 * order; pointers named d_* are device pointers. */
#ifndef M3_GPU_H
#define M3_GPU_H

#include "ref/base.h"
#include "ref/num/num.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct m3_gpu m3_gpu; /* context: device, stream, BLAS handle, arena */

/* true when this binary has the GPU backend compiled in */
bool m3_gpu_compiled(void);
m3_status m3_gpu_open(m3_gpu **g, int device);
void m3_gpu_close(m3_gpu *g); /* NULL ok */

#ifdef __cplusplus
}
#endif
#endif
