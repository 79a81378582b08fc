/*
 * guest_common.h - static inline helpers shared by the C example guests.
 *
 * Config JSON from environment variables (like WasmEdge-WASINN-examples, ABI
 * spec §8). An unset or empty variable is ignored. Keys are emitted in this
 * order, as compact JSON ({"n-predict":16,"temp":0.1}):
 *
 *   env var          JSON key          type
 *   n_predict        n-predict         int     (decimal, optional sign; else exit 2)
 *   ctx_size         ctx-size          int
 *   batch_size       batch-size        int
 *   threads          threads           int
 *   n_gpu_layers     n-gpu-layers      int
 *   seed             seed              int
 *   temp             temp              number  (text emitted verbatim, not checked)
 *   top_p            top-p             number  (verbatim)
 *   repeat_penalty   repeat-penalty    number  (verbatim)
 *   reverse_prompt   reverse-prompt    string  (JSON-escaped)
 *   stream_stdout    stream-stdout     bool    (true/1 -> true, false/0 -> false,
 *   enable_log       enable-log        bool     case-insensitive; else exit 2)
 *
 * If WASINN_CONFIG is set (non-empty), its text is used verbatim as the whole
 * config instead, and the variables above are not read. With nothing set the
 * config is "{}".
 */
#ifndef GUEST_COMMON_H
#define GUEST_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "wasi_nn.h"

/* Output buffer size used by WasmEdge's example guests (4096 * 6). */
#define GUEST_OUTPUT_MAX 24576
/* Buffer for the get_output index 1 metadata JSON. */
#define GUEST_METADATA_MAX 4096

/* ---------------------------------------------------------------- strbuf */

/* Growable byte buffer; data is always NUL-terminated. */
typedef struct {
    char *data;
    size_t len;
    size_t cap;
} strbuf_t;

static inline void guest_oom(void) {
    fputs("error: out of memory\n", stderr);
    exit(1);
}

static inline void sb_append(strbuf_t *sb, const char *s, size_t n) {
    if (sb->len + n + 1 > sb->cap) {
        size_t cap = sb->cap ? sb->cap : 256;
        while (sb->len + n + 1 > cap) cap *= 2;
        char *p = realloc(sb->data, cap);
        if (!p) guest_oom();
        sb->data = p;
        sb->cap = cap;
    }
    memcpy(sb->data + sb->len, s, n);
    sb->len += n;
    sb->data[sb->len] = '\0';
}

static inline void sb_puts(strbuf_t *sb, const char *s) { sb_append(sb, s, strlen(s)); }

static inline void sb_truncate(strbuf_t *sb, size_t len) {
    if (len < sb->len) {
        sb->len = len;
        sb->data[len] = '\0';
    }
}

static inline void sb_free(strbuf_t *sb) {
    free(sb->data);
    sb->data = NULL;
    sb->len = sb->cap = 0;
}

/* Append s as a JSON string literal (with quotes). Bytes >= 0x80 pass through. */
static inline void sb_json_string(strbuf_t *sb, const char *s) {
    static const char hex[] = "0123456789abcdef";
    sb_append(sb, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': sb_append(sb, "\\\"", 2); break;
        case '\\': sb_append(sb, "\\\\", 2); break;
        case '\b': sb_append(sb, "\\b", 2); break;
        case '\f': sb_append(sb, "\\f", 2); break;
        case '\n': sb_append(sb, "\\n", 2); break;
        case '\r': sb_append(sb, "\\r", 2); break;
        case '\t': sb_append(sb, "\\t", 2); break;
        default:
            if (*p < 0x20) {
                char esc[6] = {'\\', 'u', '0', '0', hex[*p >> 4], hex[*p & 15]};
                sb_append(sb, esc, 6);
            } else {
                sb_append(sb, (const char *)p, 1);
            }
        }
    }
    sb_append(sb, "\"", 1);
}

/* ------------------------------------------------------------ env values */

/* getenv, but an empty value counts as unset. */
static inline const char *env_get(const char *name) {
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

/* Parse a decimal integer env value; on bad input print an error and exit 2. */
static inline long long env_parse_int(const char *name, const char *value) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno != 0 || end == value || *end != '\0') {
        fprintf(stderr, "error: env %s: not an integer: %s\n", name, value);
        exit(2);
    }
    return v;
}

/* Parse a bool env value (true/false/1/0); on bad input print an error and exit 2. */
static inline int env_parse_bool(const char *name, const char *value) {
    if (strcasecmp(value, "true") == 0 || strcmp(value, "1") == 0) return 1;
    if (strcasecmp(value, "false") == 0 || strcmp(value, "0") == 0) return 0;
    fprintf(stderr, "error: env %s: not a bool (true/false/1/0): %s\n", name, value);
    exit(2);
}

/* Emit the separator and "key": for the next member of a JSON object. */
static inline void config_key(strbuf_t *sb, int *count, const char *key) {
    sb_puts(sb, *count ? ",\"" : "\"");
    sb_puts(sb, key);
    sb_puts(sb, "\":");
    (*count)++;
}

/*
 * Build the config JSON (see the table at the top) into sb (appended).
 * Returns 1 if anything was set (WASINN_CONFIG or any variable), else 0
 * (sb then holds "{}").
 */
static inline int build_config_json(strbuf_t *sb) {
    static const char *const int_vars[][2] = {
        {"n_predict", "n-predict"}, {"ctx_size", "ctx-size"},
        {"batch_size", "batch-size"}, {"threads", "threads"},
        {"n_gpu_layers", "n-gpu-layers"}, {"seed", "seed"},
    };
    static const char *const num_vars[][2] = {
        {"temp", "temp"}, {"top_p", "top-p"}, {"repeat_penalty", "repeat-penalty"},
    };
    static const char *const bool_vars[][2] = {
        {"stream_stdout", "stream-stdout"}, {"enable_log", "enable-log"},
    };
    const char *raw = env_get("WASINN_CONFIG");
    if (raw) {
        sb_puts(sb, raw);
        return 1;
    }
    int count = 0;
    const char *v;
    char num[32];
    sb_puts(sb, "{");
    for (size_t i = 0; i < sizeof int_vars / sizeof int_vars[0]; i++) {
        if ((v = env_get(int_vars[i][0])) == NULL) continue;
        snprintf(num, sizeof num, "%lld", env_parse_int(int_vars[i][0], v));
        config_key(sb, &count, int_vars[i][1]);
        sb_puts(sb, num);
    }
    for (size_t i = 0; i < sizeof num_vars / sizeof num_vars[0]; i++) {
        if ((v = env_get(num_vars[i][0])) == NULL) continue;
        config_key(sb, &count, num_vars[i][1]);
        sb_puts(sb, v);
    }
    if ((v = env_get("reverse_prompt")) != NULL) {
        config_key(sb, &count, "reverse-prompt");
        sb_json_string(sb, v);
    }
    for (size_t i = 0; i < sizeof bool_vars / sizeof bool_vars[0]; i++) {
        if ((v = env_get(bool_vars[i][0])) == NULL) continue;
        config_key(sb, &count, bool_vars[i][1]);
        sb_puts(sb, env_parse_bool(bool_vars[i][0], v) ? "true" : "false");
    }
    sb_puts(sb, "}");
    return count > 0;
}

/* ------------------------------------------------------- wasi-nn helpers */

/* Print "wasi-nn error: <call> returned <errno>" to stderr; returns rc. */
static inline int32_t nn_report(const char *call, int32_t rc) {
    fprintf(stderr, "wasi-nn error: %s returned %d\n", call, (int)rc);
    return rc;
}

/* nn_report(call, rc), then return 1 (an exit status). */
static inline int nn_fail(const char *call, int32_t rc) {
    nn_report(call, rc);
    return 1;
}

/* set_input(ctx, index, U8 tensor of len bytes with dims = [dim]). */
static inline int32_t nn_set_u8(uint32_t ctx, uint32_t index, const char *text, size_t len, uint32_t dim) {
    uint32_t dims[1] = {dim};
    wasi_nn_tensor_t t = {
        .dims_ptr = WASI_NN_PTR(dims),
        .dims_len = 1,
        .type = WASI_NN_TENSOR_U8,
        .data_ptr = WASI_NN_PTR(text),
        .data_len = (uint32_t)len,
    };
    return wasi_nn_set_input(ctx, index, WASI_NN_PTR(&t));
}

/* set_input(ctx, index, U8 tensor with dims = [len]) for prompt or JSON text. */
static inline int32_t nn_set_text(uint32_t ctx, uint32_t index, const char *text, size_t len) {
    return nn_set_u8(ctx, index, text, len, (uint32_t)len);
}

/* set_input(ctx, 0, prompt) as U8 text. */
static inline int32_t nn_set_prompt(uint32_t ctx, const char *prompt, size_t len) {
    return nn_set_text(ctx, WASI_NN_INDEX_PROMPT, prompt, len);
}

/*
 * get_output(ctx, index, buf, cap); *len = bytes written, clamped to cap
 * (a pre-master host may report more than it was given room for).
 */
static inline int32_t nn_get_output(uint32_t ctx, uint32_t index, char *buf, size_t cap,
                                    size_t *len) {
    uint32_t n = 0;
    int32_t rc = wasi_nn_get_output(ctx, index, WASI_NN_PTR(buf), (uint32_t)cap, WASI_NN_PTR(&n));
    *len = (rc == 0) ? (n < cap ? n : cap) : 0;
    return rc;
}

/* get_output(ctx, 1): the metadata JSON, NUL-terminated in buf (cap > 1). */
static inline int32_t nn_get_metadata(uint32_t ctx, char *buf, size_t cap, size_t *len) {
    int32_t rc = nn_get_output(ctx, WASI_NN_INDEX_METADATA, buf, cap - 1, len);
    buf[*len] = '\0';
    return rc;
}

/*
 * The one-shot flow shared by complete.c and load_bytes.c:
 * set_input(0, prompt) -> compute -> get_output(0) -> stdout: output bytes
 * exactly as returned + "\n" -> get_output(1) -> stderr: metadata JSON + "\n".
 * Any non-zero errno: error line on stderr, return 1. compute returning 101
 * (ContextFull): error line, then the output and metadata are still printed,
 * return 1. Otherwise return 0.
 */
/* load_by_name_with_config(alias, config) (config is freed), then init_execution_context.
 * Returns 0 with *ctx set, or 1 after an error line. */
static inline int open_context_with(const char *alias, strbuf_t *config, uint32_t *ctx) {
    uint32_t graph = 0;
    int32_t rc = wasi_nn_load_by_name_with_config(WASI_NN_PTR(alias), (uint32_t)strlen(alias),
                                                  WASI_NN_PTR(config->data), (uint32_t)config->len,
                                                  WASI_NN_PTR(&graph));
    sb_free(config);
    if (rc != 0) return nn_fail("load_by_name_with_config", rc);
    if ((rc = wasi_nn_init_execution_context(graph, WASI_NN_PTR(ctx))) != 0)
        return nn_fail("init_execution_context", rc);
    return 0;
}

/* open_context_with(alias, the config JSON from the environment). */
static inline int open_named_context(const char *alias, uint32_t *ctx) {
    strbuf_t config = {0};
    build_config_json(&config);
    return open_context_with(alias, &config, ctx);
}

static inline int run_completion(uint32_t ctx, const char *prompt) {
    static char out[GUEST_OUTPUT_MAX];
    static char meta[GUEST_METADATA_MAX];
    size_t out_len = 0, meta_len = 0;
    int32_t rc;
    int status = 0;

    if ((rc = nn_set_prompt(ctx, prompt, strlen(prompt))) != 0) return nn_fail("set_input", rc);
    if ((rc = wasi_nn_compute(ctx)) != 0) {
        nn_report("compute", rc);
        if (rc != WASI_NN_ECONTEXT_FULL) return 1;
        status = 1;
    }
    if ((rc = nn_get_output(ctx, WASI_NN_INDEX_PROMPT, out, sizeof out, &out_len)) != 0)
        return nn_fail("get_output", rc);
    fwrite(out, 1, out_len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if ((rc = nn_get_metadata(ctx, meta, sizeof meta, &meta_len)) != 0)
        return nn_fail("get_output", rc);
    fwrite(meta, 1, meta_len, stderr);
    fputc('\n', stderr);
    return status;
}

#endif /* GUEST_COMMON_H */
