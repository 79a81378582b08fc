/*
 * nn_complete.c - one-shot completion as a wasi:nn component (the component twin of complete.wasm).
 *
 * Usage:  nn_complete.wasm ALIAS PROMPT [CONFIG_JSON]
 * Calls:  load-by-name(ALIAS) -> init-execution-context -> compute([("prompt", PROMPT as U8)]),
 *         plus ("metadata", CONFIG_JSON as U8) when given (any of the host's config keys).
 * Output: stdout: the tensor "output" exactly as returned, then "\n";
 *         stderr: the tensor "metadata" (the same JSON as get_output index 1), then "\n".
 * Errors: "wasi-nn error: CALL: CODE: MESSAGE" on stderr and exit 1; wrong arguments: usage, exit 2.
 */
#include "nn_component.h"

__attribute__((export_name("wasi:cli/run@0.2.0#run")))
int32_t run(void) {
    const str_t *argv;
    size_t argc = get_args(&argv);
    if (argc != 3 && argc != 4) {
        err_s("usage: nn_complete.wasm ALIAS PROMPT [CONFIG_JSON]\n");
        return 1;
    }
    int32_t ctx;
    if (open_context(argv[1], &ctx)) return 1;
    bytes_t output, metadata;
    const char *config = argc == 4 ? argv[3].ptr : 0;
    size_t config_len = argc == 4 ? argv[3].len : 0;
    if (compute_with(ctx, argv[2].ptr, argv[2].len, config, config_len, &output, &metadata)) return 1;
    out(output.ptr, output.len);
    out("\n", 1);
    err(metadata.ptr, metadata.len);
    err("\n", 1);
    nn_drop_context(ctx);
    return 0;
}
