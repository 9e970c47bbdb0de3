/* Hopper (sm_90) asynchronous building blocks: mbarriers, TMA tensor loads, register reallocation
 * (setmaxnreg), named barriers, and the host-side TMA descriptor (CUtensorMap) builders.
 * The device functions compile for any target but execute only on sm_90 or newer; setmaxnreg needs
 * sm_90a (include it only from files built for sm_90a when you call it). Host functions are defined in
 * hopper_tensor_map.cu (built into zt_kernels_cuda for every architecture; no -lcuda needed: the
 * driver's cuTensorMapEncodeTiled is fetched through cudaGetDriverEntryPointByVersion).
 *
 * How the pieces fit (a producer/consumer ring of STAGES shared-memory buffers):
 *   setup (all threads):  mbar_init(full[s], producer arrivals), mbar_init(empty[s], consumer arrivals)
 *                         by one thread, then mbar_fence_init() and __syncthreads().
 *   producer, use n of stage s = n % STAGES, phase = (n / STAGES) & 1:
 *       mbar_wait(empty[s], phase ^ 1)      (a fresh barrier counts its "previous" phase, parity 1,
 *                                            as complete, so the first STAGES waits return at once)
 *       mbar_arrive_expect_tx(full[s], bytes); tma_load_Nd(dst, &map, full[s], coords...)
 *   consumer:
 *       mbar_wait(full[s], phase)           (all arrivals made and all TMA bytes landed)
 *       ... read the buffer (wgmma), wgmma_wait ...
 *       mbar_arrive(empty[s])
 * TMA writes shared memory through the async proxy and wgmma reads it through the async proxy, so a
 * buffer filled by TMA needs no proxy fence before wgmma; data written with ordinary st.shared that
 * wgmma or TMA store will read needs hopper_fence_proxy_async() first.
 *
 * 128-byte swizzle: a TMA box whose inner extent is 128 bytes (64 bf16), loaded with
 * CU_TENSOR_MAP_SWIZZLE_128B into a 1024-byte aligned destination, lands exactly in the layout that
 * the K-major / MN-major sw128 wgmma descriptors of flash_wgmma.cuh read: 16-byte chunk c of row r
 * at chunk position c ^ (r % 8). A [ROWS][D] tile is loaded as D / 64 boxes, box j at byte offset
 * j * ROWS * 128. Rows outside the tensor (past its extent in any dimension) are zero-filled.
 */
#ifndef ZT_KERNELS_CUDA_HOPPER_ASYNC_CUH
#define ZT_KERNELS_CUDA_HOPPER_ASYNC_CUH

#include <cuda.h> /* CUtensorMap and its enums only: nothing of libcuda is linked */
#include <stdint.h>
#include "cuda/common.cuh"

/* ---- host: TMA descriptors ------------------------------------------------------------------- */

/* Encodes a tiled TMA descriptor for a tensor of `rank` (1-5) dims, innermost first: dims[0] is the
 * contiguous one, strides_bytes[i] the byte distance between consecutive indices of dims[i + 1]
 * (rank - 1 values, each a multiple of 16), box[] the tile extent per dim (each 1-256; with a swizzle,
 * box[0] * element size must not exceed the swizzle span). swizzle_bytes: 0 (none), 32, 64 or 128.
 * Out-of-range elements read as zero. ZT_ERR_INVALID_ARG / ZT_ERR_DEVICE with the reason recorded
 * (zt_cuda_last_error) naming `what`. */
zt_status zt_hopper_tensor_map(CUtensorMap *map, const char *what, CUtensorMapDataType type, int rank,
                               const void *base, const uint64_t *dims, const uint64_t *strides_bytes,
                               const uint32_t *box, int swizzle_bytes);

/* The common case of the flash kernels: a bf16 tensor [batch][seq][heads][dim] (dim contiguous) read
 * as boxes of box_rows sequence positions x box_cols (<= 64) columns of one (batch, head), 128-byte
 * swizzled when box_cols == 64. Coordinates in the kernel: (col, head, row, batch). */
zt_status zt_hopper_tensor_map_bthd(CUtensorMap *map, const char *what, const void *base, int64_t batch,
                                    int64_t seq, int64_t heads, int64_t dim, int box_rows, int box_cols);

/* ---- device: mbarriers ----------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t hopper_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* One thread initializes; then mbar_fence_init() and a block barrier before any other use. */
__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t arrivals)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(hopper_smem_addr(bar)), "r"(arrivals)
                 : "memory");
}

/* Makes barrier initializations visible to the async proxy (TMA's complete_tx). */
__device__ __forceinline__ void mbar_fence_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* One arrival (release semantics: this thread's earlier shared-memory writes are visible to whoever
 * then completes a wait on this phase). */
__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(hopper_smem_addr(bar)) : "memory");
}

/* One arrival that also announces `bytes` more bytes of asynchronous (TMA) transfer this phase waits
 * for. Issue it before the loads it counts. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(hopper_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

/* 1 once the phase of parity `parity` (0 or 1) has completed. The hardware suspends the thread a
 * while before returning 0. */
__device__ __forceinline__ uint32_t mbar_try_wait(uint64_t *bar, uint32_t parity)
{
    uint32_t done;
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(hopper_smem_addr(bar)), "r"(parity)
        : "memory");
    return done;
}

/* Waits (acquire) for the phase of parity `parity`. A wait that never ends is a bug in the caller's
 * arrival accounting: after about 2^28 polls (seconds) it traps, so the launch fails with an error
 * (cudaErrorLaunchFailure or an illegal-instruction error) instead of hanging the GPU.
 * Measured with ptxas 13.0: a trap (like any call: no printf here either) anywhere in a warpgroup
 * that raised its registers with setmaxnreg_inc makes ptxas allocate it only the launch count, so it
 * spills and serializes its wgmmas. Use mbar_wait_or_exit there. */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
    for (uint32_t polls = 0; !mbar_try_wait(bar, parity); polls++)
        if (polls == (1u << 28)) __trap();
}

/* mbar_wait for register-heavy (setmaxnreg_inc) warpgroups: after the same time the thread exits
 * instead of trapping, leaving its outputs unwritten (tests fill outputs with NaN first, so this
 * fails them). Pair it with a trapping mbar_wait on the other side of the same ring (the producer):
 * when consumers stop, the producer's wait for their buffers times out and traps the launch. */
__device__ __forceinline__ void mbar_wait_or_exit(uint64_t *bar, uint32_t parity)
{
    for (uint32_t polls = 0; !mbar_try_wait(bar, parity); polls++)
        if (polls == (1u << 28)) asm volatile("exit;\n" ::: "memory");
}

/* ---- device: TMA ----------------------------------------------------------------------------- */

/* Brings a descriptor (a __grid_constant__ kernel parameter) into the descriptor cache early. */
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap *map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

/* Loads the box at coordinates (c0 innermost, ...) of `map` into shared memory at dst (1024-byte
 * aligned for the 128-byte swizzle); its bytes complete_tx on `bar`. `map` must point to a
 * __grid_constant__ kernel parameter (or to global/const memory). */
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
                 ::"r"(hopper_smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(hopper_smem_addr(bar)),
                 "r"(c0), "r"(c1)
                 : "memory");
}
__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                            int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
                 ::"r"(hopper_smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(hopper_smem_addr(bar)),
                 "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}
__device__ __forceinline__ void tma_load_4d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                            int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
                 ::"r"(hopper_smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(hopper_smem_addr(bar)),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
__device__ __forceinline__ void tma_load_5d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                            int c2, int c3, int c4)
{
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n"
                 ::"r"(hopper_smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(hopper_smem_addr(bar)),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
                 : "memory");
}

/* Stores the shared-memory box at src (laid out as a load of the same map would leave it) to
 * coordinates (c0 innermost, ...) of `map`; elements outside the tensor are not written. Then
 * tma_store_commit(), and tma_store_wait_read<0>() before src is overwritten or the block exits.
 * Make ordinary st.shared writes of src visible first: hopper_fence_proxy_async() by every writer,
 * then a barrier among them. */
__device__ __forceinline__ void tma_store_4d(const CUtensorMap *map, const void *src, int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(hopper_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* Waits until at most PENDING committed store groups still read their shared-memory source. */
template <int PENDING>
__device__ __forceinline__ void tma_store_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(PENDING) : "memory");
}

/* Orders this thread's ordinary shared-memory writes before later async-proxy accesses (wgmma
 * operand reads, TMA stores) of the same bytes; follow with a barrier that the readers wait on. */
__device__ __forceinline__ void hopper_fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* ---- device: register reallocation (sm_90a) --------------------------------------------------- */

/* Every thread of the warpgroup must execute these (.sync.aligned). N: a multiple of 8 in 24..256.
 * The kernel must be compiled with __launch_bounds__(THREADS, 1) so that its launch register count
 * is 65536 / THREADS (rounded down to 8): a block's warpgroups can only take what others gave back,
 * and an increase that the block's pool cannot satisfy waits forever. E.g. 3 warpgroups (168 at
 * launch): one at 24 and two at 240; 4 warpgroups (128): one at 24 or 32, three at 160. */
template <int N>
__device__ __forceinline__ void setmaxnreg_inc()
{
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg takes a multiple of 8 in 24..256");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec()
{
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg takes a multiple of 8 in 24..256");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

/* ---- device: named barriers ------------------------------------------------------------------ */

/* Barrier `id` (1-15; 0 is __syncthreads') among `threads` threads (a multiple of 32): sync waits
 * until that many have arrived, arrive only counts this warp in. Whole warps must call them. */
__device__ __forceinline__ void named_bar_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* ---- device: bulk reduce-add to global memory (TMA engine, no tensor map) ---------------------- */

/* global[dst .. dst + bytes) += shared[src ..) as fp32, done by the TMA engine: one instruction from
 * one thread instead of a red.global per element. dst and src 16-byte aligned, bytes a multiple of
 * 16. Shared data written with st.shared needs hopper_fence_proxy_async() by its writers and a
 * barrier first. Atomic per element (other blocks may add to the same bytes); the order of the adds
 * varies, so fp32 sums can differ in the last bits between runs. */
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, const float *src, uint32_t bytes)
{
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 ::"l"(dst), "r"(hopper_smem_addr(src)), "r"(bytes)
                 : "memory");
}
/* Closes this thread's bulk operations issued since the last commit into one bulk async-group. */
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* Waits until at most N of this thread's bulk groups are still reading their shared-memory source
 * (the buffers of the others may be rewritten). */
template <int N>
__device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
/* Waits until at most N of this thread's bulk groups are incomplete (writes done too); a block must
 * not exit with its bulk operations still reading its shared memory. */
template <int N>
__device__ __forceinline__ void bulk_wait()
{
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---- appended for the warp-specialized backward (flash_backward_sm90_ws.cu) ------------------- */

/* Announces `bytes` more bytes of asynchronous (TMA) transfer for the current phase of `bar`
 * without arriving: issue it before the loads it counts; the issuing thread arrives later (e.g.
 * after writing other data of the same stage with st.shared), so the phase cannot complete before. */
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(hopper_smem_addr(bar)), "r"(bytes)
                 : "memory");
}

#endif
