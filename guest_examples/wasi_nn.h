/*
 * wasi_nn.h - the `wasi_ephemeral_nn` imports in WasmEdge's GGML dialect,
 * for C guests built for wasm32-wasi (see shared/spec/wasi-nn-ggml-abi.md §1-§2).
 *
 * Every import takes only i32 parameters and returns an i32 errno (0 = success).
 * Pointers are guest addresses (offsets into memory 0) passed as uint32_t;
 * use WASI_NN_PTR() to convert a C pointer. Out-parameters are little-endian
 * u32 values written by the host. Only the imports a guest actually calls end
 * up in its module's import section.
 */
#ifndef WASI_NN_H
#define WASI_NN_H

#include <stdint.h>

/* Guest pointer -> u32 guest address. */
#define WASI_NN_PTR(p) ((uint32_t)(uintptr_t)(p))

/* ---- errno (i32 return value of every import) ---- */
#define WASI_NN_ESUCCESS 0
#define WASI_NN_EINVALID_ARGUMENT 1
#define WASI_NN_EINVALID_ENCODING 2 /* also: config/metadata is not valid JSON */
#define WASI_NN_EMISSING_MEMORY 3
#define WASI_NN_EBUSY 4
#define WASI_NN_ERUNTIME_ERROR 5
#define WASI_NN_EUNSUPPORTED_OPERATION 6
#define WASI_NN_ETOO_LARGE 7 /* output buffer too small */
#define WASI_NN_ENOT_FOUND 8 /* load_by_name: unknown alias */
#define WASI_NN_EEND_OF_SEQUENCE 100 /* compute_single sampled an EOG token */
#define WASI_NN_ECONTEXT_FULL 101
#define WASI_NN_EPROMPT_TOO_LONG 102
#define WASI_NN_EMODEL_NOT_FOUND 103

/* ---- graph encoding (argument to load) ---- */
#define WASI_NN_ENCODING_GGML 6

/* ---- execution target (argument to load; load rejects AUTO) ---- */
#define WASI_NN_TARGET_CPU 0
#define WASI_NN_TARGET_GPU 1
#define WASI_NN_TARGET_TPU 2
#define WASI_NN_TARGET_AUTO 3

/* ---- tensor type (only the low byte counts) ---- */
#define WASI_NN_TENSOR_F16 0
#define WASI_NN_TENSOR_F32 1
#define WASI_NN_TENSOR_F64 2
#define WASI_NN_TENSOR_U8 3
#define WASI_NN_TENSOR_I32 4
#define WASI_NN_TENSOR_I64 5

/* ---- set_input index / get_output index ---- */
#define WASI_NN_INDEX_PROMPT 0   /* set_input: prompt text; get_output: generated text */
#define WASI_NN_INDEX_METADATA 1 /* set_input: JSON config; get_output: usage JSON */

/* Graph-builder entry for load: 8 bytes. */
typedef struct {
    uint32_t ptr; /* guest address of the bytes */
    uint32_t len; /* length in bytes */
} wasi_nn_builder_t;

/* Tensor for set_input: 20 bytes. */
typedef struct {
    uint32_t dims_ptr; /* guest address of a u32[] */
    uint32_t dims_len; /* number of u32 elements */
    uint32_t type;     /* WASI_NN_TENSOR_* */
    uint32_t data_ptr; /* guest address of the data */
    uint32_t data_len; /* length in bytes */
} wasi_nn_tensor_t;

_Static_assert(sizeof(wasi_nn_builder_t) == 8, "builder entry must be 8 bytes");
_Static_assert(sizeof(wasi_nn_tensor_t) == 20, "tensor struct must be 20 bytes");

#define WASI_NN_IMPORT(name) \
    __attribute__((import_module("wasi_ephemeral_nn"), import_name(name)))

/* load(builders, n_builders, encoding, target, *graph_out) */
WASI_NN_IMPORT("load")
int32_t wasi_nn_load(uint32_t builders_ptr, uint32_t builders_len, uint32_t encoding,
                     uint32_t target, uint32_t graph_out_ptr);

/* load_by_name(name, name_len, *graph_out); name need not be NUL-terminated */
WASI_NN_IMPORT("load_by_name")
int32_t wasi_nn_load_by_name(uint32_t name_ptr, uint32_t name_len, uint32_t graph_out_ptr);

/* load_by_name_with_config(name, name_len, json, json_len, *graph_out) */
WASI_NN_IMPORT("load_by_name_with_config")
int32_t wasi_nn_load_by_name_with_config(uint32_t name_ptr, uint32_t name_len,
                                         uint32_t config_ptr, uint32_t config_len,
                                         uint32_t graph_out_ptr);

/* init_execution_context(graph, *ctx_out) */
WASI_NN_IMPORT("init_execution_context")
int32_t wasi_nn_init_execution_context(uint32_t graph, uint32_t ctx_out_ptr);

/* set_input(ctx, index, *tensor) */
WASI_NN_IMPORT("set_input")
int32_t wasi_nn_set_input(uint32_t ctx, uint32_t index, uint32_t tensor_ptr);

/* compute(ctx): full generation */
WASI_NN_IMPORT("compute")
int32_t wasi_nn_compute(uint32_t ctx);

/* get_output(ctx, index, buf, buf_max, *bytes_written_out) */
WASI_NN_IMPORT("get_output")
int32_t wasi_nn_get_output(uint32_t ctx, uint32_t index, uint32_t buf_ptr, uint32_t buf_max,
                           uint32_t bytes_written_out_ptr);

/* compute_single(ctx): one token; 100 at end of sequence */
WASI_NN_IMPORT("compute_single")
int32_t wasi_nn_compute_single(uint32_t ctx);

/* get_output_single(ctx, index, buf, buf_max, *bytes_written_out): last token's piece */
WASI_NN_IMPORT("get_output_single")
int32_t wasi_nn_get_output_single(uint32_t ctx, uint32_t index, uint32_t buf_ptr,
                                  uint32_t buf_max, uint32_t bytes_written_out_ptr);

/* fini_single(ctx): end a streamed answer */
WASI_NN_IMPORT("fini_single")
int32_t wasi_nn_fini_single(uint32_t ctx);

/* unload(graph) */
WASI_NN_IMPORT("unload")
int32_t wasi_nn_unload(uint32_t graph);

/* finalize_execution_context(ctx) */
WASI_NN_IMPORT("finalize_execution_context")
int32_t wasi_nn_finalize_execution_context(uint32_t ctx);

#endif /* WASI_NN_H */
