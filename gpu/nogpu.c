/* gpu/nogpu.c: linked into build/m3 when it is built without a GPU backend (plain `make`).
 * `make gpu` links the objects of gpu/ (.hip) instead. */
#include "gpu/m3_gpu.h"

m3_status m3_gpu_open(m3_gpu **g, int device) {
    (void)device;
    *g = NULL;
    return m3_errorf(M3_ERR_UNSUPPORTED, "this m3 was built without a GPU backend (use make gpu)");
}

void m3_gpu_close(m3_gpu *g) { (void)g; }

bool m3_gpu_compiled(void) { return false; }
