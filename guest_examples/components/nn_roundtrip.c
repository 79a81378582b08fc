/*
 * nn_roundtrip.c - moves bytes through the tensor resource and back, to time list<u8> crossings.
 *
 * Usage:  nn_roundtrip.wasm SIZE COUNT
 * COUNT times: [constructor]tensor([SIZE], U8, SIZE bytes) -> [method]tensor.data() -> compare ->
 * drop.  Output: "ok SIZE COUNT\n" on stdout; a mismatch prints "mismatch" on stderr, exit 1.
 */
#include "nn_component.h"

static uint8_t buffer[4 << 20];

static size_t parse(str_t s) {
    size_t n = 0;
    for (size_t i = 0; i < s.len; i++) n = n * 10 + (size_t)(s.ptr[i] - '0');
    return n;
}

__attribute__((export_name("wasi:cli/run@0.2.0#run")))
int32_t run(void) {
    const str_t *argv;
    size_t argc = get_args(&argv);
    if (argc != 3) {
        err_s("usage: nn_roundtrip.wasm SIZE COUNT\n");
        return 1;
    }
    size_t size = parse(argv[1]), count = parse(argv[2]);
    if (size > sizeof buffer) size = sizeof buffer;
    for (size_t i = 0; i < size; i++) buffer[i] = (uint8_t)(i * 7 + 3);
    size_t mark = heap_used;
    for (size_t n = 0; n < count; n++) {
        int32_t tensor = u8_tensor(buffer, size);
        bytes_t data;
        nn_tensor_data(tensor, &data);
        nn_drop_tensor(tensor);
        if (data.len != size) {
            err_s("mismatch\n");
            return 1;
        }
        for (size_t i = 0; i < size; i++)
            if (data.ptr[i] != buffer[i]) {
                err_s("mismatch\n");
                return 1;
            }
        heap_used = mark; /* the copy is not needed any more */
    }
    out("ok\n", 3);
    return 0;
}
