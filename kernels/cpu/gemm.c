/* Blocked, packed single-precision GEMM (the GotoBLAS structure, written for clarity).
 *
 * The product is done one KC-deep slice of K at a time. For each slice, a block of about A_ROWS rows
 * of op(A) is copied ("packed") once into micro-panels of MR rows (k-major), then for every NB-wide
 * block of columns a KC x NB block of op(B) is packed into KC x NR micro-panels; both are shared by
 * all threads. Each parallel task then owns a tile of C and runs the micro-kernel for every (A
 * micro-panel, B micro-panel) pair of its tile, the A micro-panel staying in L1 and the tile's B
 * panels in L2, with a block of C in registers for the whole slice: 6 x 16 with AVX2 (or the
 * baseline, through target_clones), 12 x 32 with AVX-512 (chosen at run time). Packing makes the
 * inner loop stream both operands linearly whatever the transposes were, and packing A once per
 * slice (not once per column tile) keeps the copying a small fraction of the work.
 * The K loop is never split across threads, so results do not depend on the thread count.
 * docs/kernels.md has the measurements.
 */
#include <stdlib.h>
#include "cpu/kernels.h"
#include "cpu/simd.h"

enum {
    MR = 6,        /* rows of the register tile (AVX2 / baseline kernel) */
    MR_WIDE = 12,  /* rows of the register tile of the AVX-512 kernel */
    NR = 16,       /* columns of a packed B micro-panel; the AVX-512 kernel takes two at once */
    KC = 256,      /* most depth of one slice: an A micro-panel (6 or 12 KiB) stays in L1 */
    NB = 1024,     /* columns of op(B) packed at once (multiple of NR): 1 MiB */
    A_ROWS = 2048, /* rows of op(A) packed at once, at most (then rounded up to 12): 2 MiB */
    ROW_BLOCK = 12,      /* tiles split rows in blocks that both kernels divide evenly */
    TILE_ROW_BLOCKS = 4, /* a parallel task covers at most 4 x 12 = 48 rows ... */
    TILE_PANELS_N = 32   /* ... and 32 x NR = 512 columns of C (512 KiB of packed B, in L2) */
};

typedef struct gemm_job {
    int trans_a, trans_b;
    const float *A, *B;
    int64_t lda, ldb, ldc;
    float *C;
    float *a_pack, *b_pack;
    int64_t mr;         /* rows of an A micro-panel: MR_WIDE with the AVX-512 kernel, else MR */
    int64_t i0, j0, p0; /* origin of the current blocks: rows of C, columns of C, depth */
    int64_t mb, nb, kc; /* their extents */
    int accumulate;     /* add to C (later K slices always add) */
    int use_avx512;     /* the CPU has AVX-512: compute_tile_avx512 */
} gemm_job;

/* Two-vector lane shuffle: Clang and GCC >= 12 have __builtin_shufflevector; older GCC (Ubuntu 22.04
 * ships GCC 11) has __builtin_shuffle with the indices as a vector. */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define ZT_V8_SHUFFLE2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define ZT_V8_SHUFFLE2(a, b, ...) __builtin_shuffle(a, b, (zt_v8i){__VA_ARGS__})
#endif

/* Transposes eight rows of eight floats in registers: on return rows[i][j] is the old rows[j][i]
 * (the usual unpack / 64-bit shuffle / 128-bit permute sequence). */
ZT_CPU_INLINE void transpose_8x8(zt_v8 rows[8])
{
    zt_v8 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = ZT_V8_SHUFFLE2(rows[i], rows[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = ZT_V8_SHUFFLE2(rows[i], rows[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = ZT_V8_SHUFFLE2(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[i + 1] = ZT_V8_SHUFFLE2(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[i + 2] = ZT_V8_SHUFFLE2(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[i + 3] = ZT_V8_SHUFFLE2(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
    }
    for (int i = 0; i < 4; i++) {
        rows[i] = ZT_V8_SHUFFLE2(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        rows[i + 4] = ZT_V8_SHUFFLE2(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
}

/* dst[k * width + r] = src[r * ld + k] for r < rows, k < kc: `rows` rows of a matrix become the
 * columns of a k-major panel `width` floats wide. Eight by eight through registers (a scalar copy
 * spends one load and one store per float); inlined with constant rows and width. */
ZT_CPU_INLINE void transpose_into_panel(const float *src, int64_t ld, int rows, int64_t kc,
                                        float *restrict dst, int width)
{
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) {
        for (int r0 = 0; r0 < rows; r0 += 8) {
            int n = rows - r0 < 8 ? rows - r0 : 8;
            zt_v8 block[8];
            /* a group of fewer than 8 rows repeats its first row in the unused lanes */
            for (int i = 0; i < 8; i++) block[i] = zt_v8_load(src + (r0 + (i < n ? i : 0)) * ld + k);
            transpose_8x8(block);
            for (int i = 0; i < 8; i++) memcpy(dst + (k + i) * width + r0, &block[i], sizeof(float) * (size_t)n);
        }
    }
    for (; k < kc; k++)
        for (int r = 0; r < rows; r++) dst[k * width + r] = src[r * ld + k];
}

/* a_panel[k][r] = op(A)[row0 + r][p0 + k] for r < mr, zero past the last row of the block.
 * Inlined with a constant mr so that the full-panel copies have a fixed size. */
ZT_CPU_INLINE void pack_a_panel(const gemm_job *job, int64_t row0, int64_t mr,
                                float *restrict a_panel)
{
    int64_t end = job->i0 + job->mb;
    int64_t rows = end - row0 < mr ? end - row0 : mr;
    if (job->trans_a) { /* op(A) rows are columns of A: mr neighbours per k */
        const float *src = job->A + job->p0 * job->lda + row0;
        if (rows == mr) {
            for (int64_t k = 0; k < job->kc; k++)
                memcpy(a_panel + k * mr, src + k * job->lda, sizeof(float) * (size_t)mr);
            return;
        }
        memset(a_panel, 0, sizeof(float) * (size_t)(mr * job->kc));
        for (int64_t k = 0; k < job->kc; k++)
            for (int64_t r = 0; r < rows; r++) a_panel[k * mr + r] = src[k * job->lda + r];
    } else {
        const float *src = job->A + row0 * job->lda + job->p0;
        if (rows == mr) {
            transpose_into_panel(src, job->lda, (int)mr, job->kc, a_panel, (int)mr);
            return;
        }
        memset(a_panel, 0, sizeof(float) * (size_t)(mr * job->kc));
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t k = 0; k < job->kc; k++) a_panel[k * mr + r] = src[r * job->lda + k];
        }
    }
}

/* Asks for the `rows` x `kc` floats at src (row stride ld) to be brought into the cache. Packing
 * reads each source row in pieces of kc floats, too short for the hardware prefetcher to catch up,
 * so it would wait on memory for most of them; the packing loops call this one panel ahead. */
ZT_CPU_INLINE void prefetch_rows(const float *src, int64_t ld, int64_t rows, int64_t kc)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < kc; k += 16) __builtin_prefetch(src + r * ld + k);
    /* the last cache line of each row when kc is not a multiple of 16 */
    if (kc % 16)
        for (int64_t r = 0; r < rows; r++) __builtin_prefetch(src + r * ld + kc - 1);
}

/* Prefetches the source of the A micro-panel starting at row row0 (if the block has it). */
static void prefetch_a_panel(const gemm_job *job, int64_t row0)
{
    int64_t end = job->i0 + job->mb;
    if (row0 >= end) return;
    int64_t rows = end - row0 < job->mr ? end - row0 : job->mr;
    if (job->trans_a)
        prefetch_rows(job->A + job->p0 * job->lda + row0, job->lda, job->kc, rows);
    else
        prefetch_rows(job->A + row0 * job->lda + job->p0, job->lda, rows, job->kc);
}

/* A micro-panels [begin, end) of the current block; panel p starts at row i0 + p * mr and at
 * a_pack + p * mr * kc. */
ZT_CPU_CLONES static void pack_a_range(void *arg, int64_t begin, int64_t end)
{
    const gemm_job *job = arg;
    for (int64_t panel = begin; panel < end; panel++) {
        int64_t offset = panel * job->mr;
        prefetch_a_panel(job, job->i0 + offset + job->mr);
        if (job->mr == MR_WIDE)
            pack_a_panel(job, job->i0 + offset, MR_WIDE, job->a_pack + offset * job->kc);
        else
            pack_a_panel(job, job->i0 + offset, MR, job->a_pack + offset * job->kc);
    }
}

/* b_pack[panel][k][c] = op(B)[p0 + k][j0 + panel*NR + c], zero-padded past nb. */
ZT_CPU_CLONES static void pack_b_range(void *arg, int64_t begin, int64_t end)
{
    const gemm_job *job = arg;
    for (int64_t panel = begin; panel < end; panel++) {
        float *dst = job->b_pack + panel * NR * job->kc;
        int64_t col0 = panel * NR;
        int64_t cols = job->nb - col0 < NR ? job->nb - col0 : NR;
        if (cols < NR) memset(dst, 0, sizeof(float) * NR * job->kc);
        if (job->trans_b && panel + 1 < end) { /* the next panel's source, see prefetch_rows */
            int64_t next_cols = job->nb - col0 - NR < NR ? job->nb - col0 - NR : NR;
            prefetch_rows(job->B + (job->j0 + col0 + NR) * job->ldb + job->p0, job->ldb,
                          next_cols, job->kc);
        }
        if (job->trans_b && cols == NR) {
            transpose_into_panel(job->B + (job->j0 + col0) * job->ldb + job->p0, job->ldb, NR,
                                 job->kc, dst, NR);
        } else if (job->trans_b) {
            for (int64_t c = 0; c < cols; c++) {
                const float *src = job->B + (job->j0 + col0 + c) * job->ldb + job->p0;
                for (int64_t k = 0; k < job->kc; k++) dst[k * NR + c] = src[k];
            }
        } else {
            const float *src = job->B + job->p0 * job->ldb + job->j0 + col0;
            if (cols == NR) {
                for (int64_t k = 0; k < job->kc; k++)
                    memcpy(dst + k * NR, src + k * job->ldb, sizeof(float) * NR);
            } else {
                for (int64_t k = 0; k < job->kc; k++)
                    memcpy(dst + k * NR, src + k * job->ldb, sizeof(float) * (size_t)cols);
            }
        }
    }
}

/* acc = sum over k of a_panel[k][:] (outer) b_panel[k][:]; then C (+)= acc for the valid part. */
ZT_CPU_INLINE void micro_kernel(int64_t kc, const float *restrict ap, const float *restrict bp,
                                float *restrict c, int64_t ldc, int64_t rows, int64_t cols,
                                int accumulate)
{
    zt_v8 c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0};
    zt_v8 c30 = {0}, c31 = {0}, c40 = {0}, c41 = {0}, c50 = {0}, c51 = {0};
    for (int64_t k = 0; k < kc; k++, ap += MR, bp += NR) {
        zt_v8 b0 = zt_v8_load(bp), b1 = zt_v8_load(bp + 8);
        c00 += ap[0] * b0; c01 += ap[0] * b1;
        c10 += ap[1] * b0; c11 += ap[1] * b1;
        c20 += ap[2] * b0; c21 += ap[2] * b1;
        c30 += ap[3] * b0; c31 += ap[3] * b1;
        c40 += ap[4] * b0; c41 += ap[4] * b1;
        c50 += ap[5] * b0; c51 += ap[5] * b1;
    }
    zt_v8 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (rows == MR && cols == NR) {
        for (int r = 0; r < MR; r++) {
            float *row = c + r * ldc;
            if (accumulate) {
                acc[r][0] += zt_v8_load(row);
                acc[r][1] += zt_v8_load(row + 8);
            }
            zt_v8_store(row, acc[r][0]);
            zt_v8_store(row + 8, acc[r][1]);
        }
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        float tile_row[NR];
        zt_v8_store(tile_row, acc[r][0]);
        zt_v8_store(tile_row + 8, acc[r][1]);
        float *row = c + r * ldc;
        for (int64_t j = 0; j < cols; j++) row[j] = accumulate ? row[j] + tile_row[j] : tile_row[j];
    }
}

/* Splits `n` units (row blocks or column panels) into the fewest tiles of at most `max_per_tile`,
 * all of nearly the same size (the host's pool gives each thread one contiguous run of tasks, so
 * equal tasks mean equal work). */
static void tile_split(int64_t n, int64_t max_per_tile, int64_t *n_tiles, int64_t *per_tile)
{
    *n_tiles = (n + max_per_tile - 1) / max_per_tile;
    *per_tile = (n + *n_tiles - 1) / *n_tiles;
}

/* Rows [*row0, *row1) of the current A block (counted from i0) and B micro-panels [*pb0, *pb1)
 * covered by task `tile`. */
static void tile_bounds(const gemm_job *job, int64_t tile, int64_t *row0, int64_t *row1,
                        int64_t *pb0, int64_t *pb1)
{
    int64_t row_blocks = (job->mb + ROW_BLOCK - 1) / ROW_BLOCK, b_panels = (job->nb + NR - 1) / NR;
    int64_t tiles_m, per_tile_m, tiles_n, per_tile_n;
    tile_split(row_blocks, TILE_ROW_BLOCKS, &tiles_m, &per_tile_m);
    tile_split(b_panels, TILE_PANELS_N, &tiles_n, &per_tile_n);
    *row0 = (tile % tiles_m) * per_tile_m * ROW_BLOCK;
    *row1 = *row0 + per_tile_m * ROW_BLOCK < job->mb ? *row0 + per_tile_m * ROW_BLOCK : job->mb;
    *pb0 = (tile / tiles_m) * per_tile_n;
    *pb1 = *pb0 + per_tile_n < b_panels ? *pb0 + per_tile_n : b_panels;
}

/* One task with the 6 x 16 kernel: every A micro-panel of the tile against every B micro-panel of
 * the tile. Compiled for AVX2+FMA and for the baseline. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
static void compute_tile(const gemm_job *job, int64_t tile)
{
    int64_t row0, row1, pb0, pb1;
    tile_bounds(job, tile, &row0, &row1, &pb0, &pb1);
    for (int64_t row = row0; row < row1; row += MR) {
        int64_t rows = row1 - row < MR ? row1 - row : MR;
        const float *a_panel = job->a_pack + row * job->kc;
        for (int64_t pb = pb0; pb < pb1; pb++) {
            const float *bp = job->b_pack + pb * NR * job->kc;
            int64_t col = pb * NR;
            int64_t cols = job->nb - col < NR ? job->nb - col : NR;
            float *c = job->C + (job->i0 + row) * job->ldc + job->j0 + col;
            micro_kernel(job->kc, a_panel, bp, c, job->ldc, rows, cols, job->accumulate);
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__)
#define ZT_GEMM_AVX512 1
#define ZT_AVX512_TARGET __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))

/* Sixteen floats: one AVX-512 register. */
typedef float zt_v16 __attribute__((vector_size(64)));

ZT_CPU_INLINE zt_v16 zt_v16_load(const float *p)
{
    zt_v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

ZT_CPU_INLINE void zt_v16_store(float *p, zt_v16 v) { memcpy(p, &v, sizeof v); }

#define ZT_ROWS12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

/* The 12 x 32 (two_panels) or 12 x 16 register tile with AVX-512: 24 of the 32 zmm registers
 * accumulate, so each k costs two B loads and 12 broadcasts for 24 FMAs. */
ZT_CPU_INLINE void micro_kernel_wide(int64_t kc, const float *restrict ap, const float *restrict bp0,
                                     const float *restrict bp1, int two_panels, float *restrict c,
                                     int64_t ldc, int64_t rows, int64_t cols, int accumulate)
{
#define ZT_DECLARE(r) zt_v16 c##r##0 = {0}, c##r##1 = {0};
    ZT_ROWS12(ZT_DECLARE)
#undef ZT_DECLARE
    for (int64_t k = 0; k < kc; k++, ap += MR_WIDE) {
        zt_v16 b0 = zt_v16_load(bp0 + k * NR);
        zt_v16 b1 = two_panels ? zt_v16_load(bp1 + k * NR) : b0;
#define ZT_FMA(r)                                                                                  \
    c##r##0 += ap[r] * b0;                                                                         \
    if (two_panels) c##r##1 += ap[r] * b1;
        ZT_ROWS12(ZT_FMA)
#undef ZT_FMA
    }
#define ZT_ROW(r) {c##r##0, c##r##1},
    zt_v16 acc[MR_WIDE][2] = {ZT_ROWS12(ZT_ROW)};
#undef ZT_ROW
    int64_t width = two_panels ? 2 * NR : NR;
    for (int64_t r = 0; r < rows; r++) {
        float *row = c + r * ldc;
        if (cols == width) {
            for (int v = 0; v < (two_panels ? 2 : 1); v++) {
                zt_v16 x = acc[r][v];
                if (accumulate) x += zt_v16_load(row + v * NR);
                zt_v16_store(row + v * NR, x);
            }
        } else {
            float tile_row[2 * NR];
            zt_v16_store(tile_row, acc[r][0]);
            zt_v16_store(tile_row + NR, acc[r][1]);
            for (int64_t j = 0; j < cols; j++) row[j] = accumulate ? row[j] + tile_row[j] : tile_row[j];
        }
    }
}

/* One task with the 12 x 32 AVX-512 kernel (two B micro-panels at a time). */
ZT_AVX512_TARGET
static void compute_tile_avx512(const gemm_job *job, int64_t tile)
{
    int64_t row0, row1, pb0, pb1;
    tile_bounds(job, tile, &row0, &row1, &pb0, &pb1);
    for (int64_t row = row0; row < row1; row += MR_WIDE) {
        int64_t rows = row1 - row < MR_WIDE ? row1 - row : MR_WIDE;
        const float *a_panel = job->a_pack + row * job->kc;
        for (int64_t pb = pb0; pb < pb1; pb += 2) {
            const float *bp = job->b_pack + pb * NR * job->kc;
            int64_t col = pb * NR;
            int64_t cols = job->nb - col < 2 * NR ? job->nb - col : 2 * NR;
            float *c = job->C + (job->i0 + row) * job->ldc + job->j0 + col;
            if (pb + 1 < pb1)
                micro_kernel_wide(job->kc, a_panel, bp, bp + NR * job->kc, 1, c, job->ldc, rows,
                                  cols, job->accumulate);
            else
                micro_kernel_wide(job->kc, a_panel, bp, bp, 0, c, job->ldc, rows,
                                  cols < NR ? cols : NR, job->accumulate);
        }
    }
}
#endif

static void compute_range(void *arg, int64_t begin, int64_t end)
{
    const gemm_job *job = arg;
    for (int64_t tile = begin; tile < end; tile++) {
#ifdef ZT_GEMM_AVX512
        if (job->use_avx512) {
            compute_tile_avx512(job, tile);
            continue;
        }
#endif
        compute_tile(job, tile);
    }
}

static void zero_rows(void *arg, int64_t begin, int64_t end)
{
    const gemm_job *job = arg;
    for (int64_t i = begin; i < end; i++) memset(job->C + i * job->ldc, 0, sizeof(float) * (size_t)job->nb);
}

/* Splits `total` into the fewest slices of at most `most`, all of nearly the same size, and returns
 * the slice size. A short last slice would cost as much overhead as a full one for little work: a
 * whole pass over C for a slice of K, packing all of op(B) again for a block of rows. */
static int64_t even_slice(int64_t total, int64_t most)
{
    int64_t slices = (total + most - 1) / most;
    return (total + slices - 1) / slices;
}

zt_status zt_cpu_gemm(const zt_cpu_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N,
                      int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                      int64_t ldc, int accumulate)
{
    gemm_job job = {.trans_a = trans_a, .trans_b = trans_b, .A = A, .B = B, .lda = lda,
                    .ldb = ldb, .ldc = ldc, .C = C, .nb = N};
    if (M <= 0 || N <= 0) return ZT_OK;
    if (K <= 0) {
        if (!accumulate) zt_cpu_parallel_for(ctx, M, 64, zero_rows, &job);
        return ZT_OK;
    }
#ifdef ZT_GEMM_AVX512
    __builtin_cpu_init();
    job.use_avx512 = !(ctx && ctx->no_avx512) && __builtin_cpu_supports("avx512f") &&
                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                     __builtin_cpu_supports("avx512bw");
#endif
    job.mr = job.use_avx512 ? MR_WIDE : MR;
    /* One workspace: the A block (whole micro-panels), then the B block, 64-byte aligned so that
     * every packed micro-panel starts on a cache line. Aligned by hand: glibc serves a large
     * aligned_alloc with a fresh mmap every time (hundreds of page faults per call, measured),
     * while it keeps a freed malloc block of the same size for the next call. */
    int64_t a_rows = (even_slice(M, A_ROWS) + ROW_BLOCK - 1) / ROW_BLOCK * ROW_BLOCK;
    char *allocation = malloc(sizeof(float) * (size_t)((a_rows + NB) * KC) + 63);
    if (!allocation) return ZT_ERR_OUT_OF_MEMORY;
    float *workspace = (float *)(((uintptr_t)allocation + 63) & ~(uintptr_t)63);
    job.a_pack = workspace;
    job.b_pack = workspace + a_rows * KC;

    int64_t kc = even_slice(K, KC);
    for (int64_t p0 = 0; p0 < K; p0 += kc) {
        job.p0 = p0;
        job.kc = K - p0 < kc ? K - p0 : kc;
        job.accumulate = accumulate || p0 > 0;
        for (int64_t i0 = 0; i0 < M; i0 += a_rows) {
            job.i0 = i0;
            job.mb = M - i0 < a_rows ? M - i0 : a_rows;
            zt_cpu_parallel_for(ctx, (job.mb + job.mr - 1) / job.mr, 8, pack_a_range, &job);
            int64_t tiles_m, unused;
            tile_split((job.mb + ROW_BLOCK - 1) / ROW_BLOCK, TILE_ROW_BLOCKS, &tiles_m, &unused);
            for (int64_t j0 = 0; j0 < N; j0 += NB) {
                job.j0 = j0;
                job.nb = N - j0 < NB ? N - j0 : NB;
                int64_t tiles_n;
                tile_split((job.nb + NR - 1) / NR, TILE_PANELS_N, &tiles_n, &unused);
                zt_cpu_parallel_for(ctx, (job.nb + NR - 1) / NR, 4, pack_b_range, &job);
                zt_cpu_parallel_for(ctx, tiles_m * tiles_n, 1, compute_range, &job);
            }
        }
    }
    free(allocation);
    return ZT_OK;
}

zt_status zt_cpu_linear_forward(const zt_cpu_ctx *ctx, int64_t M, int64_t N, int64_t K,
                                const float *x, const float *w, float *y)
{
    return zt_cpu_gemm(ctx, 0, 1, M, N, K, x, K, w, K, y, N, 0);
}

zt_status zt_cpu_linear_backward_input(const zt_cpu_ctx *ctx, int64_t M, int64_t N, int64_t K,
                                       const float *dy, const float *w, float *dx)
{
    return zt_cpu_gemm(ctx, 0, 0, M, K, N, dy, N, w, K, dx, K, 0);
}

zt_status zt_cpu_linear_backward_weight(const zt_cpu_ctx *ctx, int64_t M, int64_t N, int64_t K,
                                        const float *dy, const float *x, float *dw)
{
    return zt_cpu_gemm(ctx, 1, 0, N, K, M, dy, N, x, K, dw, K, 1);
}
