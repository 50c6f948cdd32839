/*
 * sbx.h - what the helper's source files share: buffers and output, errors
 * and the cleanup a failure does, argument parsing, confined paths and stat
 * records (files.h), and the subcommands the table in sbx.c names.  One file a
 * subcommand (or a domain: stat records in files.h, tree walks in tree.h, processes in proc.h).
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
/* For walking trees we own: a symlink must never be traversed at all. */
#define RES_NOSYM (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)

/* ---- buf.c: low-level I/O, growable buffers, JSON strings ---- */

/* Growable, NUL-terminated byte buffer; out of memory ends the process. */
struct buf {
	char *p;
	size_t len, cap;
};

void oom(void) __attribute__((noreturn));
void *xmalloc(size_t n);
char *xstrdup(const char *s);
int write_all(int fd, const void *p, size_t n);
/* read(2), retried on EINTR. */
ssize_t read_retry(int fd, void *p, size_t n);
/* Room for `need` bytes at *p (capacity *cap), doubling from `first`. */
void grow_bytes(char **p, size_t *cap, size_t need, size_t first);
void buf_add(struct buf *b, const char *s, size_t n);
void buf_puts(struct buf *b, const char *s);
void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A JSON string literal; bytes that are not UTF-8 become U+FFFD. */
void buf_json_str(struct buf *b, const char *str, size_t n);

/* ---- fail.c: errors, and what a failure undoes on its way out ---- */

/* The error line on stderr, {"error":NAME,"message":...}, then the exit with
 * `code`: after what a failure undoes (below), or, for a child between fork and
 * exec (`child`), at once by _exit. */
__attribute__((noreturn, format(printf, 4, 5))) void fail_exit(bool child, int code,
							       const char *name,
							       const char *fmt, ...);
#define fail(code, ...) fail_exit(false, code, __VA_ARGS__)
#define fail_child(code, ...) fail_exit(true, code, __VA_ARGS__)
#define usage(...) fail(2, "EINVAL", __VA_ARGS__)
/* Report errno `e` for an operation on `path`, exit with `code` (fail_errno: 1). */
__attribute__((noreturn)) void fail_errno_exit(bool child, int code, int e, const char *what,
					       const char *path);
#define fail_errno_code(code, e, what, path) fail_errno_exit(false, code, e, what, path)
#define fail_errno_child(code, e, what, path) fail_errno_exit(true, code, e, what, path)
#define fail_errno(e, what, path) fail_errno_exit(false, 1, e, what, path)
/* The error object every error is spelled as (fail's line, the agent's frames). */
void buf_error(struct buf *b, const char *name, const char *msg);

/* Set while a merge swaps: fail() first undoes what it did (cmd_merge). */
extern void (*g_undo)(void);
/* `write`'s temp file, removed on any failure so errors never leave debris. */
extern int g_tmp_dirfd;
extern char g_tmp_name[64];
/* The directories `write --parents` made, removed again by unmake_dirs() (fail.c). */
#define MADE_MAX 128
extern int g_made_fd[MADE_MAX];
extern char *g_made_name[MADE_MAX];
extern volatile int g_made;
void unmake_dirs(void);
/* Set by subcommands that take data on stdin: a failure still reads it to the end. */
extern bool g_drain_stdin;
/* `write --idle-ms N`: the longest wait for the next byte on stdin (0: no bound). */
extern int g_idle_ms;
/* read(2) on stdin bounded by g_idle_ms: -1 with ETIMEDOUT when nothing came. */
ssize_t read_stdin(void *p, size_t n);

/* ---- args.c: argument parsing ---- */

uint64_t parse_uint(const char *s, const char *what);
void parse_args(int argc, char **argv, const char *flag, bool *flag_set, char **pos, int npos);

/* ---- confine.c: paths confined to the root ---- */

/* The --root the helper was started with (default /workspace; sbx.c). */
extern const char *g_root;
/* The root file subcommands work beneath, once open_root() opened it. */
extern int g_rootfd;
/* Resolve without openat2 (gVisor's answer; SBX_NO_OPENAT2 forces it). */
extern bool g_no_openat2;
int open_beneath(int dirfd, const char *path, uint64_t flags, uint64_t mode, uint64_t resolve);
void open_root(void);
char *norm_path(const char *in);
bool is_root(const char *norm);
char *split_parent(const char *norm, const char **name);
int open_dir_path(const char *norm, const char *shown);
int open_parent_dir(const char *norm, const char **name);
int mkdir_parents_noting(const char *norm, bool note);

/* stat.c: "file", "dir", "symlink" or "other" */
const char *type_name(mode_t m);

/* ---- run_child.c: what a command gets as it starts, from `sbx run` or the agent ---- */

bool loader_var(const char *entry);	/* a loader or libc variable `run` drops */
/* `envp` minus the loader variables (only fixed values when `clean`), each string a copy. */
char **command_env(char **envp, bool clean);
bool path_within(const char *path, const char *root);	/* `root` or below it */
/* Every signal's disposition back to the default, none blocked (sigprocmask's result). */
int reset_signals(void);
/* execve on the fixed PATH; returns only on failure, with execvp's errno. */
int exec_command(char **cmd, char **envp);

/* ---- the subcommands, one file each (the table: sbx.c) ---- */

int cmd_stat(int argc, char **argv);	/* stat.c */
int cmd_read(int argc, char **argv);	/* read.c */
int cmd_write(int argc, char **argv);	/* write.c */
int cmd_list(int argc, char **argv);	/* list.c */
int cmd_remove(int argc, char **argv);	/* remove.c */
int cmd_chmod(int argc, char **argv);	/* chmod.c */
int cmd_mkdir(int argc, char **argv);	/* mkdir.c */
int cmd_move(int argc, char **argv);	/* move.c */
int cmd_merge(int argc, char **argv);	/* merge.c */
int cmd_run(int argc, char **argv);	/* run.c */
int cmd_status(int argc, char **argv);	/* status.c */
int cmd_kill(int argc, char **argv);	/* kill.c */
int cmd_signal(int argc, char **argv);	/* kill.c */
int signal_by_name(const char *name);	/* kill.c: 0 when not one a caller may name */
bool signal_forwardable(int sig);	/* kill.c: one a caller may name */
/* kill.c: ask the `sbx run` supervisor `pid` to forward `sig`, in the signal it takes. */
int forward_request(pid_t pid, int sig);
bool own_executable(const char *path);	/* kill.c: `path` is this very executable */
const char *errno_name(int e);		/* fail.c: the error line's name for errno e */
int cmd_reap(int argc, char **argv);	/* kill.c */
/* `sbx agent` (agent.c): the sandbox's main process, serving the channel of docs/agent.md. */
int cmd_agent(int argc, char **argv);
/* dial.c: `sbx dial PORT`, a byte stream to 127.0.0.1:PORT (previews) */
int cmd_dial(int argc, char **argv);
/* watch.c: `sbx watch PATH`, inotify events beneath PATH (WatchDir) */
int cmd_watch(int argc, char **argv);

int cmd_zpack(int argc, char **argv);	/* zstd.c */
int cmd_zunpack(int argc, char **argv);	/* zstd.c */

#endif
