/* Protobuf wire helpers shared by the .pftrace encoders (_packets.c, _writer.c): a pool of byte
 * strings (offsets and lengths into one buffer), varints, short copies. */
#ifndef CLTRACE_PERFETTO_WIRE_H
#define CLTRACE_PERFETTO_WIRE_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const uint8_t *buf;
    const int64_t *off, *len;
    Py_ssize_t n;
} strings;

static inline int
vlen(uint64_t v)
{
    int n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *
put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static inline uint8_t *
copy(uint8_t *p, const uint8_t *src, int64_t n)
{
    if (n > 16) {
        memcpy(p, src, (size_t)n);
        return p + n;
    }
    for (int64_t j = 0; j < n; j++) /* the templates are a few bytes: a libc call would cost more */
        p[j] = src[j];
    return p + n;
}

/* A pooled string's place, looked up once per run rather than once per row. */
typedef struct {
    const uint8_t *at;
    int64_t len;
} piece;

static inline piece
get(const strings *s, int64_t id)
{
    piece x = {s->buf + s->off[id], s->len[id]};
    return x;
}

/* A slice's optional fields after its name, each written where its tag is set (``at`` not NULL): the
 * flow id and the span-id annotation (both the span id), the parent, the raw device START and END. */
static inline uint8_t *
put_slice_fields(uint8_t *p, piece flow, piece a_sid, uint64_t sid, piece a_par, uint64_t par, piece a_rs,
                 uint64_t raws, piece a_re, uint64_t rawe)
{
    const piece tag[5] = {flow, a_sid, a_par, a_rs, a_re};
    const uint64_t v[5] = {sid, sid, par, raws, rawe};
    for (int j = 0; j < 5; j++)
        if (tag[j].at != NULL) {
            p = copy(p, tag[j].at, tag[j].len);
            p = put_varint(p, v[j]);
        }
    return p;
}

#endif
