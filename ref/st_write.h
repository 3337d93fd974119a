/* ref/st_write.h: a small safetensors writer (the format ref/weights.h reads): an 8-byte
 * little-endian header length, a JSON header {"__metadata__": {...}, name: {"dtype",
 * "shape", "data_offsets": [begin, end]}, ...} padded with spaces to a multiple of 8, then
 * the tensors' bytes back to back in the order they were added.
 *
 * Streaming: tensors are declared first (name, dtype, shape, byte size) and their bytes are
 * produced one tensor at a time by a fill callback when the file is written, so a writer
 * never holds more than the largest tensor. The file is written as PATH.tmp and renamed to
 * PATH only when complete (a failure leaves no PATH and removes the temp file). */
#ifndef M3_ST_WRITE_H
#define M3_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "ref/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct m3_st_writer m3_st_writer;

/* Produce tensor i's nbytes bytes into buf (caller-sized). */
typedef m3_status (*m3_st_fill_fn)(void *ctx, int64_t i, uint8_t *buf, size_t nbytes);

m3_status m3_st_writer_create(m3_st_writer **w);
void m3_st_writer_free(m3_st_writer *w); /* NULL ok */

/* Declare tensor number m3_st_count(w) (the index the fill callback receives). nbytes must
 * equal numel x element size (F4 / packed U8 as the caller means them); names unique. */
m3_status m3_st_add(m3_st_writer *w, const char *name, m3_dtype dt, int rank, const int64_t *shape,
                    size_t nbytes);
int64_t m3_st_count(const m3_st_writer *w);

/* Write PATH (via PATH.tmp + rename). metadata: string pairs for __metadata__ (may be NULL
 * with n_meta 0), e.g. {"format", "pt"}. */
m3_status m3_st_write(m3_st_writer *w, const char *path, const char *const (*metadata)[2],
                      int n_meta, m3_st_fill_fn fill, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
