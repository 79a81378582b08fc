/*
 * nn_probe.c - calls every wasi:nn function as its arguments say, one result line per command
 * (the component tests drive it; it also shows every call of the interface in C).
 *
 * Usage:  nn_probe.wasm COMMAND...   where COMMAND is one of
 *   name NAME              load-by-name(NAME)                       -> "graph ok" | ERROR
 *   bytes ENC TARGET HEX   load([HEX decoded], ENC, TARGET) (enum indices) -> "graph ok" | ERROR
 *   ctx                    init-execution-context on the last graph -> "ctx ok" | ERROR
 *   dropgraph | dropctx    drop the last graph / context           -> "dropped"
 *   tensor TY DIM DATA     constructor, then dimensions/ty/data    -> "tensor TY [DIMS] DATA"
 *   compute K (NAME TY DIM DATA){K}
 *                          compute on the last context with K tensors; DIM is a number or "-"
 *                          (the data's length)                     -> "outputs N" then one line
 *                          per output "NAME TY [DIMS] DATA" (FP32: the byte count) | ERROR
 *   big N                  compute with a prompt of N bytes of 'a' -> as compute
 *   spin                   loop forever (for --timeout)
 * ERROR is "error CODE MESSAGE".  Exit 0 after the last command, 1 on a malformed command.
 */
#include "nn_component.h"

static uint8_t big[(1 << 20) + 16];
static uint8_t decoded[8 << 20];
static const char *const TYPES[] = {"FP16", "FP32", "FP64", "BF16", "U8", "I32", "I64"};

static size_t number(str_t s) {
    size_t n = 0;
    for (size_t i = 0; i < s.len; i++) n = n * 10 + (size_t)(s.ptr[i] - '0');
    return n;
}

static void out_s(const char *s) { out(s, str_len(s)); }

static void out_n(size_t n) {
    char digits[24];
    size_t i = sizeof digits;
    do {
        digits[--i] = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    out(digits + i, sizeof digits - i);
}

static void error_line(int32_t error) {
    str_t data;
    int32_t code = nn_error_code(error);
    nn_error_data(error, &data);
    out_s("error ");
    out_s(code >= 0 && code < 9 ? ERROR_CODES[code] : "?");
    out_s(" ");
    out(data.ptr, data.len);
    out_s("\n");
    nn_drop_error(error);
}

static void tensor_line(int32_t tensor) {
    struct { const uint32_t *ptr; size_t len; } dims;
    bytes_t data;
    int32_t ty = 0;
    IMPORT(NN_TENSOR, "[method]tensor.dimensions")
    extern void nn_tensor_dimensions(int32_t tensor, void *ret);
    IMPORT(NN_TENSOR, "[method]tensor.ty")
    extern int32_t nn_tensor_ty(int32_t tensor);
    nn_tensor_dimensions(tensor, &dims);
    ty = nn_tensor_ty(tensor);
    nn_tensor_data(tensor, &data);
    out_s(ty >= 0 && ty < 7 ? TYPES[ty] : "?");
    out_s(" [");
    for (size_t i = 0; i < dims.len; i++) {
        if (i) out_s(",");
        out_n(dims.ptr[i]);
    }
    out_s("] ");
    if (ty == TENSOR_U8) out(data.ptr, data.len);
    else out_n(data.len);
    out_s("\n");
}

static void compute_line(int32_t ctx, const named_tensor_t *inputs, size_t n) {
    result_list_t ret;
    nn_compute(ctx, inputs, n, &ret);
    if (ret.tag) {
        error_line((int32_t)(intptr_t)ret.ptr);
        return;
    }
    out_s("outputs ");
    out_n(ret.len);
    out_s("\n");
    for (size_t i = 0; i < ret.len; i++) {
        out(ret.ptr[i].name.ptr, ret.ptr[i].name.len);
        out_s(" ");
        tensor_line(ret.ptr[i].tensor);
        nn_drop_tensor(ret.ptr[i].tensor);
    }
}

static int hex(char c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

static int32_t make_tensor(str_t ty, str_t dim, str_t data) {
    uint32_t dims[1] = {dim.len == 1 && dim.ptr[0] == '-' ? (uint32_t)data.len : (uint32_t)number(dim)};
    return nn_tensor_new(dims, 1, (int32_t)number(ty), (const uint8_t *)data.ptr, data.len);
}

__attribute__((export_name("wasi:cli/run@0.2.0#run")))
int32_t run(void) {
    const str_t *argv;
    size_t argc = get_args(&argv), i = 1;
    int32_t graph = -1, ctx = -1;
    result_handle_t ret;
    while (i < argc) {
        str_t cmd = argv[i++];
        size_t mark = heap_used;
        if (same(cmd, "name") && i < argc) {
            nn_load_by_name(argv[i].ptr, argv[i].len, &ret);
            i++;
            if (ret.tag) error_line(ret.value);
            else graph = ret.value, out_s("graph ok\n");
        } else if (same(cmd, "bytes") && i + 2 < argc) {
            str_t h = argv[i + 2];
            size_t n = h.len / 2 > sizeof decoded ? sizeof decoded : h.len / 2;
            for (size_t k = 0; k < n; k++) decoded[k] = (uint8_t)(hex(h.ptr[2 * k]) << 4 | hex(h.ptr[2 * k + 1]));
            bytes_t builders[1] = {{decoded, n}};
            IMPORT(NN_GRAPH, "load")
            extern void nn_load(const bytes_t *builders, size_t n, int32_t encoding, int32_t target, void *ret);
            nn_load(builders, 1, (int32_t)number(argv[i]), (int32_t)number(argv[i + 1]), &ret);
            i += 3;
            if (ret.tag) error_line(ret.value);
            else graph = ret.value, out_s("graph ok\n");
        } else if (same(cmd, "ctx")) {
            nn_init_execution_context(graph, &ret);
            if (ret.tag) error_line(ret.value);
            else ctx = ret.value, out_s("ctx ok\n");
        } else if (same(cmd, "dropgraph")) {
            nn_drop_graph(graph);
            out_s("dropped\n");
        } else if (same(cmd, "dropctx")) {
            nn_drop_context(ctx);
            out_s("dropped\n");
        } else if (same(cmd, "tensor") && i + 2 < argc) {
            int32_t t = make_tensor(argv[i], argv[i + 1], argv[i + 2]);
            i += 3;
            out_s("tensor ");
            tensor_line(t);
            nn_drop_tensor(t);
        } else if (same(cmd, "compute") && i < argc) {
            size_t k = number(argv[i++]);
            named_tensor_t inputs[8];
            if (k > 8 || i + 4 * k > argc) return 1;
            for (size_t j = 0; j < k; j++, i += 4)
                inputs[j] = (named_tensor_t){argv[i], make_tensor(argv[i + 1], argv[i + 2], argv[i + 3])};
            compute_line(ctx, inputs, k);
        } else if (same(cmd, "big") && i < argc) {
            size_t n = number(argv[i++]);
            if (n > sizeof big) n = sizeof big;
            for (size_t k = 0; k < n; k++) big[k] = 'a';
            named_tensor_t inputs[1] = {{{"prompt", 6}, u8_tensor(big, n)}};
            compute_line(ctx, inputs, 1);
        } else if (same(cmd, "spin")) {
            volatile uint32_t spins = 0;
            for (;;) spins++;
        } else {
            err_s("nn_probe: bad command\n");
            return 1;
        }
        heap_used = mark;
    }
    return 0;
}
