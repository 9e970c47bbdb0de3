/* Host side of hopper_async.cuh: TMA descriptors (CUtensorMap) through the driver's
 * cuTensorMapEncodeTiled, fetched with cudaGetDriverEntryPointByVersion so that nothing links
 * libcuda (zt's CUDA module loads the runtime only). */
#include <stdint.h>
#include "cuda/hopper_async.cuh"

namespace {

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                    CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                    CUtensorMapFloatOOBfill);

/* The driver's function, looked up once (thread-safe static initialization); NULL when missing. */
encode_tiled_fn encode_tiled(cudaError_t *err, int *query)
{
    struct lookup {
        encode_tiled_fn fn = nullptr;
        cudaError_t err = cudaSuccess;
        cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSuccess;
        lookup()
        {
            void *p = nullptr;
            /* 12000: the ABI of cuTensorMapEncodeTiled since CUDA 12.0 (unchanged since) */
            err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &query);
            if (err == cudaSuccess && query == cudaDriverEntryPointSuccess) fn = reinterpret_cast<encode_tiled_fn>(p);
        }
    };
    static lookup l;
    *err = l.err;
    *query = (int)l.query;
    return l.fn;
}

int element_bytes(CUtensorMapDataType type)
{
    switch (type) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8: return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return 2;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: return 4;
    case CU_TENSOR_MAP_DATA_TYPE_UINT64:
    case CU_TENSOR_MAP_DATA_TYPE_INT64:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

} // namespace

zt_status zt_hopper_tensor_map(CUtensorMap *map, const char *what, CUtensorMapDataType type, int rank,
                               const void *base, const uint64_t *dims, const uint64_t *strides_bytes,
                               const uint32_t *box, int swizzle_bytes)
{
    const int esize = element_bytes(type);
    if (rank < 1 || rank > 5 || esize == 0)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: TMA descriptor of rank %d, data type %d: rank must be 1-5 "
                            "and the type a plain integer or float type", what, rank, (int)type);
    if (!base || (uintptr_t)base % 16 != 0)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: TMA needs a 16-byte aligned, non-NULL global address "
                            "(got %p)", what, base);
    CUtensorMapSwizzle swizzle;
    switch (swizzle_bytes) {
    case 0: swizzle = CU_TENSOR_MAP_SWIZZLE_NONE; break;
    case 32: swizzle = CU_TENSOR_MAP_SWIZZLE_32B; break;
    case 64: swizzle = CU_TENSOR_MAP_SWIZZLE_64B; break;
    case 128: swizzle = CU_TENSOR_MAP_SWIZZLE_128B; break;
    default:
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: TMA swizzle of %d bytes; use 0, 32, 64 or 128", what,
                            swizzle_bytes);
    }
    for (int i = 0; i < rank; i++) {
        if (dims[i] == 0 || dims[i] > (1ull << 32))
            return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: TMA dimension %d has extent %llu; it must be 1..2^32", what,
                                i, (unsigned long long)dims[i]);
        if (box[i] == 0 || box[i] > 256)
            return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: TMA box dimension %d is %u; it must be 1..256", what, i,
                                box[i]);
        if (i > 0 && (strides_bytes[i - 1] % 16 != 0 || strides_bytes[i - 1] >= (1ull << 40)))
            return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: TMA stride of dimension %d is %llu bytes; it must be a "
                                "multiple of 16 below 2^40 (pad the rows to 16 bytes)", what, i,
                                (unsigned long long)strides_bytes[i - 1]);
    }
    if ((uint64_t)box[0] * esize % 16 != 0 || (swizzle_bytes && (int)box[0] * esize > swizzle_bytes))
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: TMA box of %u elements of %d bytes in the inner dimension: it "
                            "must be a multiple of 16 bytes and, with a %d-byte swizzle, at most that", what, box[0],
                            esize, swizzle_bytes);
    cudaError_t err;
    int query;
    encode_tiled_fn encode = encode_tiled(&err, &query);
    if (!encode)
        return zt_cuda_fail(ZT_ERR_DEVICE, "%s: the CUDA driver's cuTensorMapEncodeTiled is not available (%s, "
                            "entry point query result %d): TMA needs a CUDA 12.0 or newer driver", what,
                            err == cudaSuccess ? "found no symbol" : cudaGetErrorString(err), query);
    cuuint64_t gdim[5], gstride[4];
    cuuint32_t gbox[5], estride[5];
    for (int i = 0; i < rank; i++) {
        gdim[i] = dims[i];
        gbox[i] = box[i];
        estride[i] = 1;
        if (i > 0) gstride[i - 1] = strides_bytes[i - 1];
    }
    CUresult r = encode(map, type, (cuuint32_t)rank, const_cast<void *>(base), gdim, gstride, gbox, estride,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE); /* NONE fills out-of-range elements with zeros */
    if (r != CUDA_SUCCESS)
        return zt_cuda_fail(ZT_ERR_DEVICE, "%s: cuTensorMapEncodeTiled failed with CUresult %d (rank %d, inner "
                            "extent %llu, box %u x %u, swizzle %d)", what, (int)r, rank,
                            (unsigned long long)dims[0], box[0], rank > 1 ? box[1] : 1u, swizzle_bytes);
    return ZT_OK;
}

zt_status zt_hopper_tensor_map_bthd(CUtensorMap *map, const char *what, const void *base, int64_t batch,
                                    int64_t seq, int64_t heads, int64_t dim, int box_rows, int box_cols)
{
    if (batch <= 0 || seq <= 0 || heads <= 0 || dim <= 0 || box_rows <= 0 || box_cols <= 0 || box_cols > 64)
        return zt_cuda_fail(ZT_ERR_INVALID_ARG, "%s: TMA view of a [%lld][%lld][%lld][%lld] tensor in boxes of %d x %d: "
                            "every extent must be positive and a box at most 64 columns", what, (long long)batch,
                            (long long)seq, (long long)heads, (long long)dim, box_rows, box_cols);
    const uint64_t dims[4] = {(uint64_t)dim, (uint64_t)heads, (uint64_t)seq, (uint64_t)batch};
    const uint64_t strides[3] = {(uint64_t)dim * 2, (uint64_t)(heads * dim) * 2, (uint64_t)(seq * heads * dim) * 2};
    const uint32_t box[4] = {(uint32_t)box_cols, 1, (uint32_t)box_rows, 1};
    return zt_hopper_tensor_map(map, what, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, base, dims, strides, box,
                                box_cols == 64 ? 128 : 0);
}
