/*
 * tensor_internal.h — what src/tensor shares with the layers above it but
 * does not publish: oneDNN's process-wide state (onednn.c).
 */
#ifndef DTRAIN_TENSOR_INTERNAL_H
#define DTRAIN_TENSOR_INTERNAL_H

#include "dtrain/tensor.h"

/* Whether oneDNN may run here: built with libdnnl-dev, and dt_isa() is not
 * below the ISA cap oneDNN was given. The first call fixes that cap from
 * dt_isa() (oneDNN accepts it once per process, before its first kernel),
 * so every user of oneDNN (tensor's dnnl_sgemm, amp's matmul primitives)
 * must call this before its first oneDNN call. If not, `why` (may be NULL)
 * says why. Thread-safe. */
bool dt__onednn_available(char *why, size_t why_len);

#endif /* DTRAIN_TENSOR_INTERNAL_H */
