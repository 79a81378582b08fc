/*
 * chat.c - interactive streaming chat through a preloaded model.
 *
 * Usage:  chat.wasm ALIAS
 *   ALIAS  name of a model preloaded by the host (load_by_name_with_config,
 *          config JSON built from the env exactly as in complete.c)
 *
 * Input: stdin, one user message per line. The trailing "\n" (and a "\r"
 *   before it) is stripped; lines that are empty or only spaces/tabs are
 *   skipped; the guest exits 0 at EOF.
 *
 * Env:
 *   config variables of guest_common.h (or WASINN_CONFIG), sent at load.
 *   chat_template  unset/empty: the prompt is the raw line (no history).
 *                  "chatml": the prompt is the whole ChatML conversation:
 *                    [<|im_start|>system\n{system_prompt}<|im_end|>\n]
 *                    per earlier turn: <|im_start|>user\n{line}<|im_end|>\n
 *                                      <|im_start|>assistant\n{answer}<|im_end|>\n
 *                    then: <|im_start|>user\n{line}<|im_end|>\n<|im_start|>assistant\n
 *                  any other value: error, exit 2.
 *   system_prompt  optional system message (chatml only).
 *   n_predict      if > 0, at most this many compute_single calls per answer
 *                  (also sent to the host as n-predict, which streaming ignores).
 *
 * Per line: set_input(0, prompt as U8), then loop compute_single:
 *   0   -> get_output_single(0); the piece bytes go to stdout at once (fflush);
 *   100 -> end of answer;
 *   any other errno -> "wasi-nn error: compute_single returned <errno>" on
 *          stderr, end of answer.
 *   Then fini_single, and "\n" on stdout. A failing set_input,
 *   get_output_single or fini_single prints its error line and ends the
 *   answer the same way. So stdout holds exactly one answer + "\n" per
 *   non-blank input line, and nothing else.
 *   ChatML history: the answer as streamed (without the EOG token) is
 *   appended; if the turn hit errno 101 (ContextFull) or 102 (PromptTooLong),
 *   the history is reset to the system message instead, as WasmEdge's example
 *   guests do.
 *
 * Exit: 0 at EOF; 1 if load_by_name_with_config or init_execution_context
 *   fails (error line on stderr); 2 wrong arguments (usage line on stderr) or
 *   a malformed env variable.
 */
#include "guest_common.h"

static const char IM_START_USER[] = "<|im_start|>user\n";
static const char IM_END_ASSISTANT[] = "<|im_end|>\n<|im_start|>assistant\n";
static const char IM_END[] = "<|im_end|>\n";

/* Strip "\n" / "\r\n"; return 1 if the line is empty or only spaces/tabs. */
static int strip_line(char *line, size_t *len) {
    size_t n = *len;
    if (n > 0 && line[n - 1] == '\n') n--;
    if (n > 0 && line[n - 1] == '\r') n--;
    line[n] = '\0';
    *len = n;
    for (size_t i = 0; i < n; i++)
        if (line[i] != ' ' && line[i] != '\t') return 0;
    return 1;
}

/*
 * Stream one answer for the prompt. Pieces go to stdout and, if answer is
 * not NULL, are appended to it. Returns the first errno other than 0/100
 * seen (0 if none).
 */
static int32_t stream_answer(uint32_t ctx, const char *prompt, size_t prompt_len,
                             long long max_calls, strbuf_t *answer) {
    static char piece[GUEST_OUTPUT_MAX];
    int32_t err = 0, rc;
    if ((rc = nn_set_prompt(ctx, prompt, prompt_len)) != 0) {
        err = nn_report("set_input", rc);
    } else {
        for (long long calls = 0; max_calls <= 0 || calls < max_calls; calls++) {
            rc = wasi_nn_compute_single(ctx);
            if (rc == WASI_NN_EEND_OF_SEQUENCE) break;
            if (rc != 0) {
                err = nn_report("compute_single", rc);
                break;
            }
            uint32_t n = 0;
            rc = wasi_nn_get_output_single(ctx, WASI_NN_INDEX_PROMPT, WASI_NN_PTR(piece),
                                           sizeof piece, WASI_NN_PTR(&n));
            if (rc != 0) {
                err = nn_report("get_output_single", rc);
                break;
            }
            if (n > sizeof piece) n = sizeof piece;
            fwrite(piece, 1, n, stdout);
            fflush(stdout);
            if (answer) sb_append(answer, piece, n);
        }
    }
    if ((rc = wasi_nn_fini_single(ctx)) != 0) {
        nn_report("fini_single", rc);
        if (!err) err = rc;
    }
    fputc('\n', stdout);
    fflush(stdout);
    return err;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fputs("usage: chat.wasm ALIAS\n", stderr);
        return 2;
    }
    const char *alias = argv[1];

    int chatml = 0;
    const char *tmpl = env_get("chat_template");
    if (tmpl) {
        if (strcmp(tmpl, "chatml") != 0) {
            fprintf(stderr, "error: env chat_template: unsupported value: %s (only chatml)\n",
                    tmpl);
            return 2;
        }
        chatml = 1;
    }
    long long max_calls = 0;
    const char *np = env_get("n_predict");
    if (np) max_calls = env_parse_int("n_predict", np);

    uint32_t ctx = 0;
    int failed = open_named_context(alias, &ctx);
    if (failed) return failed;

    /* ChatML: history holds the conversation so far (ends after an <|im_end|>\n). */
    strbuf_t history = {0};
    sb_puts(&history, "");
    const char *system_prompt = env_get("system_prompt");
    if (chatml && system_prompt) {
        sb_puts(&history, "<|im_start|>system\n");
        sb_puts(&history, system_prompt);
        sb_puts(&history, IM_END);
    }
    const size_t system_len = history.len;

    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    while ((got = getline(&line, &line_cap, stdin)) >= 0) {
        size_t len = (size_t)got;
        if (strip_line(line, &len)) continue;
        if (!chatml) {
            stream_answer(ctx, line, len, max_calls, NULL);
            continue;
        }
        sb_puts(&history, IM_START_USER);
        sb_append(&history, line, len);
        sb_puts(&history, IM_END_ASSISTANT);
        /* The host copies the prompt in set_input, so the answer may be
           appended to the same buffer while streaming. */
        int32_t err = stream_answer(ctx, history.data, history.len, max_calls, &history);
        if (err == WASI_NN_ECONTEXT_FULL || err == WASI_NN_EPROMPT_TOO_LONG)
            sb_truncate(&history, system_len);
        else
            sb_puts(&history, IM_END);
    }
    free(line);
    sb_free(&history);
    return 0;
}
