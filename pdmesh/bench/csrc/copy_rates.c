/* Two ways one core copies a KV block, for the ceilings beside the mesh's KV writes
 * (pdmesh/bench/copy_rates.py): plain stores, which read every destination line before
 * writing it unless it is already in cache, and non-temporal stores, which write whole
 * lines to memory without reading them first. Built at run time with the host's C
 * compiler; x86-64 only (SSE2, which every x86-64 CPU has). */
#include <emmintrin.h>
#include <stddef.h>
#include <stdint.h>

/* 64 bytes a step with ordinary 16-byte stores; n is a multiple of 64, both ends are
 * 16-byte aligned. Written out rather than memcpy so no library picks streaming stores
 * for us above some size of its own. */
void pdmesh_copy_stored(void *dst, const void *src, size_t n) {
    __m128i *d = (__m128i *)dst;
    const __m128i *s = (const __m128i *)src;
    for (size_t i = 0; i < n / 16; i += 4) {
        __m128i a = _mm_load_si128(s + i), b = _mm_load_si128(s + i + 1);
        __m128i c = _mm_load_si128(s + i + 2), e = _mm_load_si128(s + i + 3);
        _mm_store_si128(d + i, a);
        _mm_store_si128(d + i + 1, b);
        _mm_store_si128(d + i + 2, c);
        _mm_store_si128(d + i + 3, e);
    }
}

/* The same with non-temporal stores, fenced so the copy is complete on return. */
void pdmesh_copy_streamed(void *dst, const void *src, size_t n) {
    __m128i *d = (__m128i *)dst;
    const __m128i *s = (const __m128i *)src;
    for (size_t i = 0; i < n / 16; i += 4) {
        __m128i a = _mm_load_si128(s + i), b = _mm_load_si128(s + i + 1);
        __m128i c = _mm_load_si128(s + i + 2), e = _mm_load_si128(s + i + 3);
        _mm_stream_si128(d + i, a);
        _mm_stream_si128(d + i + 1, b);
        _mm_stream_si128(d + i + 2, c);
        _mm_stream_si128(d + i + 3, e);
    }
    _mm_sfence();
}
