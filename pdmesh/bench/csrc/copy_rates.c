/* Two ways one core copies a KV block, for the ceilings beside the mesh's KV writes
 * (pdmesh/bench/copy_rates.py): plain stores, which read every destination line before
 * writing it unless it is already in cache, and non-temporal stores, which write whole
 * lines to memory without reading them first. Built at run time with the host's C
 * compiler; x86-64 only (SSE2, which every x86-64 CPU has). */
#include <emmintrin.h>
#include <stddef.h>

static inline __attribute__((always_inline)) void store(__m128i *at, __m128i v, int streamed) {
    if (streamed)
        _mm_stream_si128(at, v);
    else
        _mm_store_si128(at, v);
}

/* 64 bytes a step; n is a multiple of 64 and both ends are 16-byte aligned. Written out
 * rather than memcpy so that no library picks streaming stores on its own above some
 * size. Inlined into both callers with `streamed` a constant, so neither tests it. */
static inline __attribute__((always_inline)) void copy(void *dst, const void *src, size_t n, int streamed) {
    __m128i *d = (__m128i *)dst;
    const __m128i *s = (const __m128i *)src;
    for (size_t i = 0; i < n / 16; i += 4) {
        __m128i a = _mm_load_si128(s + i), b = _mm_load_si128(s + i + 1);
        __m128i c = _mm_load_si128(s + i + 2), e = _mm_load_si128(s + i + 3);
        store(d + i, a, streamed);
        store(d + i + 1, b, streamed);
        store(d + i + 2, c, streamed);
        store(d + i + 3, e, streamed);
    }
    if (streamed)
        _mm_sfence(); /* the copy is complete, and visible, on return */
}

void pdmesh_copy_stored(void *dst, const void *src, size_t n) { copy(dst, src, n, 0); }

void pdmesh_copy_streamed(void *dst, const void *src, size_t n) { copy(dst, src, n, 1); }
