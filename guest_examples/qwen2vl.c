/*
 * qwen2vl.c - WasmEdge's qwen2vl example guest (wasmedge-ggml/qwen2vl), ported to C.
 *
 * Usage:  qwen2vl.wasm ALIAS [PROMPT]; env mmproj and image (see vision_chat.h).
 * Prompt format of a chat turn (ChatML with the image between vision markers):
 *   <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n
 *   <|vision_start|><image><|vision_end|>INPUT<|im_end|>\n<|im_start|>assistant\n
 */
#define VISION_NAME "qwen2vl"
#define VISION_FIRST_TURN                                                                  \
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"       \
    "<|vision_start|><image><|vision_end|>%s<|im_end|>\n<|im_start|>assistant\n"
#define VISION_NEXT_TURN "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n"
#define VISION_END_OF_TURN "<|im_end|>\n"
#define VISION_DIMS_ONE 0
#include "vision_chat.h"
