"""The operators a program read from a ``.pt2`` may call, as data: each a function of its arguments alone.

A saved program's nodes name their operators, and running the program calls them; some ATen operators
read or write files, print, change state the whole process shares, or trust their arguments to stay in
bounds. So edgefuse runs a program from a file only when every node calls an operator listed here:

- :data:`FUNCTIONAL`: ATen (and ExecuTorch's ``dim_order_ops``) overloads whose schema writes no argument,
  takes no random number generator, is not tagged ``nondeterministic_seeded`` (the global generator) and
  returns tensors, numbers or lists of them (:func:`schema_refusal`), less the :data:`EXCEPTIONS` (each with
  its reason) and the :data:`KINDS` refused by name;
- :data:`IN_PLACE`: the in-place forms of those (``add_.Tensor``), which write their ``self`` alone; what
  they may write is checked where the program is read (a tensor it made, a buffer or an input);
- :data:`WHEN`: overloads allowed only while an argument holds a value (``dropout`` with ``train=False``,
  which then draws no random number);
- :data:`HIGHER_ORDER`: the higher-order operators whose subgraphs are checked like the program;
- :data:`SYMBOLIC`: the arithmetic on sizes torch writes (``_operator.mul``, ``torch.sym_max``).

The lists were made from this torch's schemas by :func:`allowed_by_rule` (``python -m
edgefuse.inputs.pt2_ops`` prints them again); a test checks each entry against its schema, so a torch whose
operators differ fails it instead of widening what runs. Reading a ``.pt2`` needs no schema: it looks
names up here.
"""

from __future__ import annotations

import re

#: The namespaces whose operators are listed, and what loads them: ATen is torch's own; a program can carry
#: ExecuTorch's ``dim_order_ops`` once ``executorch.exir`` is imported (torch.export writes them by name).
NAMESPACES = {"aten": None, "dim_order_ops": "executorch.exir.passes.dim_order_ops_registry"}

_UNCHECKED = "(it crashed torch 2.13 when tried with such arguments)"
_DATA_SIZED = ("the size of its output is computed from its input's values, so no bound on it can be checked "
               "before it runs")

#: Operators refused whatever their schema says: ``namespace::name`` (every overload) or
#: ``namespace::name.overload``, and why.
EXCEPTIONS: dict[str, str] = {
    # Files, output, state of the process.
    "aten::from_file": "maps the file its argument names into memory (shared=True writes the file through it)",
    "aten::_print": "prints its argument on the process's standard output",
    "aten::set.source_Storage": "points a tensor at a Storage, memory no tensor of the program holds",
    "aten::set.source_Storage_storage_offset": "points a tensor at a Storage, memory no tensor of the program "
                                               "holds",
    "aten::_copy_from": "copies into its dst argument, which its schema does not mark as written",
    "aten::_copy_from_and_resize": "copies into and resizes its dst argument, which its schema does not mark "
                                   "as written",
    "aten::_propagate_xla_data": "writes the metadata of its output argument, which its schema does not mark "
                                 "as written",
    "aten::_backward": "runs autograd, which writes the gradients of leaf tensors",
    "aten::_cufft_set_plan_cache_max_size": "changes a cache every CUDA FFT of the process shares",
    "aten::_cufft_clear_plan_cache": "changes a cache every CUDA FFT of the process shares",
    "aten::_pin_memory": "allocates page-locked host memory through an accelerator's allocator",
    "aten::pin_memory": "allocates page-locked host memory through an accelerator's allocator",
    # Outputs whose size is data.
    "aten::nonzero": _DATA_SIZED,
    "aten::nonzero_numpy": _DATA_SIZED,
    "aten::argwhere": _DATA_SIZED,
    "aten::masked_select": _DATA_SIZED,
    "aten::_unique": _DATA_SIZED,
    "aten::_unique2": _DATA_SIZED,
    "aten::unique_consecutive": _DATA_SIZED,
    "aten::unique_dim": _DATA_SIZED,
    "aten::unique_dim_consecutive": _DATA_SIZED,
    "aten::repeat_interleave.Tensor": _DATA_SIZED,
    "aten::repeat_interleave.self_Tensor": _DATA_SIZED,
    "aten::bincount": _DATA_SIZED,
    # Kernels that trust their arguments to stay in bounds.
    "aten::_sparse_coo_tensor_unsafe": f"makes a sparse tensor from indices it does not check {_UNCHECKED}",
    "aten::_sparse_coo_tensor_with_dims_and_tensors": "makes a sparse tensor from indices it does not check",
    "aten::_sparse_compressed_tensor_unsafe": "makes a sparse tensor from indices it does not check",
    "aten::_sparse_csr_tensor_unsafe": "makes a sparse tensor from indices it does not check",
    "aten::_sparse_csc_tensor_unsafe": "makes a sparse tensor from indices it does not check",
    "aten::_sparse_bsr_tensor_unsafe": "makes a sparse tensor from indices it does not check",
    "aten::_sparse_bsc_tensor_unsafe": "makes a sparse tensor from indices it does not check",
    "aten::_reshape_alias": f"views its input with strides it does not check against its storage {_UNCHECKED}",
    "aten::_reshape_alias_copy": "views its input with strides it does not check against its storage",
    "aten::_convert_indices_from_coo_to_csr": f"reads where its input's values point, unchecked {_UNCHECKED}",
    "aten::_convert_indices_from_csr_to_coo": f"reads where its input's values point, unchecked {_UNCHECKED}",
    "aten::ctc_loss": f"reads at the labels its targets hold, unchecked {_UNCHECKED}",
    "aten::_ctc_loss": f"reads at the labels its targets hold, unchecked {_UNCHECKED}",
    "aten::_sobol_engine_draw": f"reads its state at the dimension its argument gives, unchecked {_UNCHECKED}",
    "aten::_fft_c2c": f"transforms the dims its argument gives, unchecked {_UNCHECKED}; fft_* check them",
    "aten::_fft_r2c": "transforms the dims its argument gives, unchecked; fft_* check them",
    "aten::_fft_c2r": "transforms the dims its argument gives, unchecked; fft_* check them",
    "aten::_transform_bias_rescale_qkv": "reads its bias past its end when their sizes disagree",
    "aten::_foobar": "one of torch's own test operators",
}

#: Kinds of operator refused by a part of their name, and why.
KINDS: dict[str, str] = {
    "backward": "a gradient kernel: torch.export saves a forward program, and gradient kernels trust the sizes "
                "their forward gave them (unfold_backward read past its input when tried)",
    "_test_": "one of torch's own test operators",
}

#: Overloads allowed only while one argument holds one value: ``name.overload`` -> (argument, value, why).
#: An argument a node leaves out holds its schema's default.
WHEN: dict[str, tuple[str, object, str]] = {
    "aten::dropout.default": ("train", False, "draws random numbers when training; with train=False it returns "
                                              "its input"),
    "aten::feature_dropout.default": ("train", False, "draws random numbers when training"),
    "aten::alpha_dropout.default": ("train", False, "draws random numbers when training"),
    "aten::feature_alpha_dropout.default": ("train", False, "draws random numbers when training"),
    "aten::native_dropout.default": ("train", False, "draws random numbers when training"),
    "aten::scaled_dot_product_attention.default": ("dropout_p", 0.0, "draws random numbers for a dropout_p "
                                                                     "above 0"),
    "aten::_scaled_dot_product_flash_attention_for_cpu.default": ("dropout_p", 0.0, "draws random numbers for "
                                                                                    "a dropout_p above 0"),
    "aten::_scaled_dot_product_attention_math.default": ("dropout_p", 0.0, "draws random numbers for a "
                                                                           "dropout_p above 0"),
    "aten::segment_reduce.default": ("unsafe", False, f"with unsafe=True it reads past its data where its "
                                                      f"lengths point {_UNCHECKED}"),
}

#: Higher-order operators (``torch.ops.higher_order.NAME``): None for those a program may call (their
#: subgraphs are checked as the program is), else why it may not. One missing here is refused.
HIGHER_ORDER: dict[str, str | None] = {
    "cond": None,  # runs one of two subgraphs, both checked
    "map_impl": None,  # runs a checked subgraph once per slice of its input: as often as a size says
    "wrap_with_set_grad_enabled": None,  # runs a checked subgraph with autograd on or off
    "wrap_with_autocast": None,  # runs a checked subgraph under autocast
    "while_loop": "runs its body until its condition, a value, says stop: no bound on how often can be checked "
                  "before it runs",
    "while_loop_stack_output": "runs its body until its condition, a value, says stop",
    "with_effects": "runs an operator with side effects",
    "auto_functionalized": "runs an operator that writes its arguments",
    "auto_functionalized_v2": "runs an operator that writes its arguments",
    "executorch_call_delegate": "runs a compiled delegate's payload",
    "aoti_call_delegate": "runs a compiled AOTInductor library",
    "call_torchbind": "calls a method of a TorchScript object",
    "print": "prints",
    "flat_apply": "calls a Python function",
    "triton_kernel_wrapper_functional": "runs a compiled Triton kernel",
    "triton_kernel_wrapper_mutation": "runs a compiled Triton kernel",
    "inline_asm_elementwise": "runs inline assembly",
}

#: Arithmetic on sizes, as torch's serializer names it (``torch._export.serde.serialize._SYM_OPS``).
SYMBOLIC = frozenset((
    "_operator.add", "_operator.and_", "_operator.eq", "_operator.floordiv", "_operator.ge", "_operator.gt",
    "_operator.le", "_operator.lshift", "_operator.lt", "_operator.mod", "_operator.mul", "_operator.ne",
    "_operator.neg", "_operator.or_", "_operator.pos", "_operator.pow", "_operator.rshift", "_operator.sub",
    "_operator.truediv", "math.trunc", "torch._sym_sqrt", "torch.sym_float", "torch.sym_int", "torch.sym_ite",
    "torch.sym_max", "torch.sym_min", "torch.sym_not",
))


def _overloads(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: The functional overloads by namespace, as ``name.overload`` (``default`` for the one without a name).
FUNCTIONAL: dict[str, frozenset[str]] = {
    "aten": _overloads("""
    __and__.Scalar __and__.Tensor __lshift__.Scalar __lshift__.Tensor __or__.Scalar __or__.Tensor
    __rshift__.Scalar __rshift__.Tensor __xor__.Scalar __xor__.Tensor _adaptive_avg_pool2d.default
    _adaptive_avg_pool3d.default _add_batch_dim.default _add_relu.Scalar _add_relu.Tensor
    _addmm_activation.default _aminmax.default _aminmax.dim _amp_foreach_non_finite_check_and_unscale.default
    _amp_update_scale.default _assert_async.default _assert_async.msg _assert_scalar.default
    _assert_tensor_metadata.default _autocast_to_full_precision.default
    _autocast_to_reduced_precision.default _batch_norm_impl_index.default _batch_norm_no_update.default
    _batch_norm_with_update_functional.default _cast_Byte.default _cast_Char.default _cast_Double.default
    _cast_Float.default _cast_Half.default _cast_Int.default _cast_Long.default _cast_Short.default
    _cdist_forward.default _cholesky_solve_helper.default _choose_qparams_per_tensor.default
    _chunk_cat.default _coalesce.default _coalesced.default _compute_linear_combination.default _conj.default
    _conj_copy.default _conj_physical.default _conv_depthwise2d.default _convert_weight_to_int4pack.default
    _convert_weight_to_int4pack_for_cpu.default _convolution.default _convolution.deprecated
    _convolution_mode.default _cslt_compress.default _cslt_sparse_mm.default _cslt_sparse_mm_search.default
    _cudnn_ctc_loss.Tensor _cudnn_ctc_loss.default _cudnn_rnn_flatten_weight.default
    _cufft_get_plan_cache_max_size.default _cufft_get_plan_cache_size.default
    _debug_has_internal_overlap.default _dimI.default _dimV.default _dim_arange.default
    _dirichlet_grad.default _dyn_quant_matmul_4bit.default _dyn_quant_pack_4bit_weight.default
    _efficientzerotensor.default _embedding_bag.default _embedding_bag_forward_only.default
    _empty_affine_quantized.default _empty_per_channel_affine_quantized.default _euclidean_dist.default
    _fake_quantize_learnable_per_channel_affine.default _fake_quantize_learnable_per_tensor_affine.default
    _fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default _foreach_abs.default
    _foreach_acos.default _foreach_add.List _foreach_add.Scalar _foreach_add.ScalarList _foreach_add.Tensor
    _foreach_addcdiv.Scalar _foreach_addcdiv.ScalarList _foreach_addcdiv.Tensor _foreach_addcmul.Scalar
    _foreach_addcmul.ScalarList _foreach_addcmul.Tensor _foreach_asin.default _foreach_atan.default
    _foreach_ceil.default _foreach_clamp_max.List _foreach_clamp_max.Scalar _foreach_clamp_max.ScalarList
    _foreach_clamp_min.List _foreach_clamp_min.Scalar _foreach_clamp_min.ScalarList _foreach_clone.default
    _foreach_copy.default _foreach_cos.default _foreach_cosh.default _foreach_div.List _foreach_div.Scalar
    _foreach_div.ScalarList _foreach_div.Tensor _foreach_erf.default _foreach_erfc.default
    _foreach_exp.default _foreach_expm1.default _foreach_floor.default _foreach_frac.default
    _foreach_lerp.List _foreach_lerp.Scalar _foreach_lerp.ScalarList _foreach_lgamma.default
    _foreach_log.default _foreach_log10.default _foreach_log1p.default _foreach_log2.default
    _foreach_max.default _foreach_maximum.List _foreach_maximum.Scalar _foreach_maximum.ScalarList
    _foreach_minimum.List _foreach_minimum.Scalar _foreach_minimum.ScalarList _foreach_mm.default
    _foreach_mul.List _foreach_mul.Scalar _foreach_mul.ScalarList _foreach_mul.Tensor _foreach_neg.default
    _foreach_norm.Scalar _foreach_pow.List _foreach_pow.Scalar _foreach_pow.ScalarAndTensor
    _foreach_pow.ScalarList _foreach_powsum.Scalar _foreach_reciprocal.default _foreach_round.default
    _foreach_rsqrt.default _foreach_sigmoid.default _foreach_sign.default _foreach_sin.default
    _foreach_sinh.default _foreach_sqrt.default _foreach_sub.List _foreach_sub.Scalar _foreach_sub.ScalarList
    _foreach_tan.default _foreach_tanh.default _foreach_trunc.default _foreach_zero.default
    _functional_assert_async.msg _functional_assert_scalar.default _functional_sym_constrain_range.default
    _functional_sym_constrain_range_for_size.default _fused_adagrad.default _fused_adagrad.tensor_lr
    _fused_adam.default _fused_adam.tensor_lr _fused_adamw.default _fused_adamw.tensor_lr
    _fused_moving_avg_obs_fq_helper_functional.default _fused_rms_norm.default _fused_sgd.default
    _fused_sgd.tensor_lr _fw_primal.default _fw_primal_copy.default _grid_sampler_2d_cpu_fallback.default
    _grouped_mm.default _has_compatible_shallow_copy_type.default _has_same_storage_numel.default
    _histogramdd_bin_edges.default _histogramdd_from_bin_cts.default _histogramdd_from_bin_tensors.default
    _index_put_impl.default _indices.default _indices_copy.default _int_mm.default _is_all_true.default
    _is_any_true.default _is_zerotensor.default _jagged_to_padded_dense_forward.default _lazy_clone.default
    _linalg_check_errors.default _linalg_det.default _linalg_eigh.default _linalg_eigvals.default
    _linalg_slogdet.default _linalg_solve_ex.default _linalg_svd.default _local_scalar_dense.default
    _log_softmax.default _logcumsumexp.default _lu_with_info.default _make_dep_token.default
    _make_dual.default _make_dual_copy.default _make_per_channel_quantized_tensor.default
    _make_per_tensor_quantized_tensor.default _masked_scale.default _masked_softmax.default
    _mixed_dtypes_linear.default _mkldnn_reshape.default _mkldnn_transpose.default _mps_convolution.default
    _mps_convolution_transpose.default _native_batch_norm_legit.no_stats
    _native_batch_norm_legit_functional.default _native_batch_norm_legit_no_training.default
    _native_multi_head_attention.default _neg_view.default _neg_view_copy.default
    _nested_compute_contiguous_strides_offsets.default _nested_from_padded.default
    _nested_from_padded_and_nested_example.default _nested_from_padded_tensor.default
    _nested_get_jagged_dummy.default _nested_get_lengths.default _nested_get_max_seqlen.default
    _nested_get_min_seqlen.default _nested_get_offsets.default _nested_get_ragged_idx.default
    _nested_get_values.default _nested_get_values_copy.default _nested_tensor_from_mask.default
    _nested_tensor_from_mask_left_aligned.default _nested_tensor_from_tensor_list.default
    _nested_tensor_size.default _nested_tensor_storage_offsets.default _nested_tensor_strides.default
    _nested_view_from_buffer.default _nested_view_from_buffer_copy.default _nested_view_from_jagged.default
    _nested_view_from_jagged_copy.default _new_zeros_with_same_feature_meta.default _nnpack_available.default
    _nnpack_spatial_convolution.default _nnz.default _pack_padded_sequence.default _pad_circular.default
    _pad_enum.default _pad_packed_sequence.default _padded_dense_to_jagged_forward.default
    _pdist_forward.default _philox_key_fold_in.default _philox_key_split.default _philox_normal.default
    _philox_uniform.default _prelu_kernel.default _remove_batch_dim.default _reshape_copy.default
    _reshape_from_tensor.default _resize_output.default _rowwise_prune.default _safe_softmax.default
    _saturate_weight_to_fp16.default _scaled_grouped_mm.default _scaled_grouped_mm_v2.default
    _scaled_mm.default _scaled_mm_v2.default _shape_as_tensor.default _slow_conv2d_forward.default
    _softmax.default _sparse_addmm.default _sparse_broadcast_to.default _sparse_broadcast_to_copy.default
    _sparse_compressed_tensor_with_dims.default _sparse_coo_tensor_with_dims.default
    _sparse_csr_prod.dim_dtype _sparse_csr_sum.dim_dtype _sparse_log_softmax.default _sparse_log_softmax.int
    _sparse_mask_projection.default _sparse_mm.default _sparse_mm.reduce _sparse_mm_reduce_impl.default
    _sparse_semi_structured_addmm.default _sparse_semi_structured_apply.default
    _sparse_semi_structured_apply_dense.default _sparse_semi_structured_linear.default
    _sparse_semi_structured_mm.default _sparse_semi_structured_tile.default _sparse_softmax.default
    _sparse_softmax.int _sparse_sparse_matmul.default _sparse_sum.default _sparse_sum.dim
    _sparse_sum.dim_dtype _sparse_sum.dtype _spdiags.default _spsolve.default _stack.default
    _standard_gamma_grad.default _thnn_fused_gru_cell.default _thnn_fused_lstm_cell.default _to_copy.default
    _to_cpu.default _to_dense.default _to_sparse.default _to_sparse.sparse_dim _to_sparse_bsc.default
    _to_sparse_bsr.default _to_sparse_csc.default _to_sparse_csr.default _to_sparse_semi_structured.default
    _transformer_encoder_layer_fwd.default _trilinear.default _triton_multi_head_attention.default
    _unpack_dual.default _unsafe_index.Tensor _unsafe_index_put.default _unsafe_masked_index.default
    _unsafe_masked_index_put_accumulate.default _unsafe_view.default _upsample_bicubic2d_aa.default
    _upsample_bicubic2d_aa.vec _upsample_bilinear2d_aa.default _upsample_bilinear2d_aa.vec
    _upsample_lanczos2d_aa.default _upsample_lanczos2d_aa.vec _upsample_nearest_exact1d.default
    _upsample_nearest_exact1d.vec _upsample_nearest_exact2d.default _upsample_nearest_exact2d.vec
    _upsample_nearest_exact3d.default _upsample_nearest_exact3d.vec _use_cudnn_ctc_loss.Tensor
    _use_cudnn_ctc_loss.default _use_cudnn_rnn_flatten_weight.default _use_miopen_ctc_loss.Tensor
    _use_miopen_ctc_loss.default _validate_compressed_sparse_indices.default
    _validate_sparse_bsc_tensor_args.default _validate_sparse_bsr_tensor_args.default
    _validate_sparse_compressed_tensor_args.default _validate_sparse_coo_tensor_args.default
    _validate_sparse_csc_tensor_args.default _validate_sparse_csr_tensor_args.default _values.default
    _values_copy.default _version.default _weight_int4pack_mm.default _weight_int4pack_mm_for_cpu.default
    _weight_int4pack_mm_with_scales_and_zeros.default _weight_int8pack_mm.default _weight_norm.default
    _weight_norm_interface.default _wrapped_linear_prepack.default
    _wrapped_quantized_linear_prepacked.default abs.default absolute.default acos.default acosh.default
    adaptive_avg_pool1d.default adaptive_avg_pool2d.default adaptive_avg_pool3d.default
    adaptive_max_pool1d.default adaptive_max_pool2d.default adaptive_max_pool3d.default add.Scalar add.Tensor
    addbmm.default addcdiv.default addcmul.default addmm.default addmm.dtype addmv.default addr.default
    adjoint.default affine_grid_generator.default alias.default alias_copy.default all.default all.dim
    all.dims allclose.default amax.default amin.default aminmax.default angle.default any.default any.dim
    any.dims arange.default arange.start arange.start_step arccos.default arccosh.default arcsin.default
    arcsinh.default arctan.default arctan2.default arctanh.default argmax.default argmin.default
    argsort.default argsort.stable as_strided.default as_strided_copy.default as_strided_scatter.default
    asin.default asinh.default atan.default atan2.default atanh.default atleast_1d.Sequence
    atleast_1d.default atleast_2d.Sequence atleast_2d.default atleast_3d.Sequence atleast_3d.default
    avg_pool1d.default avg_pool2d.default avg_pool3d.default baddbmm.default baddbmm.dtype
    bartlett_window.default bartlett_window.periodic batch_norm.default batch_norm_elemt.default
    batch_norm_gather_stats.default batch_norm_gather_stats_with_counts.default batch_norm_stats.default
    batch_norm_update_stats.default bilinear.default binary_cross_entropy.default
    binary_cross_entropy_with_logits.default bitwise_and.Scalar bitwise_and.Scalar_Tensor bitwise_and.Tensor
    bitwise_left_shift.Scalar_Tensor bitwise_left_shift.Tensor bitwise_left_shift.Tensor_Scalar
    bitwise_not.default bitwise_or.Scalar bitwise_or.Scalar_Tensor bitwise_or.Tensor
    bitwise_right_shift.Scalar_Tensor bitwise_right_shift.Tensor bitwise_right_shift.Tensor_Scalar
    bitwise_xor.Scalar bitwise_xor.Scalar_Tensor bitwise_xor.Tensor blackman_window.default
    blackman_window.periodic block_diag.default bmm.default bmm.dtype broadcast_tensors.default
    broadcast_to.default bucketize.Scalar bucketize.Tensor can_cast.default cartesian_prod.default
    cat.default ccol_indices.default ccol_indices_copy.default cdist.default ceil.default celu.default
    chain_matmul.default chalf.default channel_shuffle.default cholesky.default cholesky_inverse.default
    cholesky_solve.default choose_qparams_optimized.default chunk.default clamp.Tensor clamp.default
    clamp_max.Tensor clamp_max.default clamp_min.Tensor clamp_min.default clip.Tensor clip.default
    clone.default coalesce.default col2im.default col_indices.default col_indices_copy.default
    column_stack.default combinations.default complex.default concat.default concatenate.default conj.default
    conj_physical.default constant_pad_nd.default contiguous.default conv1d.default conv1d.padding
    conv2d.default conv2d.padding conv3d.default conv3d.padding conv_depthwise3d.default conv_tbc.default
    conv_transpose1d.default conv_transpose2d.input conv_transpose3d.input convolution.default
    convolution_overrideable.default copy.default copy_sparse_to_sparse.default copysign.Scalar
    copysign.Tensor corrcoef.default cos.default cosh.default cosine_embedding_loss.default
    cosine_similarity.default count_nonzero.default count_nonzero.dim_IntList cov.default cross.default
    cross_entropy_loss.default crow_indices.default crow_indices_copy.default
    cudnn_affine_grid_generator.default cudnn_batch_norm.default cudnn_convolution.default
    cudnn_convolution_add_relu.default cudnn_convolution_relu.default cudnn_convolution_transpose.default
    cudnn_grid_sampler.default cudnn_is_acceptable.default cummax.default cummin.default cumprod.default
    cumsum.default cumulative_trapezoid.dx cumulative_trapezoid.x data.default deg2rad.default
    dense_dim.default dequantize.self dequantize.tensors det.default detach.default detach_copy.default
    diag.default diag_embed.default diagflat.default diagonal.default diagonal_copy.default
    diagonal_scatter.default diff.default digamma.default dim.default dist.default div.Scalar div.Scalar_mode
    div.Tensor div.Tensor_mode divide.Scalar divide.Scalar_mode divide.Tensor divide.Tensor_mode dot.default
    dsplit.array dsplit.int dstack.default einsum.default elu.default embedding.default embedding_bag.default
    embedding_bag.padding_idx embedding_renorm.default empty.memory_format empty_like.default
    empty_permuted.default empty_quantized.default empty_strided.default eq.Scalar eq.Tensor equal.default
    erf.default erfc.default erfinv.default exp.default exp2.default expand.default expand_as.default
    expand_copy.default expm1.default eye.default eye.m fake_quantize_per_channel_affine.default
    fake_quantize_per_channel_affine_cachemask.default fake_quantize_per_tensor_affine.default
    fake_quantize_per_tensor_affine.tensor_qparams fake_quantize_per_tensor_affine_cachemask.default
    fbgemm_linear_fp16_weight.default fbgemm_linear_fp16_weight_fp32_activation.default
    fbgemm_linear_int8_weight.default fbgemm_linear_int8_weight_fp32_activation.default
    fbgemm_linear_quantize_weight.default fbgemm_pack_gemm_matrix_fp16.default
    fbgemm_pack_quantized_matrix.KN fbgemm_pack_quantized_matrix.default fft_fft.default fft_fft2.default
    fft_fftfreq.default fft_fftn.default fft_fftshift.default fft_hfft.default fft_hfft2.default
    fft_hfftn.default fft_ifft.default fft_ifft2.default fft_ifftn.default fft_ifftshift.default
    fft_ihfft.default fft_ihfft2.default fft_ihfftn.default fft_irfft.default fft_irfft2.default
    fft_irfftn.default fft_rfft.default fft_rfft2.default fft_rfftfreq.default fft_rfftn.default fill.Scalar
    fill.Tensor fix.default flatten.using_ints flatten_dense_tensors.default flip.default fliplr.default
    flipud.default float_power.Scalar float_power.Tensor_Scalar float_power.Tensor_Tensor floor.default
    floor_divide.Scalar floor_divide.default fmax.default fmin.default fmod.Scalar fmod.Tensor frac.default
    fractional_max_pool2d.default fractional_max_pool3d.default frexp.Tensor frobenius_norm.dim full.default
    full_like.default gather.default gcd.default ge.Scalar ge.Tensor gelu.default geqrf.default ger.default
    get_device.default glu.default glu_jvp.default gradient.array gradient.scalararray gradient.scalarint
    gradient.scalarrayarray gradient.scalarrayint gradient.tensorarray gradient.tensorarrayint greater.Scalar
    greater.Tensor greater_equal.Scalar greater_equal.Tensor grid_sampler.default grid_sampler_2d.default
    grid_sampler_3d.default group_norm.default gru_cell.default gt.Scalar gt.Tensor hamming_window.default
    hamming_window.periodic hamming_window.periodic_alpha hamming_window.periodic_alpha_beta
    hann_window.default hann_window.periodic hardshrink.default hardsigmoid.default hardswish.default
    hardtanh.default hash_tensor.default heaviside.default hinge_embedding_loss.default histc.default
    histogram.bin_ct histogram.bins_tensor histogramdd.TensorList_bins histogramdd.default
    histogramdd.int_bins hsplit.array hsplit.int hspmm.default hstack.default huber_loss.default
    hypot.default i0.default igamma.default igammac.default im2col.default imag.default index.Tensor
    index_add.default index_copy.default index_fill.int_Scalar index_fill.int_Tensor index_put.default
    index_reduce.default index_select.default indices.default indices_copy.default inner.default
    instance_norm.default int_repr.default inverse.default is_coalesced.default is_complex.default
    is_conj.default is_contiguous.default is_contiguous.memory_format is_distributed.default
    is_floating_point.default is_inference.default is_leaf.default is_neg.default is_nonzero.default
    is_pinned.default is_same_size.default is_set_to.default is_signed.default is_vulkan_available.default
    isclose.default isfinite.default isin.Scalar_Tensor isin.Tensor_Scalar isin.Tensor_Tensor isinf.default
    isnan.default isneginf.default isposinf.default isreal.default istft.default item.default
    kaiser_window.beta kaiser_window.default kaiser_window.periodic kl_div.default kron.default
    kthvalue.default l1_loss.default layer_norm.default lcm.default ldexp.Tensor le.Scalar le.Tensor
    leaky_relu.default lerp.Scalar lerp.Tensor less.Scalar less.Tensor less_equal.Scalar less_equal.Tensor
    lgamma.default lift.default lift_fresh.default lift_fresh_copy.default linalg__powsum.default
    linalg_cholesky.default linalg_cholesky_ex.default linalg_cond.default linalg_cond.p_str
    linalg_cross.default linalg_det.default linalg_diagonal.default linalg_eig.default linalg_eigh.default
    linalg_eigvals.default linalg_eigvalsh.default linalg_householder_product.default linalg_inv.default
    linalg_inv_ex.default linalg_ldl_factor.default linalg_ldl_factor_ex.default linalg_ldl_solve.default
    linalg_lstsq.default linalg_lu.default linalg_lu_factor.default linalg_lu_factor_ex.default
    linalg_lu_solve.default linalg_matmul.default linalg_matrix_exp.default linalg_matrix_norm.default
    linalg_matrix_norm.str_ord linalg_matrix_power.default linalg_matrix_rank.atol_rtol_float
    linalg_matrix_rank.atol_rtol_tensor linalg_matrix_rank.default linalg_matrix_rank.tol_tensor
    linalg_multi_dot.default linalg_norm.default linalg_norm.ord_str linalg_pinv.atol_rtol_float
    linalg_pinv.atol_rtol_tensor linalg_pinv.default linalg_pinv.rcond_tensor linalg_qr.default
    linalg_slogdet.default linalg_solve.default linalg_solve_ex.default linalg_solve_triangular.default
    linalg_svd.default linalg_svdvals.default linalg_tensorinv.default linalg_tensorsolve.default
    linalg_vander.default linalg_vecdot.default linalg_vector_norm.default linear.default
    linspace.Scalar_Tensor linspace.Tensor_Scalar linspace.Tensor_Tensor linspace.default log.default
    log10.default log1p.default log2.default log_sigmoid.default log_sigmoid_forward.default log_softmax.int
    logaddexp.default logaddexp2.default logcumsumexp.default logdet.default logical_and.default
    logical_not.default logical_or.default logical_xor.default logit.default logspace.Scalar_Tensor
    logspace.Tensor_Scalar logspace.Tensor_Tensor logspace.default logsumexp.default lstm_cell.default
    lt.Scalar lt.Tensor lu_solve.default lu_unpack.default mH.default mT.default margin_ranking_loss.default
    masked_fill.Scalar masked_fill.Tensor masked_scatter.default matmul.default matrix_H.default
    matrix_exp.default matrix_power.default max.default max.dim max.other max_pool1d.default
    max_pool1d_with_indices.default max_pool2d.default max_pool2d_with_indices.default max_pool3d.default
    max_pool3d_with_indices.default max_unpool2d.default max_unpool3d.default maximum.default mean.default
    mean.dim median.default median.dim meshgrid.default meshgrid.indexing min.default min.dim min.other
    minimum.default miopen_batch_norm.default miopen_convolution.default miopen_convolution_add_relu.default
    miopen_convolution_relu.default miopen_convolution_transpose.default miopen_ctc_loss.Tensor
    miopen_ctc_loss.default miopen_depthwise_convolution.default mish.default
    mkldnn_adaptive_avg_pool2d.default mkldnn_convolution.default mkldnn_linear.default
    mkldnn_max_pool2d.default mkldnn_max_pool3d.default mkldnn_reorder_conv2d_weight.default
    mkldnn_reorder_conv3d_weight.default mkldnn_rnn_layer.default mm.default mm.dtype mode.default
    moveaxis.int moveaxis.intlist movedim.int movedim.intlist mse_loss.default msort.default mul.Scalar
    mul.Tensor multi_margin_loss.default multilabel_margin_loss.default
    multilabel_margin_loss_forward.default multiply.Scalar multiply.Tensor mv.default mvlgamma.default
    nan_to_num.default nanmean.default nanmedian.default nanmedian.dim nanquantile.default nanquantile.scalar
    nansum.default narrow.Tensor narrow.default narrow_copy.default native_batch_norm.default
    native_channel_shuffle.default native_group_norm.default native_layer_norm.default
    native_norm.ScalarOpt_dim_dtype native_norm.default ne.Scalar ne.Tensor neg.default negative.default
    nested_to_padded_tensor.default new_empty.default new_empty_strided.default new_full.default
    new_ones.default new_zeros.default nextafter.default nll_loss.default nll_loss2d.default
    nll_loss2d_forward.default nll_loss_forward.default nll_loss_nd.default nonzero_static.default
    norm.Scalar norm.ScalarOpt_dim norm.ScalarOpt_dim_dtype norm.ScalarOpt_dtype norm_except_dim.default
    not_equal.Scalar not_equal.Tensor nuclear_norm.default nuclear_norm.dim numel.default numpy_T.default
    one_hot.default ones.default ones_like.default orgqr.default ormqr.default outer.default
    output_nr.default pad.default pad_sequence.default pairwise_distance.default pdist.default
    permute.default permute_copy.default pinverse.default pixel_shuffle.default pixel_unshuffle.default
    poisson_nll_loss.default polar.default polygamma.default positive.default pow.Scalar pow.Tensor_Scalar
    pow.Tensor_Tensor prelu.default prod.default prod.dim_int promote_types.default put.default
    q_per_channel_axis.default q_per_channel_scales.default q_per_channel_zero_points.default q_scale.default
    q_zero_point.default qr.default quantile.default quantile.scalar quantize_per_channel.default
    quantize_per_tensor.default quantize_per_tensor.tensor_qparams quantize_per_tensor.tensors
    quantize_per_tensor_dynamic.default quantized_batch_norm.default quantized_gru.data
    quantized_gru.data_legacy quantized_gru.input quantized_gru.input_legacy quantized_gru_cell.default
    quantized_lstm.data quantized_lstm.data_legacy quantized_lstm.input quantized_lstm.input_legacy
    quantized_lstm_cell.default quantized_max_pool1d.default quantized_max_pool2d.default
    quantized_max_pool3d.default quantized_rnn_relu_cell.default quantized_rnn_tanh_cell.default
    rad2deg.default range.default range.step ravel.default real.default reciprocal.default
    reflection_pad1d.default reflection_pad2d.default reflection_pad3d.default relu.default relu6.default
    remainder.Scalar remainder.Scalar_Tensor remainder.Tensor renorm.default repeat.default
    repeat_interleave.self_int replication_pad1d.default replication_pad2d.default replication_pad3d.default
    reshape.default reshape_as.default resize.default resize_as.default resize_as_sparse.default
    resolve_conj.default resolve_neg.default result_type.Scalar result_type.Scalar_Scalar
    result_type.Scalar_Tensor result_type.Tensor retains_grad.default rms_norm.default rnn_relu_cell.default
    rnn_tanh_cell.default roll.default rot90.default round.decimals round.default row_indices.default
    row_indices_copy.default row_stack.default rsqrt.default rsub.Scalar rsub.Tensor scalar_tensor.default
    scatter.reduce scatter.src scatter.value scatter.value_reduce scatter_add.default scatter_reduce.two
    searchsorted.Scalar searchsorted.Tensor segment_reduce.default select.int select_copy.int
    select_scatter.default selu.default set.default set.source_Tensor sgn.default sigmoid.default
    sign.default signbit.default silu.default sin.default sinc.default sinh.default size.int slice.Tensor
    slice_copy.Tensor slice_inverse.default slice_scatter.default slogdet.default slow_conv3d.default
    slow_conv3d_forward.default slow_conv_dilated2d.default slow_conv_dilated3d.default
    slow_conv_transpose2d.default slow_conv_transpose3d.default smm.default smooth_l1_loss.default
    soft_margin_loss.default softmax.int softplus.default softshrink.default sort.default sort.stable
    sparse_bsc_tensor.ccol_row_value sparse_bsc_tensor.ccol_row_value_size sparse_bsr_tensor.crow_col_value
    sparse_bsr_tensor.crow_col_value_size sparse_compressed_tensor.comp_plain_value
    sparse_compressed_tensor.comp_plain_value_size sparse_coo_tensor.indices sparse_coo_tensor.indices_size
    sparse_coo_tensor.size sparse_csc_tensor.ccol_row_value sparse_csc_tensor.ccol_row_value_size
    sparse_csr_tensor.crow_col_value sparse_csr_tensor.crow_col_value_size sparse_dim.default
    sparse_mask.default sparse_resize.default sparse_resize_and_clear.default sparse_sampled_addmm.default
    special_airy_ai.default special_bessel_j0.default special_bessel_j1.default special_bessel_y0.default
    special_bessel_y1.default special_chebyshev_polynomial_t.default special_chebyshev_polynomial_t.n_scalar
    special_chebyshev_polynomial_t.x_scalar special_chebyshev_polynomial_u.default
    special_chebyshev_polynomial_u.n_scalar special_chebyshev_polynomial_u.x_scalar
    special_chebyshev_polynomial_v.default special_chebyshev_polynomial_v.n_scalar
    special_chebyshev_polynomial_v.x_scalar special_chebyshev_polynomial_w.default
    special_chebyshev_polynomial_w.n_scalar special_chebyshev_polynomial_w.x_scalar special_digamma.default
    special_entr.default special_erf.default special_erfc.default special_erfcx.default
    special_erfinv.default special_exp2.default special_expit.default special_expm1.default
    special_gammainc.default special_gammaincc.default special_gammaln.default
    special_hermite_polynomial_h.default special_hermite_polynomial_h.n_scalar
    special_hermite_polynomial_h.x_scalar special_hermite_polynomial_he.default
    special_hermite_polynomial_he.n_scalar special_hermite_polynomial_he.x_scalar special_i0.default
    special_i0e.default special_i1.default special_i1e.default special_laguerre_polynomial_l.default
    special_laguerre_polynomial_l.n_scalar special_laguerre_polynomial_l.x_scalar
    special_legendre_polynomial_p.default special_legendre_polynomial_p.n_scalar
    special_legendre_polynomial_p.x_scalar special_log1p.default special_log_ndtr.default
    special_log_softmax.default special_logit.default special_logsumexp.default
    special_modified_bessel_i0.default special_modified_bessel_i1.default special_modified_bessel_k0.default
    special_modified_bessel_k1.default special_multigammaln.default special_ndtr.default
    special_ndtri.default special_polygamma.default special_psi.default special_round.default
    special_scaled_modified_bessel_k0.default special_scaled_modified_bessel_k1.default
    special_shifted_chebyshev_polynomial_t.default special_shifted_chebyshev_polynomial_t.n_scalar
    special_shifted_chebyshev_polynomial_t.x_scalar special_shifted_chebyshev_polynomial_u.default
    special_shifted_chebyshev_polynomial_u.n_scalar special_shifted_chebyshev_polynomial_u.x_scalar
    special_shifted_chebyshev_polynomial_v.default special_shifted_chebyshev_polynomial_v.n_scalar
    special_shifted_chebyshev_polynomial_v.x_scalar special_shifted_chebyshev_polynomial_w.default
    special_shifted_chebyshev_polynomial_w.n_scalar special_shifted_chebyshev_polynomial_w.x_scalar
    special_sinc.default special_softmax.default special_spherical_bessel_j0.default special_xlog1py.default
    special_xlog1py.other_scalar special_xlog1py.self_scalar special_xlogy.default special_xlogy.other_scalar
    special_xlogy.self_scalar special_zeta.default special_zeta.other_scalar special_zeta.self_scalar
    split.Tensor split.sizes split_copy.Tensor split_with_sizes.default split_with_sizes_copy.default
    sqrt.default square.default squeeze.default squeeze.dim squeeze.dims squeeze_copy.default
    squeeze_copy.dim squeeze_copy.dims sspaddmm.default stack.default std.correction std.default std.dim
    std_mean.correction std_mean.default std_mean.dim stft.center stft.default storage_offset.default
    stride.int sub.Scalar sub.Tensor subtract.Scalar subtract.Tensor sum.default sum.dim_IntList
    sum_to_size.default svd.default swapaxes.default swapdims.default sym_constrain_range.default
    sym_constrain_range_for_size.default sym_is_contiguous.default sym_numel.default sym_size.int
    sym_storage_offset.default sym_stride.int t.default t_copy.default take.default take_along_dim.default
    tan.default tanh.default tensor_split.indices tensor_split.sections
    tensor_split.tensor_indices_or_sections tensordot.default thnn_conv2d.default threshold.default
    tile.default to.device to.dtype to.dtype_layout to.other to_dense.default to_mkldnn.default
    to_padded_tensor.default to_sparse.default to_sparse.sparse_dim to_sparse_bsc.default
    to_sparse_bsr.default to_sparse_csc.default to_sparse_csr.default topk.default trace.default
    transpose.int transpose_copy.int trapezoid.dx trapezoid.x trapz.dx trapz.x triangular_solve.default
    tril.default tril_indices.default triplet_margin_loss.default triu.default triu_indices.default
    true_divide.Scalar true_divide.Tensor trunc.default type_as.default unbind.int unbind_copy.int
    unflatten.int unflatten_dense_tensors.default unfold.default unfold_copy.default unsafe_chunk.default
    unsafe_split.Tensor unsafe_split_with_sizes.default unsqueeze.default unsqueeze_copy.default
    upsample_bicubic2d.default upsample_bicubic2d.vec upsample_bilinear2d.default upsample_bilinear2d.vec
    upsample_linear1d.default upsample_linear1d.vec upsample_nearest1d.default upsample_nearest1d.vec
    upsample_nearest2d.default upsample_nearest2d.vec upsample_nearest3d.default upsample_nearest3d.vec
    upsample_trilinear3d.default upsample_trilinear3d.vec values.default values_copy.default vander.default
    var.correction var.default var.dim var_mean.correction var_mean.default var_mean.dim vdot.default
    view.default view.dtype view_as.default view_as_complex.default view_as_complex_copy.default
    view_as_real.default view_as_real_copy.default view_copy.default view_copy.dtype vsplit.array vsplit.int
    vstack.default where.Scalar where.ScalarOther where.ScalarSelf where.default where.self
    xlogy.Scalar_Other xlogy.Scalar_Self xlogy.Tensor zero.default zeros.default zeros_like.default
    """),
    "dim_order_ops": _overloads("""
    _clone_dim_order.default _empty_dim_order.default _to_dim_order_copy.default
    """),
}

#: The in-place overloads whose functional twin (the same name without its last ``_``, the same
#: arguments) is in :data:`FUNCTIONAL`; each writes its ``self`` alone.
IN_PLACE: dict[str, frozenset[str]] = {
    "aten": _overloads("""
    __iand__.Scalar __iand__.Tensor __ilshift__.Scalar __ilshift__.Tensor __ior__.Scalar __ior__.Tensor
    __irshift__.Scalar __irshift__.Tensor __ixor__.Scalar __ixor__.Tensor _add_relu_.Scalar _add_relu_.Tensor
    _coalesced_.default _foreach_abs_.default _foreach_acos_.default _foreach_add_.List _foreach_add_.Scalar
    _foreach_add_.ScalarList _foreach_add_.Tensor _foreach_addcdiv_.Scalar _foreach_addcdiv_.ScalarList
    _foreach_addcdiv_.Tensor _foreach_addcmul_.Scalar _foreach_addcmul_.ScalarList _foreach_addcmul_.Tensor
    _foreach_asin_.default _foreach_atan_.default _foreach_ceil_.default _foreach_clamp_max_.List
    _foreach_clamp_max_.Scalar _foreach_clamp_max_.ScalarList _foreach_clamp_min_.List
    _foreach_clamp_min_.Scalar _foreach_clamp_min_.ScalarList _foreach_copy_.default _foreach_cos_.default
    _foreach_cosh_.default _foreach_div_.List _foreach_div_.Scalar _foreach_div_.ScalarList
    _foreach_div_.Tensor _foreach_erf_.default _foreach_erfc_.default _foreach_exp_.default
    _foreach_expm1_.default _foreach_floor_.default _foreach_frac_.default _foreach_lerp_.List
    _foreach_lerp_.Scalar _foreach_lerp_.ScalarList _foreach_lgamma_.default _foreach_log10_.default
    _foreach_log1p_.default _foreach_log2_.default _foreach_log_.default _foreach_maximum_.List
    _foreach_maximum_.Scalar _foreach_maximum_.ScalarList _foreach_minimum_.List _foreach_minimum_.Scalar
    _foreach_minimum_.ScalarList _foreach_mul_.List _foreach_mul_.Scalar _foreach_mul_.ScalarList
    _foreach_mul_.Tensor _foreach_neg_.default _foreach_pow_.List _foreach_pow_.Scalar
    _foreach_pow_.ScalarList _foreach_reciprocal_.default _foreach_round_.default _foreach_rsqrt_.default
    _foreach_sigmoid_.default _foreach_sign_.default _foreach_sin_.default _foreach_sinh_.default
    _foreach_sqrt_.default _foreach_sub_.List _foreach_sub_.Scalar _foreach_sub_.ScalarList
    _foreach_tan_.default _foreach_tanh_.default _foreach_trunc_.default _foreach_zero_.default
    _index_put_impl_.default _mkldnn_transpose_.default _philox_normal_.default _philox_uniform_.default
    _resize_output_.default abs_.default absolute_.default acos_.default acosh_.default add_.Scalar
    add_.Tensor addbmm_.default addcdiv_.default addcmul_.default addmm_.default addmv_.default addr_.default
    arccos_.default arccosh_.default arcsin_.default arcsinh_.default arctan2_.default arctan_.default
    arctanh_.default as_strided_.default asin_.default asinh_.default atan2_.default atan_.default
    atanh_.default baddbmm_.default bitwise_and_.Scalar bitwise_and_.Tensor bitwise_left_shift_.Tensor
    bitwise_left_shift_.Tensor_Scalar bitwise_not_.default bitwise_or_.Scalar bitwise_or_.Tensor
    bitwise_right_shift_.Tensor bitwise_right_shift_.Tensor_Scalar bitwise_xor_.Scalar bitwise_xor_.Tensor
    ceil_.default celu_.default clamp_.Tensor clamp_.default clamp_max_.Tensor clamp_max_.default
    clamp_min_.Tensor clamp_min_.default clip_.Tensor clip_.default conj_physical_.default copy_.default
    copy_sparse_to_sparse_.default copysign_.Scalar copysign_.Tensor cos_.default cosh_.default
    cumprod_.default cumsum_.default deg2rad_.default detach_.default digamma_.default div_.Scalar
    div_.Scalar_mode div_.Tensor div_.Tensor_mode divide_.Scalar divide_.Scalar_mode divide_.Tensor
    divide_.Tensor_mode elu_.default embedding_renorm_.default eq_.Scalar eq_.Tensor erf_.default
    erfc_.default erfinv_.default exp2_.default exp_.default expm1_.default fill_.Scalar fill_.Tensor
    fix_.default float_power_.Scalar float_power_.Tensor floor_.default floor_divide_.Scalar
    floor_divide_.Tensor fmod_.Scalar fmod_.Tensor frac_.default gcd_.default ge_.Scalar ge_.Tensor
    gelu_.default greater_.Scalar greater_.Tensor greater_equal_.Scalar greater_equal_.Tensor gt_.Scalar
    gt_.Tensor hardsigmoid_.default hardswish_.default hardtanh_.default heaviside_.default hypot_.default
    i0_.default igamma_.default igammac_.default index_add_.default index_copy_.default
    index_fill_.int_Scalar index_fill_.int_Tensor index_put_.default index_reduce_.default lcm_.default
    ldexp_.default le_.Scalar le_.Tensor leaky_relu_.default lerp_.Scalar lerp_.Tensor less_.Scalar
    less_.Tensor less_equal_.Scalar less_equal_.Tensor lgamma_.default log10_.default log1p_.default
    log2_.default log_.default logical_and_.default logical_not_.default logical_or_.default
    logical_xor_.default logit_.default lt_.Scalar lt_.Tensor masked_fill_.Scalar masked_fill_.Tensor
    masked_scatter_.default mish_.default mul_.Scalar mul_.Tensor multiply_.Scalar multiply_.Tensor
    mvlgamma_.default nan_to_num_.default ne_.Scalar ne_.Tensor neg_.default negative_.default
    nextafter_.default not_equal_.Scalar not_equal_.Tensor pow_.Scalar pow_.Tensor put_.default
    rad2deg_.default reciprocal_.default relu6_.default relu_.default remainder_.Scalar remainder_.Tensor
    renorm_.default resize_.default resize_as_.default resize_as_sparse_.default round_.decimals
    round_.default rsqrt_.default scatter_.reduce scatter_.src scatter_.value scatter_.value_reduce
    scatter_add_.default scatter_reduce_.two selu_.default set_.default set_.source_Tensor sgn_.default
    sigmoid_.default sign_.default silu_.default sin_.default sinc_.default sinh_.default
    sparse_resize_.default sparse_resize_and_clear_.default sqrt_.default square_.default squeeze_.default
    squeeze_.dim squeeze_.dims sub_.Scalar sub_.Tensor subtract_.Scalar subtract_.Tensor swapaxes_.default
    swapdims_.default t_.default tan_.default tanh_.default threshold_.default transpose_.default
    tril_.default triu_.default true_divide_.Scalar true_divide_.Tensor trunc_.default unsqueeze_.default
    xlogy_.Scalar_Other xlogy_.Tensor zero_.default
    """),
}


# --- the rule, from the schemas -----------------------------------------------------------------------


def exception(namespace: str, overload: str) -> str | None:
    """Why ``namespace::name.overload`` is refused whatever its schema says, or None."""
    name = overload.split(".", 1)[0]
    found = EXCEPTIONS.get(f"{namespace}::{overload}") or EXCEPTIONS.get(f"{namespace}::{name}")
    if found:
        return found
    return next((why for part, why in KINDS.items() if part in name), None)


def schema_refusal(schema, tags=()) -> str | None:
    """Why an operator with this schema and these tags is no function of its arguments alone (None when it
    is one): it writes an argument, takes a generator, draws from the global one, or returns other than
    tensors and numbers."""
    import torch

    for argument in schema.arguments:
        if argument.alias_info is not None and argument.alias_info.is_write:
            return f"writes its argument {argument.name!r}"
        if "Generator" in str(argument.type):
            return f"takes a random number generator ({argument.name!r})"
    if torch.Tag.nondeterministic_seeded in tags:
        return "draws from the global random number generator"
    for value in schema.returns:
        if not _plain(value.type):
            return f"returns a {value.type}, not tensors or numbers"
    return None


_PLAIN_KINDS = {"TensorType", "IntType", "FloatType", "BoolType", "ComplexType", "NumberType", "SymIntType",
                "SymFloatType", "SymBoolType"}


def _plain(kind) -> bool:
    """Whether a schema type is a tensor or a number, or an optional or list of those."""
    if kind.kind() in ("ListType", "OptionalType"):
        return _plain(kind.getElementType())
    return kind.kind() in _PLAIN_KINDS


def in_place_twin(schema, functional: frozenset[str]) -> str | None:
    """The functional twin in ``functional`` of an in-place operator that writes its ``self`` alone: the
    same name without its last ``_`` (``__iand__``: ``__and__``) and the same argument types; None when
    ``schema`` is no such operator or has no such twin."""
    writes = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    name = schema.name.split("::", 1)[1]
    if len(writes) != 1 or writes[0] is not schema.arguments[0] or writes[0].kwarg_only or not name.endswith("_"):
        return None
    twin = re.sub(r"^__i(\w+)__$", r"__\1__", name) if name.startswith("__i") else name[:-1]
    kinds = [str(a.type) for a in schema.arguments]
    for overload in sorted(functional):
        base, _, _ = overload.partition(".")
        if base == twin and _argument_types(schema.name.split("::")[0], overload) == kinds:
            return overload
    return None


def _argument_types(namespace: str, overload: str) -> list[str]:
    return [str(a.type) for a in operator_schema(namespace, overload).arguments]


def operator_schema(namespace: str, overload: str):
    """The schema of ``namespace::name.overload`` (``default``: the unnamed overload); ``RuntimeError`` when
    this torch has none."""
    import torch

    name, _, which = overload.partition(".")
    return torch._C._get_schema(f"{namespace}::{name}", "" if which == "default" else which)


def operator_tags(namespace: str, overload: str) -> tuple:
    """The tags of a registered operator (it must be one: the lookup walks ``torch.ops``)."""
    import torch

    name, _, which = overload.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), which).tags


def registered(namespace: str) -> list[str]:
    """The overloads this process registered in ``namespace``, as ``name.overload``."""
    import torch

    out = []
    for qualified in torch._C._dispatch_get_all_op_names():
        found, _, overload = qualified.partition("::")
        if found == namespace:
            out.append(overload if "." in overload else f"{overload}.default")
    return sorted(out)


def allowed_by_rule() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The functional and in-place lists as this torch's schemas make them (namespaces importable here)."""
    import importlib

    functional: dict[str, list[str]] = {}
    in_place: dict[str, list[str]] = {}
    for namespace, module in NAMESPACES.items():
        if module:
            importlib.import_module(module)
        names = registered(namespace)
        functional[namespace] = [
            overload for overload in names
            if exception(namespace, overload) is None
            and schema_refusal(operator_schema(namespace, overload), operator_tags(namespace, overload)) is None
        ]
        allowed = frozenset(functional[namespace])
        in_place[namespace] = [overload for overload in names if exception(namespace, overload) is None
                               and in_place_twin(operator_schema(namespace, overload), allowed)]
    return functional, in_place
