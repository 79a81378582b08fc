/*
 * llava.c - ask a vision model about an image, the way WasmEdge's llava example guests do.
 *
 * Usage:  llava.wasm ALIAS QUESTION
 *   ALIAS     name of a model preloaded by the host with a projector (--nn-mmproj)
 *   QUESTION  the text after the image
 *
 * Env:
 *   image     path of the image file, inside a directory the host preopened (--dir); required
 *   mmproj    sent as the "mmproj" config key, as WasmEdge guests do: a projector file inside a
 *             preopened directory, or the one the host configured for ALIAS; optional
 *   base64    "1": read the image here and put it inline in the prompt as
 *             <img src="data:image/png;base64,...">, then stream the answer with compute_single
 *             (like llava-base64-stream); otherwise send "image" as a config key and run one
 *             compute (like llava)
 *   the config variables of guest_common.h (n_predict, temp, ... or WASINN_CONFIG, a JSON object);
 *             with base64, n_predict also bounds the number of compute_single calls
 *
 * Prompt: "USER: <image>\n" QUESTION "\nASSISTANT:" (with base64, the <img> tag replaces <image>).
 *
 * Output: the answer on stdout, then "\n"; with the image key, the metadata JSON on stderr.
 * Exit: 0 success; 1 wasi-nn error or unreadable image (error line on stderr); 2 wrong arguments.
 */
#include "guest_common.h"

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void sb_base64(strbuf_t *sb, const unsigned char *p, size_t n) {
    char quad[4];
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < n) v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n) v |= p[i + 2];
        quad[0] = B64[v >> 18 & 63];
        quad[1] = B64[v >> 12 & 63];
        quad[2] = i + 1 < n ? B64[v >> 6 & 63] : '=';
        quad[3] = i + 2 < n ? B64[v & 63] : '=';
        sb_append(sb, quad, 4);
    }
}

static int read_file(const char *path, strbuf_t *out) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "error: cannot open image %s: %s\n", path, strerror(errno));
        return 1;
    }
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) sb_append(out, buf, n);
    fclose(f);
    return 0;
}

/* The config of guest_common.h with "mmproj" (and, without base64, "image") added. */
static void build_config(strbuf_t *config, const char *image, int base64) {
    build_config_json(config);
    if (config->len == 0 || config->data[config->len - 1] != '}') return;
    sb_truncate(config, config->len - 1);
    int count = config->len > 1;
    const char *mmproj = env_get("mmproj");
    if (mmproj) {
        config_key(config, &count, "mmproj");
        sb_json_string(config, mmproj);
    }
    if (!base64) {
        config_key(config, &count, "image");
        sb_json_string(config, image);
    }
    sb_puts(config, "}");
}

/* Stream the answer: at most n_predict pieces when that is set (streaming has no other limit). */
static int stream(uint32_t ctx, const char *prompt, size_t len) {
    static char piece[GUEST_OUTPUT_MAX];
    const char *limit = env_get("n_predict");
    long long left = limit ? env_parse_int("n_predict", limit) : -1;
    int32_t rc = nn_set_prompt(ctx, prompt, len);
    if (rc != 0) return nn_fail("set_input", rc);
    while (left-- != 0 && (rc = wasi_nn_compute_single(ctx)) == 0) {
        uint32_t n = 0;
        rc = wasi_nn_get_output_single(ctx, WASI_NN_INDEX_PROMPT, WASI_NN_PTR(piece), sizeof piece,
                                       WASI_NN_PTR(&n));
        if (rc != 0) return nn_fail("get_output_single", rc);
        fwrite(piece, 1, n < sizeof piece ? n : sizeof piece, stdout);
        fflush(stdout);
    }
    if (rc != 0 && rc != WASI_NN_EEND_OF_SEQUENCE && rc != WASI_NN_ECONTEXT_FULL)
        return nn_fail("compute_single", rc);
    if ((rc = wasi_nn_fini_single(ctx)) != 0) return nn_fail("fini_single", rc);
    fputc('\n', stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fputs("usage: llava.wasm ALIAS QUESTION  (env: image=PATH, optional mmproj, base64=1)\n", stderr);
        return 2;
    }
    const char *image = env_get("image");
    if (!image) {
        fputs("error: set the image environment variable to an image file in a preopened directory\n", stderr);
        return 2;
    }
    const char *b64 = env_get("base64");
    int base64 = b64 && env_parse_bool("base64", b64);

    strbuf_t config = {0}, prompt = {0};
    build_config(&config, image, base64);
    uint32_t ctx = 0;
    if (open_context_with(argv[1], &config, &ctx)) return 1;

    sb_puts(&prompt, "USER: ");
    if (base64) {
        strbuf_t bytes = {0};
        if (read_file(image, &bytes)) return 1;
        sb_puts(&prompt, "<img src=\"data:image/png;base64,");
        sb_base64(&prompt, (const unsigned char *)bytes.data, bytes.len);
        sb_puts(&prompt, "\">");
        sb_free(&bytes);
    } else {
        sb_puts(&prompt, "<image>");
    }
    sb_puts(&prompt, "\n");
    sb_puts(&prompt, argv[2]);
    sb_puts(&prompt, "\nASSISTANT:");
    int status = base64 ? stream(ctx, prompt.data, prompt.len) : run_completion(ctx, prompt.data);
    sb_free(&prompt);
    return status;
}
