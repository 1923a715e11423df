/* splitmix64's finaliser: the 64-bit mix of cltrace's C extensions (hash tables, the statistics'
 * reservoir draws, which cltrace.timeline.stats repeats in numpy). */
#ifndef CLTRACE_MIX_H
#define CLTRACE_MIX_H
#include <stdint.h>

static inline uint64_t
mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}
#endif
