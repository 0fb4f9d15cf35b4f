/*
 * wire.c — the 64-byte frame header every message carries, its validation,
 * and the comparison that turns disagreeing ranks into DT_ERR_MISMATCH.
 *
 * Invariant: nothing read from a peer (socket or shared memory) is used to
 * index, size or allocate anything before dt__wire_decode() has accepted it
 * and dt__wire_check() has matched it against the receive this rank posted.
 * The check is what carries the operation descriptor: the receiver knows what
 * it called, the header says what the sender called, and any difference
 * (op, dtype, redop, count, root, tag, sequence) is reported with both.
 */
#include "comm_internal.h"

#include <stdio.h>
#include <string.h>

dt_status dt__wire_decode(const void *buf, size_t n, dt__wire_hdr *out) {
    if (n < sizeof(dt__wire_hdr))
        return dt_error_set(DT_ERR_PROTOCOL, "frame header truncated: %zu of %zu bytes", n,
                            sizeof(dt__wire_hdr));
    dt__wire_hdr h;
    memcpy(&h, buf, sizeof h); /* one copy: the source may change under us */
    if (h.magic != DT__WIRE_MAGIC)
        return dt_error_set(DT_ERR_PROTOCOL, "bad frame magic 0x%08x (expected 0x%08x)", h.magic,
                            DT__WIRE_MAGIC);
    if (h.version != DT__WIRE_VERSION)
        return dt_error_set(DT_ERR_PROTOCOL, "frame version %u, this build speaks %u",
                            (unsigned)h.version, DT__WIRE_VERSION);
    if (h.kind < DT__MSG_DATA || h.kind > DT__MSG_BYE)
        return dt_error_set(DT_ERR_PROTOCOL, "bad frame kind %u", (unsigned)h.kind);
    if (h.coll >= DT_COLL_COUNT)
        return dt_error_set(DT_ERR_PROTOCOL, "bad operation %u in frame", (unsigned)h.coll);
    if (h.dtype >= DT_DTYPE_COUNT)
        return dt_error_set(DT_ERR_PROTOCOL, "bad dtype %u in frame", (unsigned)h.dtype);
    if (h.redop >= DT_REDOP_COUNT)
        return dt_error_set(DT_ERR_PROTOCOL, "bad reduction %u in frame", (unsigned)h.redop);
    if (h.flags != 0)
        return dt_error_set(DT_ERR_PROTOCOL, "bad frame flags 0x%x", (unsigned)h.flags);
    if (h.src < 0)
        return dt_error_set(DT_ERR_PROTOCOL, "bad sender rank %d in frame", h.src);
    if (h.len > DT__WIRE_MAX_LEN || h.offset > DT__WIRE_MAX_LEN)
        return dt_error_set(DT_ERR_PROTOCOL, "frame length %llu at offset %llu exceeds %llu",
                            (unsigned long long)h.len, (unsigned long long)h.offset,
                            (unsigned long long)DT__WIRE_MAX_LEN);
    if (h.count > DT__WIRE_MAX_LEN)
        return dt_error_set(DT_ERR_PROTOCOL, "frame count %llu is absurd",
                            (unsigned long long)h.count);
    if (h.kind == DT__MSG_ABORT && (h.status <= 0 || h.status >= DT_STATUS_COUNT))
        return dt_error_set(DT_ERR_PROTOCOL, "bad status %d in abort frame", h.status);
    *out = h;
    return DT_OK;
}

void dt__desc_format(const dt__wire_hdr *d, char *buf, size_t n) {
    dt_coll c = (dt_coll)d->coll;
    switch (c) {
    case DT_COLL_BARRIER: snprintf(buf, n, "barrier #%llu", (unsigned long long)d->seq); break;
    case DT_COLL_BATCH:
        snprintf(buf, n, "sendrecv_batch of %llu transfer(s)", (unsigned long long)d->count);
        break;
    case DT_COLL_SEND:
    case DT_COLL_RECV:
        snprintf(buf, n, "%s #%llu (count %llu, %s, peer %d, tag %d)", dt_coll_name(c),
                 (unsigned long long)d->seq, (unsigned long long)d->count,
                 dt_dtype_name((dt_dtype)d->dtype), d->root, d->tag);
        break;
    case DT_COLL_BROADCAST:
    case DT_COLL_GATHER:
    case DT_COLL_SCATTER:
        snprintf(buf, n, "%s #%llu (count %llu, %s, root %d)", dt_coll_name(c),
                 (unsigned long long)d->seq, (unsigned long long)d->count,
                 dt_dtype_name((dt_dtype)d->dtype), d->root);
        break;
    case DT_COLL_REDUCE:
        snprintf(buf, n, "%s #%llu (count %llu, %s, %s, root %d)", dt_coll_name(c),
                 (unsigned long long)d->seq, (unsigned long long)d->count,
                 dt_dtype_name((dt_dtype)d->dtype), dt_redop_name((dt_redop)d->redop), d->root);
        break;
    case DT_COLL_ALLREDUCE:
    case DT_COLL_REDUCE_SCATTER:
        snprintf(buf, n, "%s #%llu (count %llu, %s, %s)", dt_coll_name(c),
                 (unsigned long long)d->seq, (unsigned long long)d->count,
                 dt_dtype_name((dt_dtype)d->dtype), dt_redop_name((dt_redop)d->redop));
        break;
    default:
        snprintf(buf, n, "%s #%llu (count %llu, %s)", dt_coll_name(c), (unsigned long long)d->seq,
                 (unsigned long long)d->count, dt_dtype_name((dt_dtype)d->dtype));
        break;
    }
}

/* Send pairs with recv: the sender's descriptor says "send to peer p", the
 * receiver's "recv from peer q"; they agree when p is the receiver, q the
 * sender, and count, dtype and tag are equal. */
static bool same_op(const dt__wire_hdr *got, const dt__wire_hdr *want, int me) {
    if (got->seq != want->seq || got->count != want->count || got->dtype != want->dtype)
        return false;
    if (want->coll == DT_COLL_RECV)
        return got->coll == DT_COLL_SEND && got->root == me && want->root == got->src &&
               got->tag == want->tag;
    if (got->coll != want->coll || got->tag != want->tag)
        return false;
    switch ((dt_coll)want->coll) {
    case DT_COLL_ALLREDUCE:
    case DT_COLL_REDUCE_SCATTER: return got->redop == want->redop;
    case DT_COLL_REDUCE: return got->redop == want->redop && got->root == want->root;
    case DT_COLL_BROADCAST:
    case DT_COLL_GATHER:
    case DT_COLL_SCATTER: return got->root == want->root;
    default: return true;
    }
}

dt_status dt__wire_check(const dt__wire_hdr *got, const dt__wire_hdr *want, int me, int from,
                         uint64_t expect_offset, uint64_t expect_len) {
    char a[160], b[160];
    if (got->src != from)
        return dt_error_set(DT_ERR_PROTOCOL, "frame on the link from rank %d claims sender %d",
                            from, got->src);
    if (got->kind == DT__MSG_ABORT)
        return dt__abort_error(got->src, (dt_status)got->status, got->root, INT32_MAX, false);
    if (got->kind == DT__MSG_BYE)
        return dt_error_set(DT_ERR_PEER,
                            "rank %d left the group (destroyed it) while this rank "
                            "still expected data from it",
                            got->src);
    if (!same_op(got, want, me)) {
        dt__desc_format(got, a, sizeof a);
        dt__desc_format(want, b, sizeof b);
        return dt_error_set(DT_ERR_MISMATCH, "rank %d called %s but rank %d called %s", got->src, a,
                            me, b);
    }
    if (got->offset != expect_offset || got->len != expect_len) {
        dt__desc_format(want, b, sizeof b);
        return dt_error_set(DT_ERR_PROTOCOL,
                            "frame from rank %d in %s carries bytes [%llu, +%llu), expected "
                            "[%llu, +%llu)",
                            got->src, b, (unsigned long long)got->offset,
                            (unsigned long long)got->len, (unsigned long long)expect_offset,
                            (unsigned long long)expect_len);
    }
    return DT_OK;
}

dt_status dt__abort_error(int from, dt_status st, int lost, int size, bool from_store) {
    const char *how = from_store ? ", its store record" : "";
    if (st == DT_ERR_MISMATCH)
        return dt_error_set(st, "rank %d gave up (%s%s): its call differs from another rank's",
                            from, dt_status_name(st), how);
    if (lost >= 0 && lost < size)
        return dt_error_set(st, "rank %d gave up (%s%s): rank %d is lost", from, dt_status_name(st),
                            how, lost);
    return dt_error_set(st, "rank %d gave up (%s%s)", from, dt_status_name(st), how);
}

bool dt__is_p2p(unsigned coll) {
    return coll == DT_COLL_SEND || coll == DT_COLL_RECV || coll == DT_COLL_BATCH;
}

bool dt__abort_later(uint64_t seq, const dt__wire_hdr *cur, bool busy) {
    if (dt__is_p2p(cur->coll))
        return seq > 0 && !busy;
    return seq > 0 && seq > cur->seq;
}

dt_status dt__wire_early(const dt__wire_hdr *got, const dt__wire_hdr *cur, int me, int from) {
    if (got->kind != DT__MSG_DATA || got->src != from)
        return DT_OK; /* aborts and goodbyes are handled where they are read */
    /* Point-to-point frames are numbered per peer, collectives globally: only
     * frames and operations of the collective kind are comparable. */
    if (dt__is_p2p(got->coll) || dt__is_p2p(cur->coll) || got->seq > cur->seq)
        return DT_OK; /* a later operation: the peer is simply ahead */
    if (got->seq == cur->seq && same_op(got, cur, me))
        return DT_OK; /* ours, the algorithm will post its receive */
    char a[160], b[160];
    dt__desc_format(got, a, sizeof a);
    dt__desc_format(cur, b, sizeof b);
    return dt_error_set(DT_ERR_MISMATCH, "rank %d called %s but rank %d called %s", got->src, a, me,
                        b);
}
