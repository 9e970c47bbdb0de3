/* zt plugin ABI v1: the frozen layout. Every v1 struct's size and key field offsets, as built on
 * LP64 platforms (x86-64 and aarch64 Linux). A failing assert here means an ABI break: v1 structs may
 * only grow at their end, in a new minor version: the v1.0 size then stays checked as the offset of
 * the first appended field (and as the _SIZE_1_0 constants the readers compare struct_size with),
 * and the size check follows the newest minor. Do not edit these numbers to make a build pass.
 */
#ifndef ZT_ABI_CHECK_H
#define ZT_ABI_CHECK_H

#include <stddef.h>
#include <stdint.h>

#if defined(__cplusplus)
#define ZT_STATIC_ASSERT(cond, name) static_assert(cond, #name)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define ZT_STATIC_ASSERT(cond, name) _Static_assert(cond, #name)
#else /* C99: a negative array size fails the build */
#define ZT_STATIC_ASSERT(cond, name) typedef char zt_static_assert_##name[(cond) ? 1 : -1]
#endif

#define ZT_ABI_SIZE(T, n) ZT_STATIC_ASSERT(sizeof(T) == (n), T##_size_is_frozen)
#define ZT_ABI_OFFSET(T, f, n) ZT_STATIC_ASSERT(offsetof(T, f) == (n), T##_##f##_offset_is_frozen)

#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
ZT_ABI_SIZE(zt_tensor, 120);
ZT_ABI_OFFSET(zt_tensor, data, 0);
ZT_ABI_OFFSET(zt_tensor, ndim, 20);
ZT_ABI_OFFSET(zt_tensor, shape, 24);
ZT_ABI_OFFSET(zt_tensor, stride, 72);
ZT_ABI_SIZE(zt_option, 56);
ZT_ABI_OFFSET(zt_option, default_value, 16);
ZT_ABI_OFFSET(zt_option, min, 24);
ZT_ABI_OFFSET(zt_option, choices, 40);
ZT_ABI_OFFSET(zt_option, help, 48);
ZT_ABI_SIZE(zt_mem_stats, 32);
ZT_ABI_SIZE(zt_device_ctx, 96);
ZT_ABI_OFFSET(zt_device_ctx, total_memory, 32);
ZT_ABI_OFFSET(zt_device_ctx, compute_stream, 40);
ZT_ABI_OFFSET(zt_device_ctx, workspace_bytes, 88);
ZT_ABI_SIZE(zt_group, 16);
ZT_ABI_SIZE(zt_host, 208);
ZT_ABI_OFFSET(zt_host, ctx, 8);
ZT_ABI_OFFSET(zt_host, log, 16);
ZT_ABI_OFFSET(zt_host, cfg_bool, 32);
ZT_ABI_OFFSET(zt_host, alloc, 72);
ZT_ABI_OFFSET(zt_host, device, 96);
ZT_ABI_OFFSET(zt_host, world_rank, 104);
ZT_ABI_OFFSET(zt_host, group_get, 112);
ZT_ABI_OFFSET(zt_host, barrier, 176);
ZT_ABI_OFFSET(zt_host, parallel_for, 184);
ZT_ABI_OFFSET(zt_host, cancelled, 192);
ZT_ABI_SIZE(zt_tokenizer_info, 48);
ZT_ABI_OFFSET(zt_tokenizer_info, model_hash, 24);
ZT_ABI_OFFSET(zt_tokenizer_info, model_type, 32);
ZT_ABI_SIZE(zt_tokenizer_ops, 56);
ZT_ABI_OFFSET(zt_tokenizer_ops, open, 8);
ZT_ABI_OFFSET(zt_tokenizer_ops, id_to_piece, 48);
ZT_ABI_SIZE(zt_batch, 72);
ZT_ABI_OFFSET(zt_batch, tokens, 16);
ZT_ABI_OFFSET(zt_batch, cu_seqlens, 48);
ZT_ABI_OFFSET(zt_batch, n_loss_tokens_global, 64);
ZT_ABI_SIZE(zt_attn_args, 992);
ZT_ABI_OFFSET(zt_attn_args, batch, 24);
ZT_ABI_OFFSET(zt_attn_args, q, 32);
ZT_ABI_OFFSET(zt_attn_args, dv, 872);
ZT_ABI_SIZE(zt_kv_cache_desc, 48);
ZT_ABI_OFFSET(zt_kv_cache_desc, free_bytes, 32);
ZT_ABI_SIZE(zt_kv_stats, 96);
ZT_ABI_SIZE(zt_attention_ops, 104); /* 1.5 appended kv_prepare */
ZT_ABI_OFFSET(zt_attention_ops, kv_stats, 88);
ZT_ABI_OFFSET(zt_attention_ops, kv_prepare, 96);
ZT_STATIC_ASSERT(ZT_ATTENTION_OPS_SIZE_1_0 == 72 && ZT_ATTENTION_OPS_SIZE_1_3 == 96 && ZT_ATTENTION_OPS_SIZE_1_5 == 104,
                 zt_attention_ops_sizes);
ZT_ABI_OFFSET(zt_attention_ops, forward, 8);
ZT_ABI_OFFSET(zt_attention_ops, kv_reset, 56);
ZT_ABI_OFFSET(zt_attention_ops, release, 64);
ZT_ABI_SIZE(zt_attention_binding, 24);
ZT_ABI_SIZE(zt_param_decl, 72);
ZT_ABI_OFFSET(zt_param_decl, shape, 16);
ZT_ABI_OFFSET(zt_param_decl, tp_split_dim, 48);
ZT_ABI_OFFSET(zt_param_decl, tied_to, 64);
ZT_ABI_SIZE(zt_model_info, 104); /* 1.3 appended rms_norm_eps and rope_theta, 1.4 caps */
ZT_ABI_OFFSET(zt_model_info, params, 48);
ZT_ABI_OFFSET(zt_model_info, n_parameters, 56);
ZT_ABI_OFFSET(zt_model_info, act_bytes_per_token_layer_recompute, 72);
ZT_ABI_OFFSET(zt_model_info, rms_norm_eps, 80);
ZT_ABI_OFFSET(zt_model_info, rope_theta, 88);
ZT_ABI_OFFSET(zt_model_info, caps, 96);
ZT_STATIC_ASSERT(ZT_MODEL_INFO_SIZE_1_0 == 80 && ZT_MODEL_INFO_SIZE_1_3 == 96 && ZT_MODEL_INFO_SIZE_1_4 == 104,
                 zt_model_info_sizes);
ZT_ABI_SIZE(zt_sample_row, 32);
ZT_ABI_OFFSET(zt_sample_row, u, 16);
ZT_ABI_OFFSET(zt_sample_row, top_k, 24);
ZT_ABI_SIZE(zt_unit_call, 592); /* 1.2 appended loss_scale, 1.4 the device sampling fields */
ZT_ABI_OFFSET(zt_unit_call, loss_scale, 560);
ZT_ABI_OFFSET(zt_unit_call, sample_rows, 568);
ZT_ABI_OFFSET(zt_unit_call, sample_tokens, 576);
ZT_ABI_OFFSET(zt_unit_call, sample_n_draw, 584);
ZT_STATIC_ASSERT(ZT_UNIT_CALL_SIZE_1_0 == 560 && ZT_UNIT_CALL_SIZE_1_2 == 568 && ZT_UNIT_CALL_SIZE_1_4 == 592,
                 zt_unit_call_sizes);
ZT_ABI_OFFSET(zt_unit_call, params, 16);
ZT_ABI_OFFSET(zt_unit_call, x_in, 48);
ZT_ABI_OFFSET(zt_unit_call, dx_in, 408);
ZT_ABI_OFFSET(zt_unit_call, loss, 528);
ZT_ABI_OFFSET(zt_unit_call, kv_seq_ids, 552);
ZT_ABI_SIZE(zt_model_ops, 64); /* 1.4 appended parallelize and param_shard */
ZT_ABI_OFFSET(zt_model_ops, adapt, 40);
ZT_ABI_OFFSET(zt_model_ops, parallelize, 48);
ZT_ABI_OFFSET(zt_model_ops, param_shard, 56);
ZT_STATIC_ASSERT(ZT_MODEL_OPS_SIZE_1_0 == 40 && ZT_MODEL_OPS_SIZE_1_3 == 48 && ZT_MODEL_OPS_SIZE_1_4 == 64,
                 zt_model_ops_sizes);
ZT_ABI_SIZE(zt_model_parallel, 32);
ZT_ABI_OFFSET(zt_model_parallel, tp, 16);
ZT_STATIC_ASSERT(ZT_MODEL_PARALLEL_SIZE_1_4 == 32, zt_model_parallel_size);
ZT_ABI_SIZE(zt_param_shard, 40);
ZT_ABI_OFFSET(zt_param_shard, offset, 8);
ZT_ABI_OFFSET(zt_param_shard, replicas, 32);
ZT_STATIC_ASSERT(ZT_PARAM_SHARD_SIZE_1_4 == 40, zt_param_shard_size);
ZT_ABI_SIZE(zt_adapter_spec, 56);
ZT_ABI_OFFSET(zt_adapter_spec, scaling, 24);
ZT_ABI_OFFSET(zt_adapter_spec, target_modules, 40);
ZT_ABI_SIZE(zt_adapter_ops, 16);
ZT_ABI_OFFSET(zt_model_ops, release, 32);
/* 1.1 appended compute_copy: the v1.0 prefix (40 bytes) is unchanged, the field starts where it ended */
ZT_ABI_SIZE(zt_optim_hparams, 56); /* 1.2 appended compute_copy_dtype */
ZT_ABI_OFFSET(zt_optim_hparams, compute_copy_dtype, 48);
ZT_ABI_OFFSET(zt_optim_hparams, grad_scale, 32);
ZT_ABI_OFFSET(zt_optim_hparams, compute_copy, 40);
ZT_STATIC_ASSERT(ZT_OPTIM_HPARAMS_SIZE_1_0 == 40 && ZT_OPTIM_HPARAMS_SIZE_1_1 == 48 &&
                     ZT_OPTIM_HPARAMS_SIZE_1_2 == 56, zt_optim_hparams_sizes);
ZT_ABI_SIZE(zt_optimizer_ops, 32);
ZT_ABI_OFFSET(zt_optimizer_ops, step, 24);
ZT_ABI_SIZE(zt_unit_layout, 24);
ZT_ABI_SIZE(zt_layout, 72); /* 1.4 appended tp_replicas */
ZT_ABI_OFFSET(zt_layout, trainable_numel, 56);
ZT_ABI_OFFSET(zt_layout, tp_replicas, 64);
ZT_STATIC_ASSERT(ZT_LAYOUT_SIZE_1_0 == 56 && ZT_LAYOUT_SIZE_1_3 == 64 && ZT_LAYOUT_SIZE_1_4 == 72, zt_layout_sizes);
ZT_ABI_OFFSET(zt_layout, units, 16);
ZT_ABI_OFFSET(zt_layout, compute_dtype, 48);
ZT_ABI_SIZE(zt_step_args, 48);
ZT_ABI_OFFSET(zt_step_args, loss_scale, 40);
ZT_ABI_SIZE(zt_step_result, 16);
ZT_ABI_SIZE(zt_mem_estimate, 136);
ZT_ABI_OFFSET(zt_mem_estimate, host, 72);
ZT_ABI_SIZE(zt_estimate_in, 64);
ZT_ABI_OFFSET(zt_estimate_in, trainable, 56);
ZT_STATIC_ASSERT(ZT_ESTIMATE_IN_SIZE_1_0 == 56 && ZT_ESTIMATE_IN_SIZE_1_3 == 64, zt_estimate_in_sizes);
ZT_ABI_OFFSET(zt_estimate_in, n_parameters, 32);
ZT_ABI_OFFSET(zt_estimate_in, model, 48);
/* 1.1 appended begin_step after the v1.0 table (88 bytes), 1.3 frozen_range */
ZT_ABI_SIZE(zt_zero_ops, 104);
ZT_ABI_OFFSET(zt_zero_ops, frozen_range, 96);
ZT_ABI_OFFSET(zt_zero_ops, setup, 8);
ZT_ABI_OFFSET(zt_zero_ops, estimate, 80);
ZT_ABI_OFFSET(zt_zero_ops, begin_step, 88);
ZT_STATIC_ASSERT(ZT_ZERO_OPS_SIZE_1_0 == 88 && ZT_ZERO_OPS_SIZE_1_1 == 96 && ZT_ZERO_OPS_SIZE_1_3 == 104,
                 zt_zero_ops_sizes);
ZT_ABI_SIZE(zt_rank_grid, 36);
ZT_ABI_SIZE(zt_pp_action, 16);
ZT_ABI_SIZE(zt_parallel_ops, 32); /* 1.4 appended plan */
ZT_ABI_OFFSET(zt_parallel_ops, plan, 24);
ZT_STATIC_ASSERT(ZT_PARALLEL_OPS_SIZE_1_0 == 24 && ZT_PARALLEL_OPS_SIZE_1_4 == 32, zt_parallel_ops_sizes);
ZT_ABI_OFFSET(zt_parallel_ops, schedule, 16);
ZT_ABI_SIZE(zt_plugin, 96);
ZT_ABI_OFFSET(zt_plugin, kind, 12);
ZT_ABI_OFFSET(zt_plugin, name, 16);
ZT_ABI_OFFSET(zt_plugin, options, 40);
ZT_ABI_OFFSET(zt_plugin, caps, 56);
ZT_ABI_OFFSET(zt_plugin, probe, 64);
ZT_ABI_OFFSET(zt_plugin, ops, 88);
#endif /* LP64 */

#endif /* ZT_ABI_CHECK_H */
