/*
 * hayride_stream.c - streaming generation through Hayride's interfaces (hayride:ai@0.0.63), as
 * Hayride's guests stream: graph-stream.load-by-name -> init-execution-context-stream ->
 * compute([("prompt", PROMPT as U8)], plus ("options", OPTIONS_JSON as U8) when given) ->
 * ("output", tensor-stream); then, until the stream is closed: subscribe() -> pollable.block()
 * -> read(64), each chunk written to stdout as it comes.
 *
 * Usage:  hayride_stream.wasm ALIAS PROMPT [OPTIONS_JSON]
 * Output: stdout: the streamed text, then "\n"; stderr: "stream NAME, chunks: N" (the stream's name
 *         and how many reads returned bytes).
 * Errors: "wasi-nn error: CALL: CODE: MESSAGE" on stderr and exit 1; wrong arguments: usage, exit 2.
 */
#include "nn_component.h"

#define AI "hayride:ai/"
#define V "@0.0.63"
IMPORT(AI "graph-stream" V, "load-by-name")
extern void ai_load_by_name(const char *name, size_t len, void *ret);
IMPORT(AI "graph-stream" V, "[method]graph-stream.init-execution-context-stream")
extern void ai_init_context(int32_t graph, void *ret);
IMPORT(AI "graph-stream" V, "[resource-drop]graph-stream")
extern void ai_drop_graph(int32_t graph);
IMPORT(AI "inference-stream" V, "[method]graph-execution-context-stream.compute")
extern void ai_compute(int32_t ctx, const void *inputs, size_t n, void *ret);
IMPORT(AI "inference-stream" V, "[resource-drop]graph-execution-context-stream")
extern void ai_drop_context(int32_t ctx);
IMPORT(AI "tensor-stream" V, "[method]tensor-stream.read")
extern void ai_read(int32_t stream, uint64_t len, void *ret);
IMPORT(AI "tensor-stream" V, "[method]tensor-stream.subscribe")
extern int32_t ai_subscribe(int32_t stream);
IMPORT(AI "tensor-stream" V, "[resource-drop]tensor-stream")
extern void ai_drop_stream(int32_t stream);
IMPORT("wasi:io/poll@0.2.0", "[method]pollable.block")
extern void io_block(int32_t pollable);
IMPORT("wasi:io/poll@0.2.0", "[resource-drop]pollable")
extern void io_drop_pollable(int32_t pollable);

/* result<tuple<string, own<tensor-stream>>, own<error>> */
typedef struct { uint8_t tag; union { int32_t error; struct { str_t name; int32_t stream; } ok; } v; } compute_ret_t;
/* result<list<u8>, stream-error>; stream-error: last-operation-failed(own<wasi:io error>) | closed */
typedef struct { uint8_t tag; union { bytes_t data; struct { uint8_t tag; int32_t error; } err; } v; } read_ret_t;

__attribute__((export_name("wasi:cli/run@0.2.0#run")))
int32_t run(void) {
    const str_t *argv;
    size_t argc = get_args(&argv);
    if (argc != 3 && argc != 4) {
        err_s("usage: hayride_stream.wasm ALIAS PROMPT [OPTIONS_JSON]\n");
        return 1;
    }
    result_handle_t ret;
    ai_load_by_name(argv[1].ptr, argv[1].len, &ret);
    if (ret.tag) return report("load-by-name", ret.value);
    int32_t graph = ret.value;
    ai_init_context(graph, &ret);
    ai_drop_graph(graph);
    if (ret.tag) return report("init-execution-context-stream", ret.value);
    int32_t ctx = ret.value;

    named_tensor_t inputs[2] = {{{"prompt", 6}, u8_tensor(argv[2].ptr, argv[2].len)}, {{"options", 7}, 0}};
    if (argc == 4) inputs[1].tensor = u8_tensor(argv[3].ptr, argv[3].len);
    compute_ret_t computed;
    ai_compute(ctx, inputs, argc == 4 ? 2 : 1, &computed);
    if (computed.tag) return report("compute", computed.v.error);
    int32_t stream = computed.v.ok.stream;

    size_t chunks = 0;
    for (;;) {
        int32_t pollable = ai_subscribe(stream);
        io_block(pollable);
        io_drop_pollable(pollable);
        read_ret_t got;
        ai_read(stream, 64, &got);
        if (got.tag) {
            if (got.v.err.tag == 0) {
                err_s("wasi-nn error: read: last-operation-failed\n");
                return 1;
            }
            break; /* closed: the generation ended */
        }
        if (got.v.data.len) chunks++;
        out(got.v.data.ptr, got.v.data.len);
    }
    out("\n", 1);
    err_s("stream ");
    err(computed.v.ok.name.ptr, computed.v.ok.name.len);
    char line[32] = ", chunks: ";
    size_t n = 10, digits = 0;
    char rev[20];
    do rev[digits++] = (char)('0' + chunks % 10); while ((chunks /= 10) > 0);
    while (digits) line[n++] = rev[--digits];
    line[n++] = '\n';
    err(line, n);
    ai_drop_stream(stream);
    ai_drop_context(ctx);
    return 0;
}
