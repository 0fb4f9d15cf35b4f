/*
 * piece_file.h — a replica's parameter pieces in a file on local disk
 * (ZeRO 3's `--offload params=disk:DIR`, docs/zero.md "Offload"), moved
 * between the file and their places in the parameter buffer by I/O threads
 * (pread/pwrite), so that a read ahead or a write back runs while the
 * caller computes.
 *
 * Ownership and rules:
 *   1. The file is created in DIR and unlinked at once: it lives while the
 *      object does, and a killed process leaves nothing behind. Its whole
 *      size is reserved at open (posix_fallocate), so a full disk fails
 *      there, naming DIR, never in the middle of a step.
 *   2. The object borrows `base` and the piece list: piece i is
 *      base[pieces[i].begin, pieces[i].end), stored at its own place in the
 *      file (aligned to 4 KiB).
 *   3. At most one operation per piece is queued or running: a request for
 *      a busy piece first waits for the one in flight. While piece i is
 *      busy its memory is borrowed by the I/O threads (read: written by
 *      them; write: read by them).
 *   4. A failed operation (an I/O error) is kept and returned by the next
 *      wait on that piece, with the path's directory and the cause.
 *
 * Example:
 *     dt__piece_file *f;
 *     DT_CHECK(dt__piece_file_open(&f, dir, params, mine, n, false));
 *     dt__piece_file_write(f, 0);        // piece 0 to the file, in the background
 *     DT_CHECK(dt__piece_file_wait(f, 0));
 *     dt_mem_discard(params + mine[0].begin, ...);   // out of memory
 *     dt__piece_file_read(f, 0);         // read ahead
 *     ... compute ...
 *     DT_CHECK(dt__piece_file_wait(f, 0)); // piece 0 is back in place
 *     dt__piece_file_close(f);
 */
#ifndef DTRAIN_PARALLEL_PIECE_FILE_H
#define DTRAIN_PARALLEL_PIECE_FILE_H

#include "dtrain/optim.h" /* dt_range */

typedef struct dt__piece_file dt__piece_file;

/* direct: O_DIRECT through aligned bounce buffers (falls back to buffered
 * I/O where the file system refuses it; dt__piece_file_direct says which). */
dt_status dt__piece_file_open(dt__piece_file **out, const char *dir, float *base,
                              const dt_range *pieces, size_t n, bool direct);
/* Waits for every operation in flight, then closes (and so deletes) the file. */
void dt__piece_file_close(dt__piece_file *f);
/* Queue piece i's read into its place / its write to the file. */
void dt__piece_file_read(dt__piece_file *f, size_t i);
void dt__piece_file_write(dt__piece_file *f, size_t i);
/* Piece i has an operation queued or running. */
bool dt__piece_file_busy(dt__piece_file *f, size_t i);
/* Wait for piece i's operation, if any; the status of its last one. */
dt_status dt__piece_file_wait(dt__piece_file *f, size_t i);
/* Bytes of the file, and whether it is read and written with O_DIRECT. */
size_t dt__piece_file_bytes(const dt__piece_file *f);
bool dt__piece_file_direct(const dt__piece_file *f);
/* Planning: a piece's slot in the file, and the O_DIRECT bounce buffers. */
size_t dt__piece_file_slot_bytes(size_t piece_bytes);
size_t dt__piece_file_buffer_bytes(void);

#endif
