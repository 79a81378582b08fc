/*
 * nn_component.h - a freestanding component guest's view of wasi:nn 0.2.0-rc-2024-10-28 (or of the
 * NN_VERSION defined before including it: the functions declared here are the same in 2024-08-19 and
 * 2024-06-25; nn_set_input.h declares what those versions have instead of compute) and
 * the few wasi:cli 0.2.0 calls the examples need, written against the canonical ABI by hand
 * (no libc, no preview-1 adapter: the core module imports component functions directly and
 * wasm-tools turns it into a component with the WIT in wit/).
 *
 * Canonical ABI used here: a string or list<T> is (pointer, length); results that do not fit
 * in one i32 are written by the host to a return area whose address is the last argument;
 * result<own A, own B> is {u8 tag; pad; i32 handle}; lists the host returns are allocated
 * through the exported cabi_realloc (a bump allocator over a static heap).
 */
#ifndef NN_COMPONENT_H
#define NN_COMPONENT_H

#include <stddef.h>
#include <stdint.h>

#ifndef NN_VERSION
#define NN_VERSION "0.2.0-rc-2024-10-28"
#endif
#define NN_GRAPH "wasi:nn/graph@" NN_VERSION
#define NN_TENSOR "wasi:nn/tensor@" NN_VERSION
#define NN_INFERENCE "wasi:nn/inference@" NN_VERSION
#define NN_ERRORS "wasi:nn/errors@" NN_VERSION
#define IMPORT(module, name) __attribute__((import_module(module), import_name(name)))

/* ---- wasi:nn ---- */
IMPORT(NN_GRAPH, "load-by-name")
extern void nn_load_by_name(const char *name, size_t len, void *ret);
IMPORT(NN_GRAPH, "[method]graph.init-execution-context")
extern void nn_init_execution_context(int32_t graph, void *ret);
IMPORT(NN_GRAPH, "[resource-drop]graph")
extern void nn_drop_graph(int32_t graph);
IMPORT(NN_TENSOR, "[constructor]tensor")
extern int32_t nn_tensor_new(const uint32_t *dims, size_t ndims, int32_t ty, const uint8_t *data, size_t len);
IMPORT(NN_TENSOR, "[method]tensor.data")
extern void nn_tensor_data(int32_t tensor, void *ret);
IMPORT(NN_TENSOR, "[resource-drop]tensor")
extern void nn_drop_tensor(int32_t tensor);
IMPORT(NN_INFERENCE, "[method]graph-execution-context.compute")
extern void nn_compute(int32_t ctx, const void *inputs, size_t n, void *ret);
IMPORT(NN_INFERENCE, "[resource-drop]graph-execution-context")
extern void nn_drop_context(int32_t ctx);
IMPORT(NN_ERRORS, "[method]error.code")
extern int32_t nn_error_code(int32_t error);
IMPORT(NN_ERRORS, "[method]error.data")
extern void nn_error_data(int32_t error, void *ret);
IMPORT(NN_ERRORS, "[resource-drop]error")
extern void nn_drop_error(int32_t error);

/* ---- wasi:cli / wasi:io ---- */
IMPORT("wasi:cli/environment@0.2.0", "get-arguments")
extern void cli_get_arguments(void *ret);
IMPORT("wasi:cli/stdout@0.2.0", "get-stdout")
extern int32_t cli_get_stdout(void);
IMPORT("wasi:cli/stderr@0.2.0", "get-stderr")
extern int32_t cli_get_stderr(void);
IMPORT("wasi:io/streams@0.2.0", "[method]output-stream.blocking-write-and-flush")
extern void io_write(int32_t stream, const void *data, size_t len, void *ret);

#define TENSOR_U8 4
typedef struct { const char *ptr; size_t len; } str_t;
typedef struct { str_t name; int32_t tensor; } named_tensor_t;
typedef struct { uint8_t tag; int32_t value; } result_handle_t;
typedef struct { uint8_t tag; const named_tensor_t *ptr; size_t len; } result_list_t;
typedef struct { const uint8_t *ptr; size_t len; } bytes_t;

static const char *const ERROR_CODES[] = {"invalid-argument", "invalid-encoding", "timeout",
                                          "runtime-error", "unsupported-operation", "too-large",
                                          "not-found", "security", "unknown"};

/* ---- a bump allocator: the host's lists land here ---- */
static uint8_t heap[8 << 20];
static size_t heap_used;

__attribute__((export_name("cabi_realloc")))
void *cabi_realloc(void *old, size_t old_size, size_t align, size_t new_size) {
    size_t start = (heap_used + align - 1) & ~(align - 1);
    if (start + new_size > sizeof heap) __builtin_trap();
    uint8_t *out = heap + start;
    heap_used = start + new_size;
    for (size_t i = 0; old && i < old_size && i < new_size; i++) out[i] = ((uint8_t *)old)[i];
    return out;
}

static size_t str_len(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

static int same(str_t a, const char *b) {
    size_t n = str_len(b);
    if (a.len != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (a.ptr[i] != b[i]) return 0;
    return 1;
}

static void write_to(int32_t stream, const void *data, size_t len) {
    struct { uint8_t tag; uint8_t err_tag; int32_t error; } ret;
    while (len > 0) {
        size_t chunk = len > 4096 ? 4096 : len; /* blocking-write-and-flush takes at most 4096 bytes */
        io_write(stream, data, chunk, &ret);
        data = (const uint8_t *)data + chunk;
        len -= chunk;
    }
}

static int32_t stdout_stream = -1, stderr_stream = -1;

__attribute__((unused)) static void out(const void *data, size_t len) {
    if (stdout_stream < 0) stdout_stream = cli_get_stdout();
    write_to(stdout_stream, data, len);
}

static void err(const void *data, size_t len) {
    if (stderr_stream < 0) stderr_stream = cli_get_stderr();
    write_to(stderr_stream, data, len);
}
static void err_s(const char *s) { err(s, str_len(s)); }

/* One line on stderr for a failed call: "wasi-nn error: CALL: CODE: DATA". */
static int report(const char *call, int32_t error) {
    str_t data;
    int32_t code = nn_error_code(error);
    nn_error_data(error, &data);
    err_s("wasi-nn error: ");
    err_s(call);
    err_s(": ");
    err_s(code >= 0 && code < 9 ? ERROR_CODES[code] : "?");
    err_s(": ");
    err(data.ptr, data.len);
    err_s("\n");
    nn_drop_error(error);
    return 1;
}

/* argv from wasi:cli/environment. */
static size_t get_args(const str_t **argv) {
    struct { const str_t *ptr; size_t len; } ret;
    cli_get_arguments(&ret);
    *argv = ret.ptr;
    return ret.len;
}

/* load-by-name + init-execution-context; 0 on success. */
__attribute__((unused)) static int open_context(str_t alias, int32_t *ctx) {
    result_handle_t ret;
    nn_load_by_name(alias.ptr, alias.len, &ret);
    if (ret.tag) return report("load-by-name", ret.value);
    int32_t graph = ret.value;
    nn_init_execution_context(graph, &ret);
    nn_drop_graph(graph);
    if (ret.tag) return report("init-execution-context", ret.value);
    *ctx = ret.value;
    return 0;
}

static int32_t u8_tensor(const void *data, size_t len) {
    uint32_t dims[1] = {(uint32_t)len};
    return nn_tensor_new(dims, 1, TENSOR_U8, data, len);
}

/* compute({prompt[, metadata]}) and copy out the tensors named "output" and "metadata" (dropping
 * all outputs); config (NULL: none) is configuration JSON sent as the tensor "metadata". */
__attribute__((unused)) static int compute_with(int32_t ctx, const void *prompt, size_t len, const char *config,
                                                size_t config_len, bytes_t *output, bytes_t *metadata) {
    named_tensor_t inputs[2] = {{{"prompt", 6}, u8_tensor(prompt, len)}, {{"metadata", 8}, 0}};
    if (config) inputs[1].tensor = u8_tensor(config, config_len);
    result_list_t ret;
    nn_compute(ctx, inputs, config ? 2 : 1, &ret);
    if (ret.tag) return report("compute", (int32_t)(intptr_t)ret.ptr);
    output->len = metadata->len = 0;
    for (size_t i = 0; i < ret.len; i++) {
        bytes_t data;
        nn_tensor_data(ret.ptr[i].tensor, &data);
        if (same(ret.ptr[i].name, "output")) *output = data;
        if (same(ret.ptr[i].name, "metadata")) *metadata = data;
        nn_drop_tensor(ret.ptr[i].tensor);
    }
    return 0;
}

#endif
