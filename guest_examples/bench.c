/*
 * bench.c - the guest `wasinn bench` runs: one timed answer, computed or streamed.
 *
 * Usage:  bench.wasm ALIAS MODE TOKENS LETTERS
 *   ALIAS    name of a model preloaded by the host (load_by_name_with_config)
 *   MODE     compute: compute the prompt with n-predict 1 (its first token), then
 *              compute again with n-predict TOKENS (set_input index 1 metadata),
 *              then get_output(0) - a guest that answers a first token early;
 *            stream: compute_single + get_output_single TOKENS times, then
 *              fini_single - WasmEdge's streaming examples and LlamaEdge's apps
 *   TOKENS   tokens generated (1 to 1000000)
 *   LETTERS  prompt length: that many random ASCII letters (random_get), so no
 *            two instances share a prompt prefix beyond the model's BOS token
 *
 * Env: the config variables of guest_common.h, or WASINN_CONFIG as raw JSON:
 *   the load config ("{}" if nothing is set). `wasinn bench` sets
 *   {"temp":0,"ignore-eos":true} so every guest generates exactly TOKENS.
 *
 * Output: one JSON line on stdout once the answer is complete:
 *   {"mode":"compute","tokens":T,"output_tokens":M,"start_ns":S,"first_ns":F,"end_ns":E}
 *   S: wall clock (CLOCK_REALTIME, ns) after the context is made, before the
 *   prompt is set; F: when the first generated token was back in the guest; E:
 *   when the last was. output_tokens is the metadata's count of the last
 *   compute (compute) or TOKENS read (stream).
 * Errors: "wasi-nn error: <call> returned <errno>" on stderr, exit 1.
 * Exit: 0 success; 1 wasi-nn error or a stream that ended early; 2 wrong
 *   arguments (usage line on stderr).
 */
#include <time.h>
#include <unistd.h>

#include "guest_common.h"

static const char LETTERS_ALPHABET[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The number after "key": in the metadata JSON, or -1. */
static long long meta_int(const char *meta, const char *key) {
    const char *at = strstr(meta, key);
    if (!at) return -1;
    at = strchr(at, ':');
    return at ? strtoll(at + 1, NULL, 10) : -1;
}

static int set_n_predict(uint32_t ctx, long long n) {
    char json[64];
    int len = snprintf(json, sizeof json, "{\"n-predict\":%lld}", n);
    int32_t rc = nn_set_text(ctx, WASI_NN_INDEX_METADATA, json, (size_t)len);
    return rc ? nn_fail("set_input", rc) : 0;
}

static int compute_answer(uint32_t ctx, const char *prompt, long long tokens, long long *first,
                          long long *made) {
    static char out[GUEST_OUTPUT_MAX];
    static char meta[GUEST_METADATA_MAX];
    size_t len = 0;
    int32_t rc;
    if ((rc = nn_set_prompt(ctx, prompt, strlen(prompt))) != 0) return nn_fail("set_input", rc);
    if (set_n_predict(ctx, 1)) return 1;
    if ((rc = wasi_nn_compute(ctx)) != 0) return nn_fail("compute", rc);
    *first = now_ns();
    if (set_n_predict(ctx, tokens)) return 1;
    if ((rc = wasi_nn_compute(ctx)) != 0) return nn_fail("compute", rc);
    if ((rc = nn_get_output(ctx, WASI_NN_INDEX_PROMPT, out, sizeof out, &len)) != 0)
        return nn_fail("get_output", rc);
    if ((rc = nn_get_metadata(ctx, meta, sizeof meta, &len)) != 0) return nn_fail("get_output", rc);
    *made = meta_int(meta, "\"output_tokens\"");
    return 0;
}

static int stream_answer(uint32_t ctx, const char *prompt, long long tokens, long long *first,
                         long long *made) {
    static char piece[GUEST_OUTPUT_MAX];
    int32_t rc;
    if ((rc = nn_set_prompt(ctx, prompt, strlen(prompt))) != 0) return nn_fail("set_input", rc);
    for (*made = 0; *made < tokens; ++*made) {
        if ((rc = wasi_nn_compute_single(ctx)) != 0) return nn_fail("compute_single", rc);
        uint32_t n = 0;
        rc = wasi_nn_get_output_single(ctx, WASI_NN_INDEX_PROMPT, WASI_NN_PTR(piece), sizeof piece,
                                       WASI_NN_PTR(&n));
        if (rc != 0) return nn_fail("get_output_single", rc);
        if (*made == 0) *first = now_ns();
    }
    if ((rc = wasi_nn_fini_single(ctx)) != 0) return nn_fail("fini_single", rc);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5 || (strcmp(argv[2], "compute") != 0 && strcmp(argv[2], "stream") != 0)) {
        fputs("usage: bench.wasm ALIAS compute|stream TOKENS LETTERS\n", stderr);
        return 2;
    }
    long long tokens = strtoll(argv[3], NULL, 10);
    long long letters = strtoll(argv[4], NULL, 10);
    if (tokens < 1 || tokens > 1000000 || letters < 1 || letters > 1000000) {
        fputs("bench.wasm: TOKENS and LETTERS are 1 to 1000000\n", stderr);
        return 2;
    }
    char *prompt = malloc((size_t)letters + 1);
    if (!prompt) guest_oom();
    if (getentropy(prompt, (size_t)(letters < 256 ? letters : 256)) != 0) return nn_fail("getentropy", errno);
    for (long long i = 0; i < letters; ++i) {
        if (i % 256 == 0 && i > 0) getentropy(prompt + i, (size_t)(letters - i < 256 ? letters - i : 256));
        prompt[i] = LETTERS_ALPHABET[(unsigned char)prompt[i] % 52];
    }
    prompt[letters] = '\0';

    uint32_t ctx = 0;
    int failed = open_named_context(argv[1], &ctx);
    if (failed) return failed;
    long long start = now_ns(), first = 0, made = 0;
    failed = strcmp(argv[2], "compute") == 0 ? compute_answer(ctx, prompt, tokens, &first, &made)
                                             : stream_answer(ctx, prompt, tokens, &first, &made);
    long long end = now_ns();
    if (failed) return failed;
    printf("{\"mode\":\"%s\",\"tokens\":%lld,\"output_tokens\":%lld,\"start_ns\":%lld,\"first_ns\":%lld,"
           "\"end_ns\":%lld}\n",
           argv[2], tokens, made, start, first, end);
    return 0;
}
