/*
 * gemma3.c - WasmEdge's gemma-3 example guest (wasmedge-ggml/gemma-3), ported to C.
 *
 * Usage:  gemma3.wasm ALIAS [PROMPT]; env mmproj and image (see vision_chat.h).
 * Prompt format of a chat turn:
 *   <start_of_turn>user\n<start_of_image><image><end_of_image>INPUT<end_of_turn>\n<start_of_turn>model\n
 * The prompt tensor's dims are [1], as the Rust guest sends them.
 */
#define VISION_NAME "gemma3"
#define VISION_FIRST_TURN \
    "<start_of_turn>user\n<start_of_image><image><end_of_image>%s<end_of_turn>\n<start_of_turn>model\n"
#define VISION_NEXT_TURN "<start_of_turn>user\n%s<end_of_turn>\n<start_of_turn>model\n"
#define VISION_END_OF_TURN "<end_of_turn>\n"
#define VISION_DIMS_ONE 1
#include "vision_chat.h"
