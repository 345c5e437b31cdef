/* tok_chat.c — owns chat formatting: recognises the family of a model's Jinja chat template
 * (ChatML, Llama-3, Llama-2, Mistral v1, v3-Tekken and v7, Gemma, Phi-3, Phi-4, Phi-4-mini,
 * Granite 3.x and 4.x)
 * from its text and renders one system + user turn with the assistant turn opened, byte-for-byte as the template itself renders it (checked against
 * jinja2 renderings in testdata/tokenizer/chat.jsonl), and the text that follows an assistant
 * answer to go on with one more user turn (testdata/bench/chat-turns.jsonl).  No Jinja interpreter: the families
 * are fixed shapes, and anything else is refused with a clear message. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>
#include "core/strbuf.h"
#include "tok/tok_internal.h"

static char *mistral_v7_default_system(const char *tpl, bool *ok);
static char *granite_default_system(const char *tpl, bool *ok);
static char *granite4_default_system(const char *tpl, bool *ok);

void tok_detect_chat(tokenizer *t) {
    const char *s = t->chat_template;
    if (!s || !*s) t->chat = TOK_CHAT_NONE;
    else if (strstr(s, "<|im_sep|>")) t->chat = TOK_CHAT_PHI4;   /* before ChatML: Phi-4's variant of it */
    /* SmolLM3's: ChatML's turns after a generated system turn (metadata, a reasoning mode, default
     * instructions) that plain ChatML would leave out: refused, not rendered wrong */
    else if (strstr(s, "Reasoning Mode: ")) t->chat = TOK_CHAT_UNKNOWN;
    else if (strstr(s, "<|im_start|>")) t->chat = TOK_CHAT_CHATML;
    else if (strstr(s, "<|start_header_id|>")) t->chat = TOK_CHAT_LLAMA3;
    /* Granite's <|start_of_role|>ROLE<|end_of_role|>: 3.x always writes a system turn, by
     * default one of its own (knowledge cutoff, today's date); 4.x only for a system message,
     * else 4.0's g4_default_system_message.  Refused when that default is not readable. */
    else if (strstr(s, "<|start_of_role|>")) {
        bool ok, g4 = strstr(s, "set ns = namespace(") != NULL;
        free(g4 ? granite4_default_system(s, &ok) : granite_default_system(s, &ok));
        t->chat = !ok ? TOK_CHAT_UNKNOWN : g4 ? TOK_CHAT_GRANITE4 : TOK_CHAT_GRANITE;
    }
    else if (strstr(s, "<start_of_turn>")) t->chat = TOK_CHAT_GEMMA;
    /* Mistral's v7 (Mistral-Small 3.x, Devstral, Ministral 3): a [SYSTEM_PROMPT] turn, by
     * default the template's own default_system_message; refused, not rendered as v1, when
     * that default is an expression llmi does not read */
    else if (strstr(s, "[SYSTEM_PROMPT]")) {
        bool ok;
        free(mistral_v7_default_system(s, &ok));
        t->chat = ok ? TOK_CHAT_MISTRAL_V7 : TOK_CHAT_UNKNOWN;
    }
    /* Mistral's v3-Tekken (Mistral-Nemo): "[INST]" + content + "[/INST]" without spaces; told
     * from v1 as llama.cpp does (its tools block, no " [INST]") */
    else if (strstr(s, "\"[INST]\"") && strstr(s, "[AVAILABLE_TOOLS]") && !strstr(s, " [INST]"))
        t->chat = TOK_CHAT_MISTRAL_TEKKEN;
    else if (strstr(s, "[INST]")) t->chat = strstr(s, "<<SYS>>") ? TOK_CHAT_LLAMA2 : TOK_CHAT_MISTRAL;
    /* Phi-4-mini writes every role as '<|' + role + '|>' with no newline: before Phi-3.5's,
     * whose literal <|assistant|> and <|end|> it shares */
    else if (strstr(s, "'<|' + message['role'] + '|>'") && strstr(s, "<|end|>")) t->chat = TOK_CHAT_PHI4_MINI;
    else if (strstr(s, "<|assistant|>") && strstr(s, "<|end|>")) t->chat = TOK_CHAT_PHI3;
    else t->chat = TOK_CHAT_UNKNOWN;
}

const char *tok_chat_template_name(const tokenizer *t) {
    switch (t->chat) {
    case TOK_CHAT_CHATML: return "chatml";
    case TOK_CHAT_LLAMA3: return "llama3";
    case TOK_CHAT_LLAMA2: return "llama2";
    case TOK_CHAT_MISTRAL: return "mistral";
    case TOK_CHAT_MISTRAL_TEKKEN: return "mistral-tekken";
    case TOK_CHAT_MISTRAL_V7: return "mistral-v7";
    case TOK_CHAT_GRANITE: return "granite";
    case TOK_CHAT_GRANITE4: return "granite4";
    case TOK_CHAT_GEMMA: return "gemma";
    case TOK_CHAT_PHI3: return "phi3";
    case TOK_CHAT_PHI4: return "phi4";
    case TOK_CHAT_PHI4_MINI: return "phi4mini";
    case TOK_CHAT_UNKNOWN: return "unknown";
    default: return "none";
    }
}

/* Python str.isspace(): what Jinja's trim filter and str.strip() remove. */
static bool py_space(int32_t c) {
    if (c < 0) return false;
    if (c == 0x1C || c == 0x1D || c == 0x1E || c == 0x1F) return true;
    const utf8proc_property_t *p = utf8proc_get_property(c);
    return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
           p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

static void put_stripped(strbuf *b, const char *s) {
    size_t n = strlen(s), st = 0, en = n;
    utf8proc_int32_t cp;
    while (st < n) {
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + st, (utf8proc_ssize_t)(n - st), &cp);
        if (k <= 0 || !py_space(cp)) break;
        st += (size_t)k;
    }
    while (en > st) {
        size_t i = en - 1;
        while (i > st && ((uint8_t)s[i] & 0xC0) == 0x80) i--;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(en - i), &cp);
        if (k <= 0 || (size_t)k != en - i || !py_space(cp)) break;
        en = i;
    }
    strbuf_put(b, s + st, en - st);
}

/* The default system prompt a ChatML template writes when the conversation has none
 * (SmolLM2, Qwen2.5): the first string literal "<|im_start|>system\n...<|im_end|>" whose body is
 * plain text.  Returns a malloc'ed string, or NULL when the template has no such default. */
static char *chatml_default_system(const char *tpl) {
    const char *key = "<|im_start|>system";
    for (const char *p = strstr(tpl, key); p; p = strstr(p + 1, key)) {
        const char *q = p + strlen(key);
        if (q[0] == '\n') q += 1;
        else if (q[0] == '\\' && q[1] == 'n') q += 2;
        else continue;
        const char *e = strstr(q, "<|im_end|>");
        if (!e || e == q) continue;
        if (memchr(q, '\'', (size_t)(e - q)) || memchr(q, '"', (size_t)(e - q)) || memchr(q, '{', (size_t)(e - q)) ||
            memchr(q, '}', (size_t)(e - q)))
            continue;
        char *out = malloc((size_t)(e - q) + 1);
        if (!out) return NULL;
        size_t k = 0;
        for (const char *c = q; c < e; c++) {
            if (c[0] == '\\' && c + 1 < e) {
                c++;
                out[k++] = c[0] == 'n' ? '\n' : c[0] == 't' ? '\t' : c[0];
            } else out[k++] = c[0];
        }
        out[k] = '\0';
        return out;
    }
    return NULL;
}

/* A string expression of a template's `set NAME = EXPR %}` from p (after the '='): string
 * literals ('...' or "...", Python's escapes), strftime_now('FMT') (today in FMT, as
 * transformers' strftime_now), and `today` where the template set today =
 * strftime_now("FMT") (Mistral-Small 3.2), joined by +, into b.  Returns false for anything
 * else. */
static bool template_string_expr(const char *tpl, const char *p, strbuf *b) {
    for (;;) {
        while (*p == ' ' || *p == '\n') p++;
        const char *fmt_at = NULL;
        bool call = false;   /* strftime_now(...) written here, not through `today` */
        if (*p == '\'' || *p == '"') {
            const char q = *p++;
            for (; *p && *p != q; p++) {
                if (*p != '\\') {
                    strbuf_put(b, p, 1);
                    continue;
                }
                p++;
                char c = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p;
                if (!*p) break;
                if (*p != 'n' && *p != 't' && *p != '\\' && *p != '\'' && *p != '"') strbuf_put(b, "\\", 1);
                strbuf_put(b, &c, 1);
            }
            if (*p != q) return false;
            p++;
        } else if (strncmp(p, "strftime_now(", 13) == 0) {
            fmt_at = p + 13;
            call = true;
        } else if (strncmp(p, "today", 5) == 0) {
            const char *f = strstr(tpl, "set today = strftime_now(");
            if (!f) return false;
            fmt_at = f + strlen("set today = strftime_now(");
            p += 5;
        } else {
            return false;
        }
        if (fmt_at) {   /* ('FMT') or ("FMT"): today's date in that format */
            const char q = *fmt_at, *f = fmt_at + 1, *e = q == '\'' || q == '"' ? strchr(f, q) : NULL;
            char fmt[32], date[64];
            if (!e || e[1] != ')' || e - f >= (long)sizeof fmt) return false;
            snprintf(fmt, sizeof fmt, "%.*s", (int)(e - f), f);
            time_t now = time(NULL);
            struct tm tm;
            localtime_r(&now, &tm);
            if (!strftime(date, sizeof date, fmt, &tm)) return false;
            strbuf_puts(b, date);
            if (call) p = e + 2;   /* past its ')' */
        }
        while (*p == ' ' || *p == '\n') p++;
        if (*p == '+') {
            p++;
            continue;
        }
        return !b->oom && (strncmp(p, "%}", 2) == 0 || strncmp(p, "-%}", 3) == 0);
    }
}

/* A malloc'ed string from b, "" when empty; NULL (b freed) when !ok. */
static char *template_string_done(strbuf *b, bool ok) {
    if (!ok) {
        free(b->p);
        return NULL;
    }
    return b->p ? b->p : strdup("");
}

/* Mistral v7's default system message: the template's `set default_system_message = ...`
 * (template_string_expr).  A malloc'ed string ("" without one); NULL and *ok false for an
 * expression of anything else. */
static char *mistral_v7_default_system(const char *tpl, bool *ok) {
    strbuf b = {0};
    const char *p = strstr(tpl, "set default_system_message =");
    *ok = !p || template_string_expr(tpl, p + strlen("set default_system_message ="), &b);
    return template_string_done(&b, *ok);
}

/* Granite 3.x's default system message, for a conversation without one, no tools, documents
 * or thinking: its first `set system_message = EXPR` that starts with a string literal
 * (Knowledge Cutoff Date, today's date, "You are Granite, developed by IBM."), then what its
 * `else` branch appends (`set system_message = system_message + EXPR`, " You are a helpful AI
 * assistant.").  NULL and *ok false when the template has no such two parts. */
static char *granite_default_system(const char *tpl, bool *ok) {
    static const char set[] = "set system_message = ", add[] = "set system_message = system_message + ";
    strbuf b = {0};
    const char *p = tpl, *e = tpl;
    while ((p = strstr(p, set)) != NULL && p[sizeof set - 1] != '"' && p[sizeof set - 1] != '\'') p++;
    *ok = p && template_string_expr(tpl, p + sizeof set - 1, &b);
    while (*ok && (e = strstr(e, "{%- else %}")) != NULL) {
        e += strlen("{%- else %}");
        const char *q = e;
        while (*q == ' ' || *q == '\n') q++;
        if (strncmp(q, "{%- ", 4) == 0 && strncmp(q + 4, add, sizeof add - 1) == 0) break;
    }
    *ok = *ok && e && template_string_expr(tpl, strstr(e, add) + sizeof add - 1, &b);
    return template_string_done(&b, *ok);
}

/* Granite 4.0's default system message (g4_default_system_message), written when the
 * conversation has no non-empty one; "" for Granite 4.1's template, which has none.  NULL and
 * *ok false for an expression template_string_expr does not read. */
static char *granite4_default_system(const char *tpl, bool *ok) {
    strbuf b = {0};
    const char *p = strstr(tpl, "set g4_default_system_message =");
    *ok = !p || template_string_expr(tpl, p + strlen("set g4_default_system_message ="), &b);
    return template_string_done(&b, *ok);
}

static const char *token_text(const tokenizer *t, int id, size_t *n) {
    if (id < 0 || id >= t->n_vocab) { *n = 0; return ""; }
    *n = t->str_len[id];
    return t->text + t->str_off[id];
}

/* Starts a rendering: no output yet, a NULL user message is empty, and the model's template
 * must be one llmi renders; flag (--chat, --turns) starts the message. */
static int chat_begin(const tokenizer *t, const char *flag, const char **user, char **out, llmi_status *st) {
    *out = NULL;
    if (!*user) *user = "";
    if (t->chat == TOK_CHAT_NONE)
        return llmi_fail(st, LLMI_E_USAGE, "%s: the model has no chat template (tokenizer.chat_template)", flag);
    if (t->chat == TOK_CHAT_UNKNOWN)
        return llmi_fail(st, LLMI_E_USAGE, "%s: model's chat template is not one of chatml, llama3, llama2, mistral, gemma, "
                         "phi3, phi4, phi4mini, mistral-tekken, mistral-v7, granite, granite4", flag);
    return 0;
}

/* Hands the rendered text over as *out, or fails when building it ran out of memory. */
static int chat_done(strbuf *b, char **out, const char *flag, llmi_status *st) {
    if (b->oom || !b->p) {
        free(b->p);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory formatting the prompt", flag);
    }
    *out = b->p;
    return 0;
}

/* One user turn of each family, the assistant turn opened after it: Llama-2 starts every
 * user turn with BOS (Mistral writes BOS once, before the first); Llama-3 and Llama-2 strip
 * the content. */
static const struct user_turn_shape {
    const char *open, *close;
    bool strip, bos;
} user_turns[] = {
    [TOK_CHAT_CHATML] = {"<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n", false, false},
    [TOK_CHAT_LLAMA3] = {"<|start_header_id|>user<|end_header_id|>\n\n",
                         "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", true, false},
    [TOK_CHAT_LLAMA2] = {"[INST] ", " [/INST]", true, true},
    [TOK_CHAT_MISTRAL] = {"[INST] ", " [/INST]", false, false},
    [TOK_CHAT_MISTRAL_TEKKEN] = {"[INST]", "[/INST]", false, false},
    [TOK_CHAT_MISTRAL_V7] = {"[INST]", "[/INST]", false, false},
    [TOK_CHAT_GEMMA] = {"<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n", true, false},
    [TOK_CHAT_PHI3] = {"<|user|>\n", "<|end|>\n<|assistant|>\n", false, false},
    [TOK_CHAT_PHI4] = {"<|im_start|>user<|im_sep|>", "<|im_end|><|im_start|>assistant<|im_sep|>", false, false},
    [TOK_CHAT_PHI4_MINI] = {"<|user|>", "<|end|><|assistant|>", false, false},
    [TOK_CHAT_GRANITE] = {"<|start_of_role|>user<|end_of_role|>", "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
                          false, false},
    [TOK_CHAT_GRANITE4] = {"<|start_of_role|>user<|end_of_role|>",
                           "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>", false, false},
};

static void user_turn(strbuf *b, const tokenizer *t, const char *content) {
    const struct user_turn_shape *u = &user_turns[t->chat];
    if (!u->open) return;   /* no family: chat_begin refused it */
    size_t bl;
    const char *bos = token_text(t, t->bos_id, &bl);
    if (u->bos) strbuf_put(b, bos, bl);
    strbuf_puts(b, u->open);
    if (u->strip) put_stripped(b, content);
    else strbuf_puts(b, content);
    strbuf_puts(b, u->close);
}

/* user_turn of pre + system + post + user (of user alone when system is NULL): a system
 * prompt folded into the first user message, for templates without a system turn. */
static void user_turn_folded(strbuf *b, const tokenizer *t, const char *pre, const char *system, const char *post,
                             const char *user) {
    if (!system) {
        user_turn(b, t, user);
        return;
    }
    strbuf c = {0};
    strbuf_puts(&c, pre);
    strbuf_puts(&c, system);
    strbuf_puts(&c, post);
    strbuf_puts(&c, user);
    if (c.oom) b->oom = true;
    else user_turn(b, t, c.p);
    free(c.p);
}

int tok_chat_format(const tokenizer *t, const char *system, const char *user, char **out, llmi_status *st) {
    if (chat_begin(t, "--chat", &user, out, st)) return st->code;
    strbuf b = {0};
    size_t bl;
    const char *bos = token_text(t, t->bos_id, &bl);
    switch (t->chat) {
    case TOK_CHAT_CHATML: {
        char *def = system ? NULL : chatml_default_system(t->chat_template);
        const char *sys = system ? system : def;
        if (sys) {
            strbuf_puts(&b, "<|im_start|>system\n");
            strbuf_puts(&b, sys);
            strbuf_puts(&b, "<|im_end|>\n");
        }
        free(def);
        user_turn(&b, t, user);
        break;
    }
    case TOK_CHAT_LLAMA3:
        strbuf_put(&b, bos, bl);
        if (strstr(t->chat_template, "Cutting Knowledge Date:")) {
            /* Llama-3.1/3.2/3.3: the system turn is always written, with the knowledge cutoff
             * and a date: strftime_now("%d %b %Y") where the template asks for it (3.2),
             * else the template's default date_string. */
            char cutoff[64] = "", date[64] = "26 Jul 2024";
            const char *c = strstr(t->chat_template, "Cutting Knowledge Date:");
            const char *e = strstr(c, "\\n");
            if (e && e - c < (long)sizeof cutoff) snprintf(cutoff, sizeof cutoff, "%.*s", (int)(e - c), c);
            const char *d = strstr(t->chat_template, "set date_string = \"");
            if (strstr(t->chat_template, "strftime_now")) {
                time_t now = time(NULL);
                struct tm tm;
                localtime_r(&now, &tm);
                strftime(date, sizeof date, "%d %b %Y", &tm);
            } else if (d) {
                d += strlen("set date_string = \"");
                const char *q = strchr(d, '"');
                if (q && q - d < (long)sizeof date) snprintf(date, sizeof date, "%.*s", (int)(q - d), d);
            }
            strbuf_puts(&b, "<|start_header_id|>system<|end_header_id|>\n\n");
            strbuf_puts(&b, cutoff);
            strbuf_puts(&b, "\nToday Date: ");
            strbuf_puts(&b, date);
            strbuf_puts(&b, "\n\n");
            if (system) put_stripped(&b, system);
            strbuf_puts(&b, "<|eot_id|>");
        } else if (system) {
            strbuf_puts(&b, "<|start_header_id|>system<|end_header_id|>\n\n");
            put_stripped(&b, system);
            strbuf_puts(&b, "<|eot_id|>");
        }
        user_turn(&b, t, user);
        break;
    case TOK_CHAT_LLAMA2:
        /* content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + user, then strip()ped as a whole */
        user_turn_folded(&b, t, "<<SYS>>\n", system, "\n<</SYS>>\n\n", user);
        break;
    case TOK_CHAT_MISTRAL:
        /* The template refuses a system role; put the system text before the user's, as
         * llama.cpp does for Mistral v1. */
        strbuf_put(&b, bos, bl);
        user_turn_folded(&b, t, "", system && *system ? system : NULL, "\n\n", user);
        break;
    case TOK_CHAT_MISTRAL_TEKKEN:
        /* Mistral-Nemo's: the system message (an empty one too) + "\n\n" before the content
         * of the last user message, here the only one */
        strbuf_put(&b, bos, bl);
        user_turn_folded(&b, t, "", system, "\n\n", user);
        break;
    case TOK_CHAT_MISTRAL_V7: {
        /* Mistral-Small 3.x's, Devstral's, Ministral 3's: the system message (an empty one too),
         * else the template's default when it has one, as a [SYSTEM_PROMPT] turn */
        bool ok;
        char *def = system ? NULL : mistral_v7_default_system(t->chat_template, &ok);
        const char *sys = system ? system : def;
        strbuf_put(&b, bos, bl);
        if (sys && (system || *sys)) {
            strbuf_puts(&b, "[SYSTEM_PROMPT]");
            strbuf_puts(&b, sys);
            strbuf_puts(&b, "[/SYSTEM_PROMPT]");
        }
        free(def);
        user_turn(&b, t, user);
        break;
    }
    case TOK_CHAT_GEMMA:
        /* Gemma 3: no system turn; the system text + "\n\n" opens the first user turn, before
         * the user's content, which alone is trimmed */
        strbuf_put(&b, bos, bl);
        strbuf_puts(&b, user_turns[TOK_CHAT_GEMMA].open);
        if (system) {
            strbuf_puts(&b, system);
            strbuf_puts(&b, "\n\n");
        }
        put_stripped(&b, user);
        strbuf_puts(&b, user_turns[TOK_CHAT_GEMMA].close);
        break;
    case TOK_CHAT_PHI3:
        /* Phi-3.5-mini's template: a system turn only for a non-empty system message */
        if (system && *system) {
            strbuf_puts(&b, "<|system|>\n");
            strbuf_puts(&b, system);
            strbuf_puts(&b, "<|end|>\n");
        }
        user_turn(&b, t, user);
        break;
    case TOK_CHAT_PHI4:
    case TOK_CHAT_PHI4_MINI:
        /* microsoft/phi-4's and Phi-4-mini-instruct's templates: a system turn for any system
         * message, empty too */
        if (system) {
            const bool mini = t->chat == TOK_CHAT_PHI4_MINI;
            strbuf_puts(&b, mini ? "<|system|>" : "<|im_start|>system<|im_sep|>");
            strbuf_puts(&b, system);
            strbuf_puts(&b, mini ? "<|end|>" : "<|im_end|>");
        }
        user_turn(&b, t, user);
        break;
    case TOK_CHAT_GRANITE:
    case TOK_CHAT_GRANITE4: {
        /* Granite 3.x: a system turn always, the system message (an empty one too) else the
         * template's default; 4.x: for a non-empty system message, else 4.0's default */
        const bool g4 = t->chat == TOK_CHAT_GRANITE4;
        bool ok;
        const bool given = system && (*system || !g4);
        char *def = given ? NULL : g4 ? granite4_default_system(t->chat_template, &ok)
                                      : granite_default_system(t->chat_template, &ok);
        const char *sys = given ? system : def;
        if (sys && (*sys || !g4)) {
            strbuf_puts(&b, "<|start_of_role|>system<|end_of_role|>");
            strbuf_puts(&b, sys);
            strbuf_puts(&b, "<|end_of_text|>\n");
        }
        free(def);
        user_turn(&b, t, user);
        break;
    }
    default: break;
    }
    return chat_done(&b, out, "--chat", st);
}

/* tok_chat_next_turn with, for Mistral v3-Tekken only, the system message folded into the
 * new (last) user turn, where that template writes it. */
static int next_turn(const tokenizer *t, const char *system, const char *user, const char *flag, char **out,
                     llmi_status *st) {
    if (chat_begin(t, flag, &user, out, st)) return st->code;
    strbuf b = {0};
    size_t el;
    const char *eos = token_text(t, t->eos_id, &el);
    /* what closes the assistant turn after its content */
    switch (t->chat) {
    case TOK_CHAT_CHATML: strbuf_puts(&b, "<|im_end|>\n"); break;
    case TOK_CHAT_LLAMA3: strbuf_puts(&b, "<|eot_id|>"); break;
    case TOK_CHAT_LLAMA2:   /* ' ' + content.strip() + ' ' + eos: the answer brings its own ' ' */
        strbuf_puts(&b, " ");
        strbuf_put(&b, eos, el);
        break;
    case TOK_CHAT_MISTRAL:
    case TOK_CHAT_MISTRAL_TEKKEN:
    case TOK_CHAT_MISTRAL_V7: strbuf_put(&b, eos, el); break;
    case TOK_CHAT_GEMMA: strbuf_puts(&b, "<end_of_turn>\n"); break;
    case TOK_CHAT_PHI3: strbuf_puts(&b, "<|end|>\n"); break;
    case TOK_CHAT_PHI4: strbuf_puts(&b, "<|im_end|>"); break;
    case TOK_CHAT_PHI4_MINI: strbuf_puts(&b, "<|end|>"); break;
    case TOK_CHAT_GRANITE:
    case TOK_CHAT_GRANITE4: strbuf_puts(&b, "<|end_of_text|>\n"); break;
    default: break;
    }
    if (t->chat == TOK_CHAT_MISTRAL_TEKKEN) user_turn_folded(&b, t, "", system, "\n\n", user);
    else user_turn(&b, t, user);
    return chat_done(&b, out, flag, st);
}

int tok_chat_next_turn(const tokenizer *t, const char *user, char **out, llmi_status *st) {
    return next_turn(t, NULL, user, "--turns", out, st);
}

/* An assistant message's content as the family's templates write it in the history, before
 * what closes the turn (tok_chat_next_turn writes that): ChatML as it is (Qwen3's template,
 * recognised by its "</think>", drops a reasoning block: what follows the last "</think>",
 * newlines stripped from its start); Llama-3 and Gemma trimmed; Llama-2 ' ' + stripped;
 * Mistral as it is. */
static void assistant_content(strbuf *b, const tokenizer *t, const char *content) {
    switch (t->chat) {
    case TOK_CHAT_CHATML: {
        const char *c = content, *think;
        if (strstr(t->chat_template, "</think>"))
            while ((think = strstr(c, "</think>")) != NULL) c = think + strlen("</think>");
        if (c != content)
            while (*c == '\n') c++;
        strbuf_puts(b, c);
        break;
    }
    case TOK_CHAT_LLAMA3:
    case TOK_CHAT_GEMMA: put_stripped(b, content); break;
    case TOK_CHAT_LLAMA2:
        strbuf_puts(b, " ");
        put_stripped(b, content);
        break;
    default: strbuf_puts(b, content); break;
    }
}

int tok_chat_messages(const tokenizer *t, const char *system, const char *const *turns, int n_turns, char **out,
                      llmi_status *st) {
    *out = NULL;
    if (n_turns < 1 || n_turns % 2 == 0)
        return llmi_fail(st, LLMI_E_USAGE, "messages: after the system message, user and assistant messages must "
                         "alternate from a user message to a user message (got %d)", n_turns);
    /* Mistral v3-Tekken writes the system message with the last user message only */
    const bool sys_last = t->chat == TOK_CHAT_MISTRAL_TEKKEN && n_turns > 1;
    char *first = NULL;
    if (tok_chat_format(t, sys_last ? NULL : system, turns[0], &first, st)) return st->code;
    strbuf b = {0};
    strbuf_puts(&b, first);
    free(first);
    for (int k = 1; k + 1 < n_turns; k += 2) {
        assistant_content(&b, t, turns[k]);
        char *next = NULL;
        if (next_turn(t, sys_last && k + 2 == n_turns ? system : NULL, turns[k + 1], "messages", &next, st)) {
            free(b.p);
            return st->code;
        }
        strbuf_puts(&b, next);
        free(next);
    }
    return chat_done(&b, out, "messages", st);
}

/* Tokens of template text: special-token strings parsed, no BOS added. */
static int piece_tokens(const tokenizer *t, const char *text, size_t len, int32_t **ids, int *n, llmi_status *st) {
    *ids = NULL;
    *n = 0;
    return len ? tok_encode(t, text, len, false, true, ids, n, st) : 0;
}

int tok_chat_pieces_make(const tokenizer *t, const char *system, tok_chat_pieces *c, llmi_status *st) {
    static const char MARK[] = "\x01llmi-chat-message\x01";
    const size_t ml = sizeof MARK - 1;
    *c = (tok_chat_pieces){0};
    char *one = NULL, *two = NULL;
    if (t->chat == TOK_CHAT_MISTRAL_TEKKEN && system)
        return llmi_fail(st, LLMI_E_USAGE, "--system: this model's chat template (Mistral v3-Tekken) writes the system "
                         "message with the latest user message, which a conversation growing turn by turn cannot "
                         "keep as its prefix; leave --system out, or send whole conversations as \"messages\"");
    int rc = tok_chat_format(t, system, MARK, &one, st);
    if (!rc) rc = tok_chat_next_turn(t, MARK, &two, st);
    const char *a = one ? strstr(one, MARK) : NULL, *b = two ? strstr(two, MARK) : NULL;
    if (!rc && (!a || !b)) rc = llmi_fail(st, LLMI_E_RUNTIME, "chat: the template lost the user message");
    if (!rc) rc = piece_tokens(t, one, (size_t)(a - one), &c->first, &c->n_first, st);
    if (!rc) rc = piece_tokens(t, a + ml, strlen(a + ml), &c->after, &c->n_after, st);
    if (!rc) rc = piece_tokens(t, two, (size_t)(b - two), &c->next, &c->n_next, st);
    if (!rc) rc = piece_tokens(t, b + ml, strlen(b + ml), &c->after_next, &c->n_after_next, st);
    free(one);
    free(two);
    if (rc) tok_chat_pieces_free(c);
    return rc;
}

void tok_chat_pieces_free(tok_chat_pieces *c) {
    free(c->first);
    free(c->after);
    free(c->next);
    free(c->after_next);
    *c = (tok_chat_pieces){0};
}
