/* Matrix products through cuBLASLt: bf16 or fp16 inputs (the context's type, CUDA_R_16BF / CUDA_R_16F), fp32 accumulation, bf16 or fp32 output.
 *
 * zt's matrices are row-major; cuBLAS's are column-major. A row-major C[M,N] is the column-major
 * C^T[N,M] with the same leading dimension, and C^T = op(B)^T op(A)^T, so every call passes B as
 * cuBLAS's first operand and A as its second, with M and N swapped. No data moves.
 */
#include <string.h>
#include "cuda/common.cuh"

static int pointer_alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int align = 256;
    while (align > 1 && a % (uintptr_t)align) align /= 2;
    return align;
}

static zt_status lt_fail(const char *what, cublasStatus_t s, int64_t M, int64_t N, int64_t K)
{
    return zt_cuda_fail(ZT_ERR_DEVICE, "GEMM %lldx%lldx%lld: %s failed: %s", (long long)M,
                        (long long)N, (long long)K, what, cublasGetStatusString(s));
}

/* Builds the cuBLASLt descriptors and picks the algorithm for one problem. */
static zt_status make_plan(zt_cuda_ctx *ctx, zt_gemm_plan *p, int trans_a, int trans_b, int64_t M,
                           int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                           cudaDataType_t c_type, const int align[3], cudaDataType_t ab_type)
{
    cublasStatus_t s;
    cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* B's storage */
    cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; /* A's storage */
    memset(p, 0, sizeof *p);
    if ((s = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) != CUBLAS_STATUS_SUCCESS)
        return lt_fail("cublasLtMatmulDescCreate", s, M, N, K);
    p->used = 1; /* from here on zt_cuda_ctx_destroy / the error path release what exists */
    cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first);
    cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second);
    s = cublasLtMatrixLayoutCreate(&p->a, ab_type, trans_b ? K : N, trans_b ? N : K, ldb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&p->b, ab_type, trans_a ? M : K, trans_a ? K : M, lda);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p->c, c_type, N, M, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return lt_fail("cublasLtMatrixLayoutCreate", s, M, N, K);

    cublasLtMatmulPreference_t pref;
    if ((s = cublasLtMatmulPreferenceCreate(&pref)) != CUBLAS_STATUS_SUCCESS)
        return lt_fail("cublasLtMatmulPreferenceCreate", s, M, N, K);
    uint64_t ws = ctx->lt_workspace_bytes;
    uint32_t align_first = (uint32_t)align[1], align_second = (uint32_t)align[0],
             align_c = (uint32_t)align[2];
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                         &align_first, sizeof align_first);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                         &align_second, sizeof align_second);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                         sizeof align_c);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                         sizeof align_c);
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    s = cublasLtMatmulAlgoGetHeuristic(ctx->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &result,
                                       &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0)
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED,
                            "GEMM %lldx%lldx%lld (lda %lld, ldb %lld, ldc %lld): cuBLASLt has no "
                            "algorithm for it (%s); leading dimensions must be multiples of 8 and "
                            "pointers 16-byte aligned",
                            (long long)M, (long long)N, (long long)K, (long long)lda,
                            (long long)ldb, (long long)ldc,
                            s != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(s) : "none found");
    p->algo = result.algo;
    return ZT_OK;
}

static void release_plan(zt_gemm_plan *p)
{
    if (!p->used) return;
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    memset(p, 0, sizeof *p);
}

void zt_cuda_release_gemm_plans(zt_cuda_ctx *ctx)
{
    for (int i = 0; i < ZT_GEMM_PLAN_CACHE; i++) release_plan(&ctx->plans[i]);
}

/* Plans made by this copy of the library (each plugin links its own): a steady training step makes
 * none, so a count that grows step after step means the cache thrashes (more than
 * ZT_GEMM_PLAN_CACHE shapes in rotation) and every GEMM pays a heuristic query on the host. */
static unsigned long long plans_made;

uint64_t zt_cuda_gemm_plans_made(void) { return __atomic_load_n(&plans_made, __ATOMIC_RELAXED); }

/* The cached plan for this problem, made on first use. */
static zt_status find_plan(zt_cuda_ctx *ctx, const int64_t key[12], int trans_a, int trans_b,
                           int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                           cudaDataType_t c_type, const int align[3], zt_gemm_plan **out)
{
    for (int i = 0; i < ZT_GEMM_PLAN_CACHE; i++) {
        if (ctx->plans[i].used && memcmp(ctx->plans[i].key, key, sizeof ctx->plans[i].key) == 0) {
            *out = &ctx->plans[i];
            return ZT_OK;
        }
    }
    zt_gemm_plan *p = &ctx->plans[ctx->next_plan];
    ctx->next_plan = (ctx->next_plan + 1) % ZT_GEMM_PLAN_CACHE;
    release_plan(p);
    zt_status st = make_plan(ctx, p, trans_a, trans_b, M, N, K, lda, ldb, ldc, c_type, align,
                             zt_cuda_type16(ctx->dtype));
    if (st != ZT_OK) {
        release_plan(p);
        return st;
    }
    memcpy(p->key, key, sizeof p->key);
    __atomic_fetch_add(&plans_made, 1ull, __ATOMIC_RELAXED);
    *out = p;
    return ZT_OK;
}

/* D = op(A) op(B) (+ C when accumulate); C_in NULL means C = D (in place). */
static zt_status gemm_impl(zt_cuda_ctx *ctx, cudaStream_t stream, int trans_a, int trans_b, int64_t M,
                           int64_t N, int64_t K, const uint16_t *A, int64_t lda, const uint16_t *B,
                           int64_t ldb, const void *C_in, void *C, int32_t c_dtype, int64_t ldc,
                           int accumulate, float alpha)
{
    if (M < 0 || N < 0 || K < 0)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "GEMM: negative size M=%lld N=%lld K=%lld",
                            (long long)M, (long long)N, (long long)K);
    if (c_dtype != ZT_F32 && c_dtype != ZT_BF16 && c_dtype != ZT_F16)
        return zt_cuda_fail(ZT_ERR_UNSUPPORTED, "GEMM: output dtype %d is not ZT_F32, ZT_BF16 or ZT_F16",
                            (int)c_dtype);
    if (c_dtype != ZT_F32) c_dtype = ctx->dtype; /* 16-bit output: the context's type */
    int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
    if (lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) || ldc < (N > 1 ? N : 1))
        return zt_cuda_fail(ZT_ERR_INVALID_ARG,
                            "GEMM %lldx%lldx%lld: leading dimensions lda=%lld ldb=%lld ldc=%lld are "
                            "smaller than the rows they stride over (%lld, %lld, %lld)",
                            (long long)M, (long long)N, (long long)K, (long long)lda,
                            (long long)ldb, (long long)ldc, (long long)a_cols, (long long)b_cols,
                            (long long)N);
    if (M == 0 || N == 0) return ZT_OK;
    size_t c_size = c_dtype == ZT_F32 ? 4 : 2;
    if (K == 0) { /* cuBLASLt rejects k = 0; the product is zero */
        if (accumulate && C_in && C_in != C) {
            cudaError_t e = cudaMemcpy2DAsync(C, (size_t)ldc * c_size, C_in, (size_t)ldc * c_size,
                                              (size_t)N * c_size, (size_t)M,
                                              cudaMemcpyDeviceToDevice, stream);
            if (e != cudaSuccess)
                return zt_cuda_fail(ZT_ERR_DEVICE, "GEMM with K = 0: cudaMemcpy2DAsync failed: %s",
                                    cudaGetErrorString(e));
            return ZT_OK;
        }
        if (accumulate) return ZT_OK;
        cudaError_t e = cudaMemset2DAsync(C, (size_t)ldc * c_size, 0, (size_t)N * c_size,
                                          (size_t)M, stream);
        if (e != cudaSuccess)
            return zt_cuda_fail(ZT_ERR_DEVICE, "GEMM with K = 0: cudaMemset2DAsync failed: %s",
                                cudaGetErrorString(e));
        return ZT_OK;
    }
    if (!C_in) C_in = C;
    if (zt_cuda_small_m_gemm_fits(trans_a, trans_b, M, K, A, lda, B, ldb)) /* a decode step's linear layers */
        return zt_cuda_small_m_gemm(ctx, stream, M, N, K, alpha, A, lda, B, ldb, C_in, C, c_dtype, ldc, accumulate);
    /* C and D share one layout: the plan must suit the less aligned of the two */
    int align_cd = pointer_alignment(C) < pointer_alignment(C_in) ? pointer_alignment(C)
                                                                   : pointer_alignment(C_in);
    int align[3] = {pointer_alignment(A), pointer_alignment(B), align_cd};
    int64_t key[12] = {trans_a, trans_b, M, N, K, lda, ldb, ldc, c_dtype, accumulate != 0,
                       align[0] | align[1] << 10 | (int64_t)align[2] << 20, ctx->dtype};
    cudaDataType_t c_type = c_dtype == ZT_F32 ? CUDA_R_32F : zt_cuda_type16(ctx->dtype);
    zt_gemm_plan *plan;
    zt_status st = find_plan(ctx, key, trans_a, trans_b, M, N, K, lda, ldb, ldc, c_type, align, &plan);
    if (st != ZT_OK) return st;
    float beta = accumulate ? 1.0f : 0.0f;
    cublasStatus_t s = cublasLtMatmul(ctx->lt, plan->op, &alpha, B, plan->a, A, plan->b, &beta, C_in,
                                      plan->c, C, plan->c, &plan->algo, ctx->lt_workspace,
                                      ctx->lt_workspace_bytes, stream);
    if (s != CUBLAS_STATUS_SUCCESS) return lt_fail("cublasLtMatmul", s, M, N, K);
    return ZT_OK;
}

zt_status zt_cuda_gemm(zt_cuda_ctx *ctx, cudaStream_t stream, int trans_a, int trans_b, int64_t M,
                       int64_t N, int64_t K, const uint16_t *A, int64_t lda, const uint16_t *B,
                       int64_t ldb, void *C, int32_t c_dtype, int64_t ldc, int accumulate)
{
    return gemm_impl(ctx, stream, trans_a, trans_b, M, N, K, A, lda, B, ldb, NULL, C, c_dtype, ldc,
                     accumulate, 1.0f);
}

zt_status zt_cuda_gemm_scaled(zt_cuda_ctx *ctx, cudaStream_t stream, int trans_a, int trans_b, int64_t M,
                              int64_t N, int64_t K, float alpha, const uint16_t *A, int64_t lda,
                              const uint16_t *B, int64_t ldb, void *C, int32_t c_dtype, int64_t ldc,
                              int accumulate)
{
    return gemm_impl(ctx, stream, trans_a, trans_b, M, N, K, A, lda, B, ldb, NULL, C, c_dtype, ldc,
                     accumulate, alpha);
}

/* The residual add as the GEMM's beta = 1 epilogue: no separate add kernel, one rounding. */
zt_status zt_cuda_linear_forward_residual(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t M,
                                          int64_t N, int64_t K, const uint16_t *x,
                                          const uint16_t *w, const uint16_t *residual, uint16_t *y)
{
    if (!residual)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "linear forward with residual: residual is NULL");
    return gemm_impl(ctx, stream, 0, 1, M, N, K, x, K, w, K, residual, y, ZT_BF16, N, 1, 1.0f);
}

zt_status zt_cuda_linear_forward(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t M, int64_t N,
                                 int64_t K, const uint16_t *x, const uint16_t *w, uint16_t *y)
{
    return zt_cuda_gemm(ctx, stream, 0, 1, M, N, K, x, K, w, K, y, ZT_BF16, N, 0);
}

zt_status zt_cuda_linear_backward_input(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t M,
                                        int64_t N, int64_t K, const uint16_t *dy,
                                        const uint16_t *w, uint16_t *dx)
{
    return zt_cuda_gemm(ctx, stream, 0, 0, M, K, N, dy, N, w, K, dx, ZT_BF16, K, 0);
}

zt_status zt_cuda_linear_backward_weight(zt_cuda_ctx *ctx, cudaStream_t stream, int64_t M,
                                         int64_t N, int64_t K, const uint16_t *dy,
                                         const uint16_t *x, float *dw)
{
    return zt_cuda_gemm(ctx, stream, 1, 0, N, K, M, dy, N, x, K, dw, ZT_F32, K, 1);
}
