/*
 * nn_chat.c - a multi-turn chat as a wasi:nn component that streams nothing and re-sends the
 * whole conversation every turn (the host's KV prefix reuse makes later turns cheap).
 *
 * Usage:  nn_chat.wasm ALIAS MESSAGE...
 * Each MESSAGE is one user turn: the prompt is every earlier message and answer followed by it,
 * sent with compute([("prompt", CONVERSATION)]) on one execution context.
 * Output: per turn, stdout: the answer, then "\n"; stderr: the metadata JSON, then "\n".
 * Errors: "wasi-nn error: CALL: CODE: MESSAGE" on stderr and exit 1; no MESSAGE: usage, exit 2.
 */
#include "nn_component.h"

static char conversation[1 << 20];

__attribute__((export_name("wasi:cli/run@0.2.0#run")))
int32_t run(void) {
    const str_t *argv;
    size_t argc = get_args(&argv);
    if (argc < 3) {
        err_s("usage: nn_chat.wasm ALIAS MESSAGE...\n");
        return 1;
    }
    int32_t ctx;
    if (open_context(argv[1], &ctx)) return 1;
    size_t used = 0;
    for (size_t turn = 2; turn < argc; turn++) {
        for (size_t i = 0; i < argv[turn].len && used < sizeof conversation; i++) conversation[used++] = argv[turn].ptr[i];
        bytes_t output, metadata;
        if (compute_with(ctx, conversation, used, 0, 0, &output, &metadata)) return 1;
        out(output.ptr, output.len);
        out("\n", 1);
        err(metadata.ptr, metadata.len);
        err("\n", 1);
        for (size_t i = 0; i < output.len && used < sizeof conversation; i++) conversation[used++] = (char)output.ptr[i];
    }
    nn_drop_context(ctx);
    return 0;
}
