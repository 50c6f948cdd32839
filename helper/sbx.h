/*
 * sbx.h - what the helper's source files share.
 *
 * sbx.c keeps the subcommand table and the pieces every subcommand uses; a
 * larger subcommand lives in a file of its own and is declared here, so the
 * table is the one place that names them all.
 */
#ifndef SBX_H
#define SBX_H

#include <stddef.h>

/* Growable, NUL-terminated byte buffer (sbx.c); out of memory ends the process. */
struct buf {
	char *p;
	size_t len, cap;
};

void oom(void) __attribute__((noreturn));
void *xmalloc(size_t n);
void buf_add(struct buf *b, const char *s, size_t n);
void buf_puts(struct buf *b, const char *s);
void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A JSON string literal; bytes that are not UTF-8 become U+FFFD. */
void buf_json_str(struct buf *b, const char *str, size_t n);

/* `sbx agent` (agent.c): the sandbox's main process, serving the channel of docs/agent.md. */
int cmd_agent(int argc, char **argv);
/* The --root the helper was started with (default /workspace). */
extern const char *g_root;

#endif
