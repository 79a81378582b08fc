/*
 * vision_chat.h - the body of WasmEdge's gemma-3 and qwen2vl example guests, ported to C.
 *
 * A guest includes this after defining its prompt format:
 *   VISION_FIRST_TURN  printf format of the first turn: the image placeholder <image>, then %s (input)
 *   VISION_NEXT_TURN   printf format of a later turn, %s (input)
 *   VISION_END_OF_TURN appended after each answer in the saved conversation
 *   VISION_DIMS_ONE    1: the prompt tensor's dims are [1] (gemma-3), 0: [length] (qwen2vl)
 *   VISION_NAME        the guest's name in its usage line
 *
 * Usage:  NAME.wasm ALIAS [PROMPT]
 *   ALIAS   a model preloaded by the host with its projector (--nn-mmproj)
 *   PROMPT  non-interactive mode (WasmEdge's CI): print "Prompt:", the prompt, "Response:",
 *           "[INFO]" lines with the metadata read before compute (llama_commit,
 *           llama_build_number, input tokens), the answer (trimmed), then the input and output
 *           token counts; exit 0
 *   without PROMPT: chat on stdin, one line per turn ("USER:" / "ASSISTANT:"), the whole
 *           conversation re-sent each turn; a full context starts the conversation again
 *
 * Env (as the Rust guests read them): mmproj and image, both required (else "Failed to get ..."
 * and exit 1) and sent as config keys; enable_log (default false), ctx_size (default 4096),
 * n_gpu_layers (default 0), as JSON values.  Any wasi-nn error: its line on stderr, exit 1.
 */
#ifndef VISION_CHAT_H
#define VISION_CHAT_H

#include "guest_common.h"

static void vision_option(strbuf_t *config, int *count, const char *key, const char *env,
                          const char *fallback) {
    const char *value = getenv(env);
    config_key(config, count, key);
    sb_puts(config, value ? value : fallback); /* a JSON value, as serde_json::from_str reads it */
}

static int vision_config(strbuf_t *config) {
    const char *mmproj = getenv("mmproj"), *image = getenv("image");
    if (!mmproj) {
        fputs("Failed to get mmproj model.\n", stderr);
        return 1;
    }
    if (!image) {
        fputs("Failed to get the target image.\n", stderr);
        return 1;
    }
    int count = 0;
    sb_puts(config, "{");
    config_key(config, &count, "mmproj");
    sb_json_string(config, mmproj);
    config_key(config, &count, "image");
    sb_json_string(config, image);
    vision_option(config, &count, "enable-log", "enable_log", "false");
    vision_option(config, &count, "ctx-size", "ctx_size", "4096");
    vision_option(config, &count, "n-gpu-layers", "n_gpu_layers", "0");
    sb_puts(config, "}");
    return 0;
}

static int32_t vision_set_prompt(uint32_t ctx, const char *prompt, size_t len) {
    return nn_set_u8(ctx, WASI_NN_INDEX_PROMPT, prompt, len, VISION_DIMS_ONE ? 1u : (uint32_t)len);
}

/* The value of "key" in a flat metadata JSON object, printed as serde_json prints it ("null" if absent). */
static void vision_info(const char *label, const char *meta, const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(meta, pattern);
    printf("[INFO] %s: ", label);
    if (!at) {
        puts("null");
        return;
    }
    at += strlen(pattern);
    while (*at == ' ') at++;
    size_t n = 0;
    if (*at == '"') {
        n = 1;
        while (at[n] && at[n] != '"') n += at[n] == '\\' ? 2 : 1;
        n += at[n] == '"';
    } else {
        while (at[n] && at[n] != ',' && at[n] != '}') n++;
    }
    printf("%.*s\n", (int)n, at);
}

static int vision_metadata(uint32_t ctx, char *meta, size_t cap) {
    size_t len = 0;
    int32_t rc = nn_get_metadata(ctx, meta, cap, &len);
    return rc ? nn_fail("get_output", rc) : 0;
}

/* The answer with leading and trailing white space removed (Rust's str::trim), NUL-terminated. */
static char *vision_trim(char *text, size_t len) {
    while (len && strchr(" \t\r\n", text[len - 1])) len--;
    text[len] = '\0';
    while (*text && strchr(" \t\r\n", *text)) text++;
    return text;
}

static int vision_once(uint32_t ctx, const char *prompt) {
    static char out[GUEST_OUTPUT_MAX + 1], meta[GUEST_METADATA_MAX];
    printf("Prompt:\n%s\n", prompt);
    int32_t rc = vision_set_prompt(ctx, prompt, strlen(prompt));
    if (rc != 0) return nn_fail("set_input", rc);
    puts("Response:");
    if (vision_metadata(ctx, meta, sizeof meta)) return 1;
    vision_info("llama_commit", meta, "llama_commit");
    vision_info("llama_build_number", meta, "llama_build_number");
    vision_info("Number of input tokens", meta, "input_tokens");
    if ((rc = wasi_nn_compute(ctx)) != 0) return nn_fail("compute", rc);
    size_t len = 0;
    if ((rc = nn_get_output(ctx, WASI_NN_INDEX_PROMPT, out, GUEST_OUTPUT_MAX, &len)) != 0)
        return nn_fail("get_output", rc);
    puts(vision_trim(out, len));
    if (vision_metadata(ctx, meta, sizeof meta)) return 1;
    vision_info("Number of input tokens", meta, "input_tokens");
    vision_info("Number of output tokens", meta, "output_tokens");
    return 0;
}

static int vision_chat(uint32_t ctx) {
    static char line[4096], out[GUEST_OUTPUT_MAX + 1];
    strbuf_t saved = {0};
    char turn[sizeof line + 256];
    for (;;) {
        puts("USER:");
        fflush(stdout);
        char *input = NULL;
        while (!input) {
            if (!fgets(line, sizeof line, stdin)) return 0; /* end of input ends the chat */
            input = vision_trim(line, strlen(line));
            if (!*input) input = NULL;
        }
        snprintf(turn, sizeof turn, saved.len ? VISION_NEXT_TURN : VISION_FIRST_TURN, input);
        sb_puts(&saved, turn);
        int32_t rc = vision_set_prompt(ctx, saved.data, saved.len);
        if (rc != 0) return nn_fail("set_input", rc);
        int reset = 0;
        rc = wasi_nn_compute(ctx);
        if (rc == WASI_NN_ECONTEXT_FULL || rc == WASI_NN_EPROMPT_TOO_LONG) {
            printf("\n[INFO] %s, we'll reset the context and continue.\n",
                   rc == WASI_NN_ECONTEXT_FULL ? "Context full" : "Prompt too long");
            reset = 1;
        } else if (rc != 0) {
            printf("\n[ERROR] compute returned %d\n", (int)rc);
            return 1;
        }
        size_t len = 0;
        if ((rc = nn_get_output(ctx, WASI_NN_INDEX_PROMPT, out, GUEST_OUTPUT_MAX, &len)) != 0)
            return nn_fail("get_output", rc);
        char *answer = vision_trim(out, len);
        printf("ASSISTANT:\n%s\n", answer);
        if (reset) {
            sb_truncate(&saved, 0);
        } else {
            sb_puts(&saved, answer);
            sb_puts(&saved, VISION_END_OF_TURN);
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs("usage: " VISION_NAME ".wasm ALIAS [PROMPT]  (env: mmproj, image; optional enable_log, "
              "ctx_size, n_gpu_layers)\n", stderr);
        return 2;
    }
    strbuf_t config = {0};
    uint32_t ctx = 0;
    if (vision_config(&config) || open_context_with(argv[1], &config, &ctx)) return 1;
    return argc >= 3 ? vision_once(ctx, argv[2]) : vision_chat(ctx);
}

#endif /* VISION_CHAT_H */
