/*
 * tts.c - text to speech the way WasmEdge-WASINN-examples' wasmedge-ggml/tts guest does it (a C port
 * of its src/main.rs: the same environment variables, config keys, calls and output files).
 *
 * Usage:  tts.wasm ALIAS TEXT
 *   ALIAS  name of an OuteTTS model preloaded by the host
 *   TEXT   the text to speak
 *
 * Env (config keys as WasmEdge's example sends them; numbers and booleans are sent verbatim as JSON):
 *   tts_output_file   tts-output-file: the WAV the host writes, inside a preopened directory; required
 *   model_vocoder     model-vocoder: the WavTokenizer GGUF, inside a preopened directory; required
 *   tts_speaker_file  tts-speaker-file: an OuteTTS speaker profile (JSON); optional
 *   enable_log, enable_debug_log (default false), n_predict (4096), ctx_size (8192), batch_size (8192),
 *   ubatch_size (8192), n_gpu_layers (100), seed, temp (sent only when set)
 *   "tts": true is always sent.
 *
 * Flow: load_by_name_with_config -> init_execution_context -> set_input(0, TEXT as a U8 tensor of
 * dims [1]) -> get_output(1) (metadata: llama_commit, llama_build_number, input_tokens printed) ->
 * compute -> get_output(0) into a 1 MiB buffer, written to output-buffer.wav in the current directory.
 *
 * Output: the lines WasmEdge's guest prints, on stdout.
 * Exit: 0 success; 1 wasi-nn error or unwritable output (error line on stderr); 2 wrong arguments.
 */
#include "guest_common.h"

#define TTS_OUTPUT_MAX (1024 * 1024)

/* ,"key":<value of env name, or fallback> with the value verbatim (JSON); nothing if both are NULL. */
static void verbatim_key(strbuf_t *config, int *count, const char *key, const char *name, const char *fallback) {
    const char *value = env_get(name);
    if (!value) value = fallback;
    if (!value) return;
    config_key(config, count, key);
    sb_puts(config, value);
}

static void string_key(strbuf_t *config, int *count, const char *key, const char *value) {
    config_key(config, count, key);
    sb_json_string(config, value);
}

/* The value of "key" in the metadata JSON, as JSON text (a number or a quoted string), or "null". */
static void print_meta(const char *label, const char *meta, const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\": ", key);
    const char *at = strstr(meta, pattern);
    if (!at) {
        printf("%snull\n", label);
        return;
    }
    at += strlen(pattern);
    size_t n = strcspn(at, ",}");
    printf("%s%.*s\n", label, (int)n, at);
}

int main(int argc, char **argv) {
    static char out[TTS_OUTPUT_MAX];
    static char meta[GUEST_METADATA_MAX];
    if (argc < 3) {
        printf("Usage: %s <nn-preload-model> <prompt>\n", argv[0]);
        return 2;
    }
    const char *output_file = env_get("tts_output_file");
    if (!output_file) {
        fputs("Failed to get output file name.\n", stderr);
        return 1;
    }
    const char *vocoder = env_get("model_vocoder");
    if (!vocoder) {
        fputs("Failed to get vocoder model.\n", stderr);
        return 1;
    }
    strbuf_t config = {0};
    int count = 0;
    sb_puts(&config, "{");
    config_key(&config, &count, "tts");
    sb_puts(&config, "true");
    string_key(&config, &count, "tts-output-file", output_file);
    string_key(&config, &count, "model-vocoder", vocoder);
    const char *speaker = env_get("tts_speaker_file");
    if (speaker) string_key(&config, &count, "tts-speaker-file", speaker);
    verbatim_key(&config, &count, "enable-log", "enable_log", "false");
    verbatim_key(&config, &count, "enable-debug-log", "enable_debug_log", "false");
    verbatim_key(&config, &count, "n-predict", "n_predict", "4096");
    verbatim_key(&config, &count, "ctx-size", "ctx_size", "8192");
    verbatim_key(&config, &count, "batch-size", "batch_size", "8192");
    verbatim_key(&config, &count, "ubatch-size", "ubatch_size", "8192");
    verbatim_key(&config, &count, "n-gpu-layers", "n_gpu_layers", "100");
    verbatim_key(&config, &count, "seed", "seed", NULL);
    verbatim_key(&config, &count, "temp", "temp", NULL);
    sb_puts(&config, "}");

    uint32_t ctx = 0;
    if (open_context_with(argv[1], &config, &ctx)) return 1;

    const char *prompt = argv[2];
    printf("Prompt:\n%s\n", prompt);
    int32_t rc = nn_set_u8(ctx, WASI_NN_INDEX_PROMPT, prompt, strlen(prompt), 1);
    if (rc != 0) return nn_fail("set_input", rc);
    size_t len = 0;
    if ((rc = nn_get_metadata(ctx, meta, sizeof meta, &len)) != 0) return nn_fail("get_output", rc);
    print_meta("[INFO] llama_commit: ", meta, "llama_commit");
    print_meta("[INFO] llama_build_number: ", meta, "llama_build_number");
    print_meta("[INFO] Number of input tokens: ", meta, "input_tokens");

    if ((rc = wasi_nn_compute(ctx)) != 0) return nn_fail("compute", rc);
    printf("[INFO] Plugin writes output to file \"%s\"\n", output_file);

    if ((rc = nn_get_output(ctx, WASI_NN_INDEX_PROMPT, out, sizeof out, &len)) != 0) return nn_fail("get_output", rc);
    FILE *f = fopen("output-buffer.wav", "wb");
    if (!f || fwrite(out, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "error: cannot write output-buffer.wav: %s\n", strerror(errno));
        return 1;
    }
    printf("[INFO] Write output buffer to file output-buffer.wav\n");
    return 0;
}
