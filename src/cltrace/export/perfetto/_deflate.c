/* A fast DEFLATE encoder for the .pftrace writer's TracePacket.compressed_packets.
 *
 * cltrace's packets repeat a few templates (a launch's host slice, its end, the device slice), so
 * most of their bytes already appeared a packet or two earlier: a greedy LZ77 pass with one
 * hash probe per position finds those repeats, and RFC 1951's fixed Huffman codes spend no time on
 * building tables. The output is a zlib stream (RFC 1950: header, one final fixed-Huffman block,
 * Adler-32), which zlib, trace processor and ui.perfetto.dev inflate like any other. Its output is
 * ~1.25x zlib level 1's, at ~0.3x its CPU time (benchmarks/bench_perfetto.py prints both).
 *
 * zlib(data) -> bytes: runs without the GIL (the caller's buffers stay pinned while it does); data: a buffer,
 * or a list of buffers compressed as their concatenation (joined without the GIL too).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HASH_BITS 12
#define WINDOW 32768
#define MIN_MATCH 4
#define MAX_MATCH 258

typedef struct {
    uint8_t *out;
    size_t pos;
    uint64_t bits;
    int nbits;
} Bits;

static inline void put(Bits *b, uint32_t v, int n) {
    b->bits |= (uint64_t)v << b->nbits;
    b->nbits += n;
    if (b->nbits >= 32) {
        uint8_t *o = b->out + b->pos;
        o[0] = (uint8_t)b->bits;
        o[1] = (uint8_t)(b->bits >> 8);
        o[2] = (uint8_t)(b->bits >> 16);
        o[3] = (uint8_t)(b->bits >> 24);
        b->pos += 4;
        b->bits >>= 32;
        b->nbits -= 32;
    }
}

static void put_tail(Bits *b) {
    while (b->nbits > 0) {
        b->out[b->pos++] = (uint8_t)b->bits;
        b->bits >>= 8;
        b->nbits -= 8;
    }
    b->nbits = 0;
}

/* Fixed Huffman codes, bit-reversed for LSB-first output: literal/length symbols 0..287, and the
 * length and distance symbols with their extra bits. */
static uint16_t lit_code[288];
static uint8_t lit_len[288];
static uint16_t len_sym[MAX_MATCH + 1];
static uint8_t len_extra_n[MAX_MATCH + 1];
static uint16_t len_extra[MAX_MATCH + 1];
static uint8_t dist_code[30];
static uint8_t dist_lo[256], dist_hi[256]; /* the symbol of distance d: dist_lo[d - 1] for d <= 256, else dist_hi[(d - 1) >> 7] */
static const uint16_t dist_base[30] = {1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513,
                                       769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
static const uint8_t dist_extra_bits[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6,
                                            6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
static const uint16_t len_base[29] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27,
                                      31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t len_extra_bits[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                           2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};

static uint32_t reverse(uint32_t v, int n) {
    uint32_t r = 0;
    for (int i = 0; i < n; i++) r |= ((v >> i) & 1) << (n - 1 - i);
    return r;
}

static void init_tables(void) {
    for (int s = 0; s < 288; s++) {
        int n;
        uint32_t c;
        if (s < 144) { n = 8; c = 0x30 + s; }
        else if (s < 256) { n = 9; c = 0x190 + (s - 144); }
        else if (s < 280) { n = 7; c = s - 256; }
        else { n = 8; c = 0xC0 + (s - 280); }
        lit_code[s] = (uint16_t)reverse(c, n);
        lit_len[s] = (uint8_t)n;
    }
    for (int k = 0; k < 29; k++) {
        int hi = k == 28 ? 258 : (k == 27 ? 257 : len_base[k + 1] - 1);
        for (int l = len_base[k]; l <= hi; l++) {
            len_sym[l] = (uint16_t)(257 + k);
            len_extra_n[l] = len_extra_bits[k];
            len_extra[l] = (uint16_t)(l - len_base[k]);
        }
    }
    for (int d = 0; d < 30; d++) {
        dist_code[d] = (uint8_t)reverse(d, 5);
        for (uint32_t v = dist_base[d]; v < (d == 29 ? 32769u : dist_base[d + 1]); v++) {
            if (v <= 256) dist_lo[v - 1] = (uint8_t)d;
            else if (((v - 1) & 127) == 0) dist_hi[(v - 1) >> 7] = (uint8_t)d;
        }
    }
}


static inline int dist_index(uint32_t d) { return d <= 256 ? dist_lo[d - 1] : dist_hi[(d - 1) >> 7]; }

static inline uint32_t load32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Equal leading bytes of two little-endian words, from their XOR (non-zero). */
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define LOW_ZERO_BYTES(x) (__builtin_ctzll(x) >> 3)
#else
static inline int low_zero_bytes(uint64_t x, const uint8_t *a, const uint8_t *c) { (void)x; int k = 0; while (a[k] == c[k]) k++; return k; }
#define LOW_ZERO_BYTES(x) low_zero_bytes(x, a + len, c + len)
#endif

static inline uint32_t hash4(uint32_t v) { return (v * 2654435761u) >> (32 - HASH_BITS); }

/* Adler-32 sixteen bytes at a time: s2 += 16 * s1 + sum((16 - k) * p[k]), s1 += sum(p[k]), the same sums as
 * the byte-serial loop without its chain of dependent additions (the compiler vectorizes the block). */
static uint32_t adler32(const uint8_t *p, size_t n) {
    uint32_t a = 1, b = 0;
    while (n) {
        size_t k = n < 5552 ? n : 5552; /* the most bytes before b can overflow 32 bits */
        n -= k;
        for (; k >= 16; k -= 16, p += 16) {
            uint32_t s = 0, w = 0;
            for (int j = 0; j < 16; j++) {
                s += p[j];
                w += (uint32_t)(16 - j) * p[j];
            }
            b += 16 * a + w;
            a += s;
        }
        while (k--) { a += *p++; b += a; }
        a %= 65521;
        b %= 65521;
    }
    return (b << 16) | a;
}

static inline void literal(Bits *b, uint8_t c) { put(b, lit_code[c], lit_len[c]); }

/* Encodes n bytes into out (capacity >= n + n / 8 + 64); returns the bytes written. */
static size_t zlib_fixed(const uint8_t *in, size_t n, uint8_t *out, uint32_t *head) {
    Bits b = {out, 0, 0, 0};
    out[0] = 0x78; /* CMF: deflate, 32 KiB window */
    out[1] = 0x01; /* FLG: check bits, no dictionary, fastest */
    b.pos = 2;
    put(&b, 3, 3); /* BFINAL = 1, BTYPE = 01 (fixed Huffman) */
    memset(head, 0, sizeof(uint32_t) << HASH_BITS);
    size_t i = 0;
    while (i + MIN_MATCH <= n) {
        uint32_t v = load32(in + i);
        uint32_t h = hash4(v);
        size_t cand = head[h];
        head[h] = (uint32_t)(i + 1);
        if (cand && i + 1 - cand <= WINDOW && load32(in + cand - 1) == v) {
            const uint8_t *a = in + cand - 1, *c = in + i;
            size_t most = n - i < MAX_MATCH ? n - i : MAX_MATCH, len = MIN_MATCH;
            while (len + 8 <= most) {
                uint64_t x = load64(a + len) ^ load64(c + len);
                if (x) { len += (size_t)(LOW_ZERO_BYTES(x)); goto matched; }
                len += 8;
            }
            while (len < most && a[len] == c[len]) len++;
        matched:
            uint32_t dist = (uint32_t)(i + 1 - cand);
            uint16_t s = len_sym[len];
            put(&b, lit_code[s], lit_len[s]);
            if (len_extra_n[len]) put(&b, len_extra[len], len_extra_n[len]);
            int d = dist_index(dist);
            put(&b, dist_code[d], 5);
            if (dist_extra_bits[d]) put(&b, dist - dist_base[d], dist_extra_bits[d]);
            /* Positions inside a match are not hashed: the packets' next repeat starts after it (and
             * hashing them found fewer of those). */
            i += len;
        } else {
            literal(&b, in[i++]);
        }
    }
    while (i < n) literal(&b, in[i++]);
    put(&b, lit_code[256], lit_len[256]);
    put_tail(&b);
    uint32_t ad = adler32(in, n);
    out[b.pos++] = (uint8_t)(ad >> 24);
    out[b.pos++] = (uint8_t)(ad >> 16);
    out[b.pos++] = (uint8_t)(ad >> 8);
    out[b.pos++] = (uint8_t)ad;
    return b.pos;
}

/* The input: one buffer, or a list of them (joined without the GIL: a megabyte's join held it ~1 ms). */
typedef struct {
    Py_buffer *b;
    Py_ssize_t k;
    size_t n;
} pieces;

static void pieces_release(pieces *p) {
    for (Py_ssize_t i = 0; i < p->k; i++) PyBuffer_Release(&p->b[i]);
    PyMem_Free(p->b);
}

static int pieces_from(PyObject *arg, pieces *p) {
    int list = PyList_Check(arg);
    Py_ssize_t k = list ? PyList_GET_SIZE(arg) : 1;
    p->b = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Py_buffer));
    p->k = 0;
    p->n = 0;
    if (!p->b) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (PyObject_GetBuffer(list ? PyList_GET_ITEM(arg, i) : arg, &p->b[i], PyBUF_SIMPLE) < 0) {
            pieces_release(p);
            return -1;
        }
        p->k = i + 1;
        p->n += (size_t)p->b[i].len;
    }
    return 0;
}

static PyObject *py_zlib(PyObject *self, PyObject *arg) {
    pieces in;
    if (pieces_from(arg, &in) < 0) return NULL;
    size_t n = in.n, cap = n + n / 8 + 64;
    if (n > 0x7fffffff) {
        pieces_release(&in);
        PyErr_SetString(PyExc_ValueError, "zlib(): at most 2 GiB at a time");
        return NULL;
    }
    PyObject *res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
    uint32_t *head = PyMem_RawMalloc(sizeof(uint32_t) << HASH_BITS);
    uint8_t *joined = in.k > 1 ? PyMem_RawMalloc(n ? n : 1) : NULL;
    if (!res || !head || (in.k > 1 && !joined)) {
        Py_XDECREF(res);
        PyMem_RawFree(head);
        PyMem_RawFree(joined);
        pieces_release(&in);
        return PyErr_NoMemory();
    }
    size_t got;
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *data = in.k ? (const uint8_t *)in.b[0].buf : (const uint8_t *)"";
    if (joined) {
        size_t at = 0;
        for (Py_ssize_t i = 0; i < in.k; i++) {
            memcpy(joined + at, in.b[i].buf, (size_t)in.b[i].len);
            at += (size_t)in.b[i].len;
        }
        data = joined;
    }
    got = zlib_fixed(data, n, (uint8_t *)PyBytes_AS_STRING(res), head);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(head);
    PyMem_RawFree(joined);
    pieces_release(&in);
    if (_PyBytes_Resize(&res, (Py_ssize_t)got) < 0) return NULL;
    return res;
}

static PyMethodDef methods[] = {
    {"zlib", py_zlib, METH_O, "zlib(data) -> bytes: data (a buffer, or a list of buffers: their concatenation) as a zlib stream "
     "(fixed-Huffman DEFLATE), without the GIL."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_deflate", "Fast fixed-Huffman DEFLATE.", -1, methods};

PyMODINIT_FUNC PyInit__deflate(void) {
    init_tables();
    return PyModule_Create(&module);
}
