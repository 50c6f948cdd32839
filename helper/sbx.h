/*
 * sbx.h - what the helper's source files share.
 *
 * sbx.c keeps the subcommand table and the pieces every subcommand uses; a
 * larger subcommand lives in a file of its own and is declared here, so the
 * table is the one place that names them all.
 */
#ifndef SBX_H
#define SBX_H

#include <linux/openat2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Magic links (/proc/self/fd/...) could point anywhere; never follow them. */
#define RES_BENEATH (RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)

/* Growable, NUL-terminated byte buffer (sbx.c); out of memory ends the process. */
struct buf {
	char *p;
	size_t len, cap;
};

void oom(void) __attribute__((noreturn));
void *xmalloc(size_t n);
char *xstrdup(const char *s);
int write_all(int fd, const void *p, size_t n);
void buf_add(struct buf *b, const char *s, size_t n);
void buf_puts(struct buf *b, const char *s);
void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A JSON string literal; bytes that are not UTF-8 become U+FFFD. */
void buf_json_str(struct buf *b, const char *str, size_t n);

/* Errors and confined paths (sbx.c), for the file subcommands. */
__attribute__((noreturn, format(printf, 3, 4))) void fail(int code, const char *name,
							  const char *fmt, ...);
__attribute__((noreturn)) void fail_errno(int e, const char *what, const char *path);
uint64_t parse_uint(const char *s, const char *what);
int open_beneath(int dirfd, const char *path, uint64_t flags, uint64_t mode, uint64_t resolve);
void open_root(void);
char *norm_path(const char *in);
const char *type_name(mode_t m);
/* The root file subcommands work beneath, once open_root() opened it. */
extern int g_rootfd;

/* `sbx agent` (agent.c): the sandbox's main process, serving the channel of docs/agent.md. */
int cmd_agent(int argc, char **argv);
/* The --root the helper was started with (default /workspace). */
extern const char *g_root;

/* dial.c: `sbx dial PORT`, a byte stream to 127.0.0.1:PORT (previews) */
int cmd_dial(int argc, char **argv);
/* watch.c: `sbx watch PATH`, inotify events beneath PATH (WatchDir) */
int cmd_watch(int argc, char **argv);

#endif
