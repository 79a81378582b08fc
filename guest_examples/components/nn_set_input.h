/*
 * nn_set_input.h - the set-input guest: wasi:nn as 0.2.0-rc-2024-08-19 and 0.2.0-rc-2024-06-25
 * have it (set-input, compute(), get-output on the execution context; 2024-10-28 folded the three
 * into compute(inputs) -> outputs).  nn_set_input_2024_08_19.c and nn_set_input_2024_06_25.c
 * define NN_VERSION and include this file; the 06-25 one also defines NN_ERROR_CONSTRUCTOR
 * (that version lets a guest construct an error).
 *
 * Usage:  nn_set_input_*.wasm ALIAS STEP...   load-by-name(ALIAS) and init-execution-context, then
 * each STEP in turn:
 *   in NAME TEXT       set-input(NAME, TEXT as a U8 tensor of dimensions [len])  -> nothing | ERROR
 *   compute            compute()                                                -> nothing | ERROR
 *   out NAME           get-output(NAME): the tensor's bytes and "\n"             -> BYTES | ERROR
 *   error CODE TEXT    (06-25 only) error(CODE as an error-code index, TEXT)    -> ERROR
 * ERROR is the line "error CODE MESSAGE".  So `ALIAS in prompt P compute out output` prints what
 * `nn_complete.wasm ALIAS P` prints on stdout.  Exit 0 after the last step; 1 if ALIAS does not
 * load or a step is malformed.
 */
#include "nn_component.h"

IMPORT(NN_INFERENCE, "[method]graph-execution-context.set-input")
extern void nn_set_input(int32_t ctx, const char *name, size_t len, int32_t tensor, void *ret);
IMPORT(NN_INFERENCE, "[method]graph-execution-context.compute")
extern void nn_compute_set_inputs(int32_t ctx, void *ret);
IMPORT(NN_INFERENCE, "[method]graph-execution-context.get-output")
extern void nn_get_output(int32_t ctx, const char *name, size_t len, void *ret);
#ifdef NN_ERROR_CONSTRUCTOR
IMPORT(NN_ERRORS, "[constructor]error")
extern int32_t nn_error_new(int32_t code, const char *data, size_t len);

static int32_t digit(str_t s) { return s.len == 1 && s.ptr[0] >= '0' && s.ptr[0] <= '9' ? s.ptr[0] - '0' : -1; }
#endif

/* "error CODE MESSAGE" on stdout, and the error dropped. */
static void error_line(int32_t error) {
    str_t data;
    int32_t code = nn_error_code(error);
    const char *name = code >= 0 && code < 9 ? ERROR_CODES[code] : "?";
    nn_error_data(error, &data);
    out("error ", 6);
    out(name, str_len(name));
    out(" ", 1);
    out(data.ptr, data.len);
    out("\n", 1);
    nn_drop_error(error);
}

__attribute__((export_name("wasi:cli/run@0.2.0#run")))
int32_t run(void) {
    const str_t *argv;
    size_t argc = get_args(&argv);
    if (argc < 2) {
        err_s("usage: nn_set_input.wasm ALIAS STEP...\n");
        return 1;
    }
    int32_t ctx;
    if (open_context(argv[1], &ctx)) return 1;
    result_handle_t ret;
    for (size_t i = 2; i < argc; i++) {
        if (same(argv[i], "in") && i + 2 < argc) {
            nn_set_input(ctx, argv[i + 1].ptr, argv[i + 1].len, u8_tensor(argv[i + 2].ptr, argv[i + 2].len), &ret);
            i += 2;
        } else if (same(argv[i], "compute")) {
            nn_compute_set_inputs(ctx, &ret);
        } else if (same(argv[i], "out") && i + 1 < argc) {
            nn_get_output(ctx, argv[i + 1].ptr, argv[i + 1].len, &ret);
            i += 1;
            if (!ret.tag) {
                bytes_t data;
                nn_tensor_data(ret.value, &data);
                out(data.ptr, data.len);
                out("\n", 1);
                nn_drop_tensor(ret.value);
            }
#ifdef NN_ERROR_CONSTRUCTOR
        } else if (same(argv[i], "error") && i + 2 < argc && digit(argv[i + 1]) >= 0) {
            error_line(nn_error_new(digit(argv[i + 1]), argv[i + 2].ptr, argv[i + 2].len));
            i += 2;
            continue;
#endif
        } else {
            err_s("malformed step\n");
            return 1;
        }
        if (ret.tag) error_line(ret.value);
    }
    nn_drop_context(ctx);
    return 0;
}
