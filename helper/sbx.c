/*
 * sbx - in-container helper for sandboxd.
 *
 * Bind-mounted read-only at /.sandboxd/sbx and run via `docker exec` as the
 * unprivileged sandbox user.  Two jobs:
 *
 *   1. `run`: supervise a command so that none of its descendants outlive it
 *      (child subreaper + /proc scan + SIGKILL until nothing is left).
 *   2. file operations (stat/read/write/list/remove/mkdir) confined to a root
 *      directory.  Every path is resolved with openat2(RESOLVE_BENEATH), so
 *      the kernel, not string checks, guarantees that no symlink or `..`
 *      race can take us outside the root.
 *
 * Protocol (see helper/README.md): results on stdout as JSON lines, errors
 * as exactly one JSON line {"error":NAME,"message":...} on stderr.
 *
 * Build: `make helper` (every helper C file into one static build/sbx)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <signal.h>
#include <stdarg.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sbx.h"

#define LIST_MAX 100000
#define EXIT_KILLED 137
/* A wait that overran by more than this was a memory suspend (or a host that stalled the
 * sandbox as long): the supervisor's deadline does not count it (cmd_run). */
#define SUSPEND_JUMP_NS 500000000LL
/* For walking trees we own: a symlink must never be traversed at all. */
#define RES_NOSYM (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)

const char *g_root = "/workspace";
int g_rootfd = -1;

/* ------------------------------------------------------------------ */
/* Low-level I/O and growable buffers                                  */
/* ------------------------------------------------------------------ */

int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n > 0) {
		ssize_t w = write(fd, c, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

static ssize_t read_retry(int fd, void *p, size_t n)
{
	ssize_t r;
	do
		r = read(fd, p, n);
	while (r < 0 && errno == EINTR);
	return r;
}

/* Out of memory: nothing sane left to do, but keep the protocol intact. */
void oom(void)
{
	static const char msg[] = "{\"error\":\"EIO\",\"message\":\"out of memory\"}\n";
	(void)!write(2, msg, sizeof msg - 1);
	_exit(1);
}

void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p)
		oom();
	return p;
}

char *xstrdup(const char *s)
{
	char *p = strdup(s);
	if (!p)
		oom();
	return p;
}

void buf_add(struct buf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t nc = b->cap ? b->cap : 256;
		while (nc < b->len + n + 1)
			nc *= 2;
		char *np = realloc(b->p, nc);
		if (!np)
			oom();
		b->p = np;
		b->cap = nc;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

void buf_puts(struct buf *b, const char *s)
{
	buf_add(b, s, strlen(s));
}

void buf_printf(struct buf *b, const char *fmt, ...)
{
	char tmp[128];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	/* Only used for short numeric fragments; truncation would be a bug. */
	if (n < 0 || (size_t)n >= sizeof tmp)
		oom();
	buf_add(b, tmp, (size_t)n);
}

/* Length of the well-formed UTF-8 sequence at s, or 0 if it is invalid
 * (overlong forms, surrogates and code points above U+10FFFF included). */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	size_t len;
	uint32_t cp;
	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xC2 && s[0] <= 0xDF) {
		len = 2;
		cp = s[0] & 0x1F;
	} else if ((s[0] & 0xF0) == 0xE0) {
		len = 3;
		cp = s[0] & 0x0F;
	} else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
		len = 4;
		cp = s[0] & 0x07;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3F);
	}
	if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)))
		return 0;
	if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))
		return 0;
	return len;
}

/* File names are arbitrary bytes; JSON must be valid UTF-8, so each bad
 * byte becomes U+FFFD (lossy, but never produces unparsable output). */
void buf_json_str(struct buf *b, const char *str, size_t n)
{
	const unsigned char *s = (const unsigned char *)str;
	buf_add(b, "\"", 1);
	for (size_t i = 0; i < n;) {
		unsigned char c = s[i];
		if (c == '"' || c == '\\') {
			char esc[2] = {'\\', (char)c};
			buf_add(b, esc, 2);
			i++;
		} else if (c < 0x20) {
			buf_printf(b, "\\u%04x", c);
			i++;
		} else {
			size_t l = utf8_len(s + i, n - i);
			if (l == 0) {
				buf_add(b, "\xEF\xBF\xBD", 3);
				i++;
			} else {
				buf_add(b, (const char *)s + i, l);
				i += l;
			}
		}
	}
	buf_add(b, "\"", 1);
}

/* ------------------------------------------------------------------ */
/* Error reporting                                                     */
/* ------------------------------------------------------------------ */

static void emit_error(const char *name, const char *fmt, va_list ap)
{
	char msg[1024];
	vsnprintf(msg, sizeof msg, fmt, ap);
	struct buf b = {0};
	buf_puts(&b, "{\"error\":\"");
	buf_puts(&b, name);
	buf_puts(&b, "\",\"message\":");
	buf_json_str(&b, msg, strlen(msg));
	buf_puts(&b, "}\n");
	(void)write_all(2, b.p, b.len);
	free(b.p);
}

/* Set while a merge swaps: fail() first undoes what it did (cmd_merge). */
static void (*g_undo)(void);

/* `write`'s temp file, removed on any failure so errors never leave debris. */
static int g_tmp_dirfd = -1;
static char g_tmp_name[64];

/*
 * The directories `write --parents` made, each as its parent's descriptor and
 * its name, removed again (deepest first) if the write fails or is ended: a
 * refused write changes nothing, not even the folders on its way.  Plain
 * arrays, so the signal handler may walk them.  Past MADE_MAX new levels the
 * deeper ones are not noted (their removal then stops at the first non-empty).
 */
#define MADE_MAX 128
static int g_made_fd[MADE_MAX];
static char *g_made_name[MADE_MAX];
static volatile int g_made;

static void unmake_dirs(void)
{
	while (g_made > 0) {
		int k = --g_made;
		(void)unlinkat(g_made_fd[k], g_made_name[k], AT_REMOVEDIR);
	}
}

/*
 * Set by subcommands that take data on stdin.  On failure they still read it
 * to the end: the engine keeps an exec's output open until its stdin has been
 * delivered (the shim holds the pipe), so an unread stdin would make the
 * caller wait for an error that was already printed.  The server bounds what
 * it sends, so this is bounded too.
 */
static bool g_drain_stdin;

/*
 * `write --idle-ms N`: the longest wait for the next byte on stdin.  An engine
 * need not deliver EOF when the server's connection drops (a cancelled
 * upload), and a writer waiting forever would keep its temp file and a
 * process of the session's.  0: no bound.
 */
static int g_idle_ms;

/* read(2) on stdin bounded by g_idle_ms: -1 with ETIMEDOUT when nothing came. */
static ssize_t read_stdin(void *p, size_t n)
{
	if (g_idle_ms > 0) {
		struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
		int r;
		do
			r = poll(&pfd, 1, g_idle_ms);
		while (r < 0 && errno == EINTR);
		if (r == 0) {
			errno = ETIMEDOUT;
			return -1;
		}
	}
	return read_retry(STDIN_FILENO, p, n);
}

static void drain_stdin(void)
{
	char buf[65536];
	while (read_stdin(buf, sizeof buf) > 0)
		;
}

__attribute__((noreturn, format(printf, 3, 4)))
void fail(int code, const char *name, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	emit_error(name, fmt, ap);
	va_end(ap);
	if (g_undo) {
		void (*undo)(void) = g_undo;
		g_undo = NULL;
		undo();
	}
	if (g_tmp_name[0])
		unlinkat(g_tmp_dirfd, g_tmp_name, 0);
	unmake_dirs();
	if (g_drain_stdin)
		drain_stdin();
	exit(code);
}

#define usage(...) fail(2, "EINVAL", __VA_ARGS__)

static const char *errno_name(int e)
{
	switch (e) {
	case ENOENT: return "ENOENT";
	case ENOTDIR: return "ENOTDIR";
	case EISDIR: return "EISDIR";
	case EEXIST: return "EEXIST";
	case ENOTEMPTY: return "ENOTEMPTY";
	case ENOSPC: case EDQUOT: return "ENOSPC";
	case EACCES: case EPERM: case EROFS: return "EACCES";
	case EINVAL: case ENAMETOOLONG: return "EINVAL";
	/* openat2(RESOLVE_BENEATH) reports an escape attempt as EXDEV; ELOOP
	 * comes from magic links or symlink loops, treated the same way. */
	case EXDEV: case ELOOP: return "ESCAPE";
	default: return "EIO";
	}
}

/* Report errno `e` for an operation on `path`, exit with `code`. */
__attribute__((noreturn))
static void fail_errno_code(int code, int e, const char *what, const char *path)
{
	const char *name = errno_name(e);
	if (!strcmp(name, "ESCAPE"))
		fail(code, name, "%s %s: path resolves outside the root", what, path);
	fail(code, name, "%s %s: %s", what, path, strerror(e));
}

__attribute__((noreturn))
void fail_errno(int e, const char *what, const char *path)
{
	fail_errno_code(1, e, what, path);
}

/* ------------------------------------------------------------------ */
/* Argument parsing helpers                                            */
/* ------------------------------------------------------------------ */

uint64_t parse_uint(const char *s, const char *what)
{
	uint64_t v = 0;
	if (!*s)
		usage("invalid %s: empty", what);
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			usage("invalid %s: %s", what, s);
		if (v > (uint64_t)(INT64_MAX - 9) / 10)
			usage("invalid %s: too large", what);
		v = v * 10 + (uint64_t)(*p - '0');
	}
	return v;
}

/* Collect positional arguments and at most one boolean --flag (which may
 * appear anywhere; "--" ends flag parsing so odd file names stay usable).
 * Returns the number of positionals; usage error if it is not `npos`. */
static void parse_args(int argc, char **argv, const char *flag, bool *flag_set,
		       char **pos, int npos)
{
	int n = 0;
	bool opts = true;
	for (int i = 0; i < argc; i++) {
		if (opts && !strcmp(argv[i], "--")) {
			opts = false;
		} else if (opts && flag && !strcmp(argv[i], flag)) {
			*flag_set = true;
		} else if (opts && !strncmp(argv[i], "--", 2)) {
			usage("unknown option %s", argv[i]);
		} else {
			if (n >= npos)
				usage("too many arguments");
			pos[n++] = argv[i];
		}
	}
	if (n != npos)
		usage("expected %d argument(s), got %d", npos, n);
}

/* ------------------------------------------------------------------ */
/* Confined path resolution                                            */
/* ------------------------------------------------------------------ */

/*
 * openat2 where the kernel has none: gVisor (Debian 12's runsc) answers ENOSYS.
 * The same guarantee by walking one component at a time with
 * openat(O_NOFOLLOW) on directory fds we hold: `..` pops our own stack (never
 * the filesystem's `..`, so a concurrent rename cannot move us out), at the
 * start it is an escape (EXDEV, as RESOLVE_BENEATH says); a symlink is read
 * and its target spliced into the rest of the path (absolute: EXDEV; with
 * RES_NOSYM: ELOOP; more than 40: ELOOP).  A trailing symlink is followed
 * unless the caller asked for O_NOFOLLOW, like openat2.
 */
#define WALK_DEPTH 4096
static int walk_beneath(int dirfd, const char *path, uint64_t flags,
			uint64_t mode, uint64_t resolve)
{
	if (path[0] == '/') {
		errno = EXDEV;
		return -1;
	}
	int *stack = xmalloc(WALK_DEPTH * sizeof *stack);
	int depth = 0, follows = 0, result = -1, err = 0;
	stack[0] = dirfd;
	char *rest = xmalloc(strlen(path) + 1);
	strcpy(rest, path);
	char *p = rest;
	for (;;) {
		while (*p == '/')
			p++;
		char *end = strchr(p, '/');
		char *next = end ? end : p + strlen(p);
		while (*next == '/')
			next++;
		bool last = *next == '\0';
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char comp[NAME_MAX + 1];
		if (len > NAME_MAX) {
			err = ENAMETOOLONG;
			break;
		}
		memcpy(comp, p, len);
		comp[len] = '\0';
		int cur = stack[depth];
		if (!strcmp(comp, "..")) {
			if (depth == 0) {
				err = EXDEV;
				break;
			}
			close(stack[depth--]);
			strcpy(comp, ".");
			cur = stack[depth];
		}
		if (!last && (!len || !strcmp(comp, "."))) {
			p = next;
			continue;
		}
		if (!len)
			strcpy(comp, ".");
		bool link = false;
		if (!last) {
			int fd = openat(cur, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
			struct stat st;
			if (fd < 0 || fstat(fd, &st) < 0) {
				err = errno;
				if (fd >= 0)
					close(fd);
				break;
			}
			if (S_ISLNK(st.st_mode)) {
				close(fd);
				link = true;
			} else if (!S_ISDIR(st.st_mode)) {
				close(fd);
				err = ENOTDIR;
				break;
			} else if (depth + 1 >= WALK_DEPTH) {
				close(fd);
				err = ENAMETOOLONG;
				break;
			} else {
				stack[++depth] = fd;
				p = next;
				continue;
			}
		} else {
			int fd = openat(cur, comp, (int)(flags | O_NOFOLLOW | O_CLOEXEC),
					(mode_t)mode);
			struct stat st, at;
			if (fd >= 0) {
				/* gVisor follows a trailing symlink despite O_NOFOLLOW
				 * when O_DIRECTORY is set (measured): the fd must be the
				 * very inode the name holds, and that no symlink. */
				if (fstat(fd, &st) < 0 ||
				    fstatat(cur, comp, &at, AT_SYMLINK_NOFOLLOW) < 0) {
					err = errno;
					close(fd);
					break;
				}
				bool same = st.st_dev == at.st_dev && st.st_ino == at.st_ino;
				bool is_link = S_ISLNK(at.st_mode);
				if (same && (!is_link || (flags & O_NOFOLLOW))) {
					result = fd;
					break;
				}
				close(fd);
				if (!is_link) { /* swapped under us: refuse */
					err = EAGAIN;
					break;
				}
				if (flags & O_NOFOLLOW) {
					err = ELOOP;
					break;
				}
				link = true;
			} else if ((flags & O_NOFOLLOW) ||
				   (errno != ELOOP && errno != ENOTDIR) ||
				   fstatat(cur, comp, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
				   !S_ISLNK(st.st_mode)) {
				err = errno;
				break;
			} else {
				link = true;
			}
		}
		/* A symlink: splice its target in front of the rest. */
		if (link) {
			if ((resolve & RESOLVE_NO_SYMLINKS) || ++follows > 40) {
				err = ELOOP;
				break;
			}
			char target[PATH_MAX];
			ssize_t n = readlinkat(cur, comp, target, sizeof target - 1);
			if (n < 0) {
				err = errno;
				break;
			}
			target[n] = '\0';
			if (target[0] == '/') {
				err = EXDEV;
				break;
			}
			char *joined = xmalloc((size_t)n + strlen(next) + 2);
			sprintf(joined, "%s%s%s", target, *next ? "/" : "", next);
			free(rest);
			rest = p = joined;
		}
	}
	while (depth > 0)
		close(stack[depth--]);
	free(stack);
	free(rest);
	if (result < 0)
		errno = err ? err : EIO;
	return result;
}

static bool g_no_openat2;

int open_beneath(int dirfd, const char *path, uint64_t flags,
			uint64_t mode, uint64_t resolve)
{
	if (g_no_openat2)
		return walk_beneath(dirfd, path, flags, mode, resolve);
	struct open_how how;
	memset(&how, 0, sizeof how);
	how.flags = flags | O_CLOEXEC;
	how.mode = mode;
	how.resolve = resolve;
	for (int tries = 0;; tries++) {
		long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof how);
		if (fd >= 0)
			return (int)fd;
		/* EAGAIN: the kernel saw a concurrent rename and could not
		 * prove `..` safety; retrying is the documented answer. */
		if ((errno == EINTR || errno == EAGAIN) && tries < 64)
			continue;
		if (errno == ENOSYS) {
			g_no_openat2 = true;
			return walk_beneath(dirfd, path, flags, mode, resolve);
		}
		return -1;
	}
}

void open_root(void)
{
	g_rootfd = open(g_root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (g_rootfd < 0)
		fail_errno(errno, "open root", g_root);
}

/* Normalise a root-relative path: drop empty and "." components, refuse
 * ".." and absolute paths outright (the server already normalises, so these
 * only show up in attacks or bugs).  Returns "." for the root itself. */
char *norm_path(const char *in)
{
	if (!*in)
		fail(1, "EINVAL", "empty path");
	if (in[0] == '/')
		fail(1, "ESCAPE", "absolute path not allowed: %s", in);
	char *out = xmalloc(strlen(in) + 2);
	size_t o = 0;
	const char *p = in;
	while (*p) {
		while (*p == '/')
			p++;
		if (!*p)
			break;
		size_t n = strcspn(p, "/");
		if (n == 2 && p[0] == '.' && p[1] == '.')
			fail(1, "ESCAPE", "'..' not allowed in path: %s", in);
		if (!(n == 1 && p[0] == '.')) {
			if (o)
				out[o++] = '/';
			memcpy(out + o, p, n);
			o += n;
		}
		p += n;
	}
	if (!o)
		out[o++] = '.';
	out[o] = '\0';
	return out;
}

static bool is_root(const char *norm)
{
	return !strcmp(norm, ".");
}

/* Split a normalised non-root path into a freshly allocated parent ("." if
 * none) and a pointer to its final component. */
static char *split_parent(const char *norm, const char **name)
{
	const char *slash = strrchr(norm, '/');
	if (!slash) {
		*name = norm;
		return xstrdup(".");
	}
	*name = slash + 1;
	char *parent = xmalloc((size_t)(slash - norm) + 1);
	memcpy(parent, norm, (size_t)(slash - norm));
	parent[slash - norm] = '\0';
	return parent;
}

/* Open a directory beneath the root; errors name `shown`, the path the
 * caller asked about, rather than the intermediate directory. */
static int open_dir_path(const char *norm, const char *shown)
{
	int fd = open_beneath(g_rootfd, norm, O_PATH | O_DIRECTORY, 0, RES_BENEATH);
	if (fd < 0)
		fail_errno(errno, "open", shown);
	return fd;
}

/* mkdir -p beneath the root.  Each prefix is re-resolved from the root fd,
 * so a component swapped for a symlink mid-walk still cannot lead outside. */
/* mkdir -p; with `note`, each directory made is noted for unmake_dirs(). */
static int mkdir_parents_noting(const char *norm, bool note)
{
	int cur = open_dir_path(".", ".");
	if (is_root(norm))
		return cur;
	char *prefix = xstrdup(norm);
	for (char *p = prefix;;) {
		char *slash = strchr(p, '/');
		if (slash)
			*slash = '\0';
		if (mkdirat(cur, p, 0755) == 0) {
			if (note && g_made < MADE_MAX) {
				int k = g_made;
				g_made_name[k] = xstrdup(p);
				g_made_fd[k] = dup(cur);
				if (g_made_fd[k] >= 0)
					g_made = k + 1;
			}
		} else if (errno != EEXIST) {
			fail_errno(errno, "mkdir", prefix);
		}
		close(cur);
		cur = open_dir_path(prefix, prefix);
		if (!slash)
			break;
		*slash = '/';
		p = slash + 1;
	}
	free(prefix);
	return cur;
}

/* ------------------------------------------------------------------ */
/* Stat records                                                        */
/* ------------------------------------------------------------------ */

static struct buf g_out;

static void out_flush(void)
{
	if (g_out.len && write_all(1, g_out.p, g_out.len) < 0)
		fail_errno(errno, "write", "stdout");
	g_out.len = 0;
}

const char *type_name(mode_t m)
{
	if (S_ISREG(m))
		return "file";
	if (S_ISDIR(m))
		return "dir";
	if (S_ISLNK(m))
		return "symlink";
	return "other";
}

/* Append one record; `dirfd`/`entry` locate the object for readlinkat. */
static void stat_record(struct buf *b, const char *rel, const char *name,
			int dirfd, const char *entry, const struct stat *st)
{
	buf_puts(b, "{\"path\":");
	buf_json_str(b, rel, strlen(rel));
	buf_puts(b, ",\"name\":");
	buf_json_str(b, name, strlen(name));
	buf_printf(b, ",\"type\":\"%s\",\"size\":%lld,\"mode\":%u,\"mtime_ns\":%lld",
		   type_name(st->st_mode), (long long)st->st_size,
		   (unsigned)(st->st_mode & 07777),
		   (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec);
	if (S_ISLNK(st->st_mode)) {
		/* Targets can exceed st_size (e.g. /proc-like fs), so grow. */
		size_t cap = 256;
		char *t = NULL;
		ssize_t n;
		for (;;) {
			t = xmalloc(cap);
			n = readlinkat(dirfd, entry, t, cap);
			if (n < 0 || (size_t)n < cap || cap >= (1u << 20))
				break;
			free(t);
			cap *= 2;
		}
		/* A link that vanished under us still gets a well-formed record. */
		buf_puts(b, ",\"target\":");
		buf_json_str(b, t, n < 0 ? 0 : (size_t)n);
		free(t);
	}
	buf_puts(b, "}\n");
}

/* Print the record of a normalised path without following its final
 * component; `dirfd` must be the open parent (ignored for the root). */
static void print_stat(const char *norm, int dirfd, const char *name)
{
	struct stat st;
	if (is_root(norm)) {
		if (fstatat(g_rootfd, "", &st, AT_EMPTY_PATH) < 0)
			fail_errno(errno, "stat", norm);
		stat_record(&g_out, ".", ".", g_rootfd, "", &st);
	} else {
		if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			fail_errno(errno, "stat", norm);
		stat_record(&g_out, norm, name, dirfd, name, &st);
	}
	out_flush();
}

/* ------------------------------------------------------------------ */
/* File subcommands                                                    */
/* ------------------------------------------------------------------ */

static int cmd_stat(int argc, char **argv)
{
	char *pos[1];
	parse_args(argc, argv, NULL, NULL, pos, 1);
	char *norm = norm_path(pos[0]);
	open_root();
	if (is_root(norm)) {
		print_stat(norm, -1, NULL);
		return 0;
	}
	const char *name;
	char *parent = split_parent(norm, &name);
	int pfd = open_dir_path(parent, norm);
	print_stat(norm, pfd, name);
	return 0;
}

static int cmd_read(int argc, char **argv)
{
	char *pos[2];
	parse_args(argc, argv, NULL, NULL, pos, 2);
	char *norm = norm_path(pos[0]);
	uint64_t max = parse_uint(pos[1], "MAXBYTES");
	open_root();

	/* Classify through an O_PATH fd first: opening a FIFO or device for
	 * reading could block or have side effects. */
	struct stat st, st2;
	int pfd = open_beneath(g_rootfd, norm, O_PATH, 0, RES_BENEATH);
	if (pfd < 0 || fstat(pfd, &st) < 0)
		fail_errno(errno, "open", norm);
	if (S_ISDIR(st.st_mode))
		fail(1, "EISDIR", "read %s: is a directory", norm);
	if (!S_ISREG(st.st_mode))
		fail(1, "EINVAL", "read %s: not a regular file", norm);
	if ((uint64_t)st.st_size > max)
		fail(1, "TOO_LARGE", "read %s: size %lld exceeds limit %llu", norm,
		     (long long)st.st_size, (unsigned long long)max);
	int fd = open_beneath(g_rootfd, norm, O_RDONLY | O_NOCTTY | O_NONBLOCK, 0,
			      RES_BENEATH);
	if (fd < 0 || fstat(fd, &st2) < 0)
		fail_errno(errno, "open", norm);
	if (st2.st_dev != st.st_dev || st2.st_ino != st.st_ino)
		fail(1, "EIO", "read %s: file was replaced while opening", norm);

	buf_printf(&g_out, "{\"size\":%lld,\"mode\":%u}\n", (long long)st2.st_size,
		   (unsigned)(st2.st_mode & 07777));
	out_flush();

	static char chunk[65536];
	uint64_t total = 0;
	for (;;) {
		/* Ask for one byte past the limit so growth is detected
		 * without ever buffering more than MAXBYTES + 1. */
		size_t want = sizeof chunk;
		if (max - total + 1 < want)
			want = (size_t)(max - total + 1);
		ssize_t n = read_retry(fd, chunk, want);
		if (n < 0)
			fail_errno(errno, "read", norm);
		if (n == 0)
			break;
		total += (uint64_t)n;
		if (total > max)
			fail(1, "TOO_LARGE", "read %s: file grew past limit %llu", norm,
			     (unsigned long long)max);
		if (write_all(1, chunk, (size_t)n) < 0)
			fail_errno(errno, "write", "stdout");
	}
	close(fd);
	return 0;
}

/* Async-signal-safe: unlinkat and _exit only. */
static void write_ended(int sig)
{
	if (g_tmp_name[0])
		unlinkat(g_tmp_dirfd, g_tmp_name, 0);
	unmake_dirs();
	_exit(128 + sig);
}

static int cmd_write(int argc, char **argv)
{
	g_drain_stdin = true;
	char *pos[3];
	bool parents = false;
	/* `--idle-ms N` first (parse_args knows one boolean flag). */
	for (int i = 0; i + 1 < argc; i++) {
		if (!strcmp(argv[i], "--"))
			break;
		if (strcmp(argv[i], "--idle-ms"))
			continue;
		uint64_t ms = parse_uint(argv[i + 1], "--idle-ms");
		g_idle_ms = ms > INT_MAX ? INT_MAX : (int)ms;
		memmove(argv + i, argv + i + 2, (size_t)(argc - i - 2) * sizeof *argv);
		argc -= 2;
		break;
	}
	parse_args(argc, argv, "--parents", &parents, pos, 3);
	char *norm = norm_path(pos[0]);
	const char *ms = pos[1];
	if (!*ms || strlen(ms) > 4 || strspn(ms, "01234567") != strlen(ms))
		usage("invalid MODE %s: expected octal like 644", ms);
	mode_t mode = (mode_t)strtoul(ms, NULL, 8) & 0777; /* no suid/sgid/sticky */
	uint64_t max = parse_uint(pos[2], "MAXBYTES");
	open_root();
	if (is_root(norm))
		fail(1, "EISDIR", "write %s: is a directory", norm);

	const char *name;
	char *parent = split_parent(norm, &name);
	/* SIGHUP/SIGTERM (a cancelled call) held until the handler that
	 * removes the temp file and the folders made on its way is in place,
	 * so no moment leaves either behind. */
	sigset_t ends, old;
	sigemptyset(&ends);
	sigaddset(&ends, SIGHUP);
	sigaddset(&ends, SIGTERM);
	sigprocmask(SIG_BLOCK, &ends, &old);
	int pfd = parents ? mkdir_parents_noting(parent, true) : open_dir_path(parent, norm);

	/* Cheap early refusal; the rename below re-checks atomically. */
	struct stat st;
	if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
		fail(1, "EISDIR", "write %s: is a directory", norm);

	/* The temp file lives in the target directory so the final rename is
	 * atomic and never crosses a filesystem. */
	int fd = -1;
	g_tmp_dirfd = pfd;
	for (int tries = 0; fd < 0; tries++) {
		uint32_t rnd;
		if (getrandom(&rnd, sizeof rnd, 0) != sizeof rnd)
			rnd = (uint32_t)clock() ^ (uint32_t)tries;
		snprintf(g_tmp_name, sizeof g_tmp_name, ".sbx-%ld-%08x.tmp",
			 (long)getpid(), rnd);
		fd = openat(pfd, g_tmp_name,
			    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0 && (errno != EEXIST || tries >= 100)) {
			g_tmp_name[0] = '\0';
			fail_errno(errno, "create temp file for", norm);
		}
	}

	/* Ended by the server (SIGHUP/SIGTERM: a cancelled call), the temp
	 * file goes with us. */
	struct sigaction sa = {.sa_handler = write_ended};
	sigaction(SIGHUP, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigprocmask(SIG_SETMASK, &old, NULL);

	static char chunk[65536];
	uint64_t total = 0;
	for (;;) {
		ssize_t n = read_stdin(chunk, sizeof chunk);
		if (n < 0 && errno == ETIMEDOUT)
			fail(1, "TIMEOUT", "write %s: no data on stdin for %d ms", norm, g_idle_ms);
		if (n < 0)
			fail_errno(errno, "read", "stdin");
		if (n == 0)
			break;
		total += (uint64_t)n;
		if (total > max)
			fail(1, "TOO_LARGE", "write %s: content exceeds limit %llu", norm,
			     (unsigned long long)max);
		if (write_all(fd, chunk, (size_t)n) < 0)
			fail_errno(errno, "write", norm);
	}
	/* fchmod is exact (unaffected by umask), unlike the create mode. */
	if (fchmod(fd, mode) < 0)
		fail_errno(errno, "chmod", norm);
	if (close(fd) < 0)
		fail_errno(errno, "write", norm);
	/* Renaming replaces a symlink itself, never writes through it. */
	if (renameat(pfd, g_tmp_name, pfd, name) < 0)
		fail_errno(errno, "write", norm);
	g_tmp_name[0] = '\0';
	g_made = 0; /* written: the folders on its way stay */
	print_stat(norm, pfd, name);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Read all names of a directory (sans . and ..), sorted bytewise.  `budget`
 * bounds the total across the whole walk so memory stays bounded too. */
static char **read_names(DIR *d, size_t *count, size_t *budget, const char *rel)
{
	char **names = NULL;
	size_t n = 0, cap = 0;
	for (;;) {
		errno = 0;
		struct dirent *e = readdir(d);
		if (!e) {
			if (errno)
				fail_errno(errno, "read directory", rel);
			break;
		}
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (budget) {
			if (*budget == 0) {
				out_flush();
				fail(1, "TOO_LARGE", "list: more than %d entries", LIST_MAX);
			}
			(*budget)--;
		}
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			char **nn = realloc(names, cap * sizeof *names);
			if (!nn)
				oom();
			names = nn;
		}
		names[n++] = xstrdup(e->d_name);
	}
	if (n)
		qsort(names, n, sizeof *names, cmp_str);
	*count = n;
	return names;
}

/*
 * Walking trees of any depth with a bounded number of descriptors: only the
 * directory being read is open.  Going back up opens ".." and checks it is
 * the very directory we came down from (device and inode), so a directory
 * moved away mid-walk ends the walk (EIO) instead of leading elsewhere.  A
 * 60,000-deep tree costs one descriptor, not 60,000.
 */
struct frame {
	char **names;
	size_t n, i;
	dev_t dev;
	ino_t ino;
	size_t rel_len;	/* list: length of this directory's path in `rel` */
	int retries;	/* remove: times the current entry was emptied again */
};

struct walk {
	struct frame *v;
	size_t depth, cap;
	int fd;		/* the directory of the top frame */
};

/* Make `fd` (an open directory, taken over) the new top frame. */
static int walk_push(struct walk *w, int fd, size_t *budget, const char *rel)
{
	struct stat st;
	int rfd = dup(fd);
	DIR *d = rfd < 0 ? NULL : fdopendir(rfd);
	if (fstat(fd, &st) < 0 || !d) {
		int e = errno;
		if (d)
			closedir(d);
		else if (rfd >= 0)
			close(rfd);
		close(fd);
		errno = e;
		return -1;
	}
	if (w->depth == w->cap) {
		w->cap = w->cap ? w->cap * 2 : 16;
		struct frame *nv = realloc(w->v, w->cap * sizeof *nv);
		if (!nv)
			oom();
		w->v = nv;
	}
	struct frame *f = &w->v[w->depth++];
	memset(f, 0, sizeof *f);
	f->names = read_names(d, &f->n, budget, rel);
	f->dev = st.st_dev;
	f->ino = st.st_ino;
	closedir(d);
	if (w->fd >= 0)
		close(w->fd);
	w->fd = fd;
	return 0;
}

/* Drop the top frame and reopen its parent through "..". */
static int walk_pop(struct walk *w)
{
	struct frame *f = &w->v[--w->depth];
	for (size_t k = 0; k < f->n; k++)
		free(f->names[k]);
	free(f->names);
	if (w->depth == 0) {
		close(w->fd);
		w->fd = -1;
		return 0;
	}
	struct frame *up = &w->v[w->depth - 1];
	struct stat st;
	int fd = openat(w->fd, "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0 || st.st_dev != up->dev || st.st_ino != up->ino) {
		close(fd);
		errno = ESTALE; /* moved away under us: reported as EIO */
		return -1;
	}
	close(w->fd);
	w->fd = fd;
	return 0;
}

static void walk_free(struct walk *w)
{
	while (w->depth > 0) {
		struct frame *f = &w->v[--w->depth];
		for (size_t k = 0; k < f->n; k++)
			free(f->names[k]);
		free(f->names);
	}
	free(w->v);
	if (w->fd >= 0)
		close(w->fd);
}

/* Depth-first pre-order listing of the directory `dfd` (taken over).
 * `prefix` is NULL at the root so that paths come out as bare names rather
 * than "./name".  A directory whose children's paths could reach PATH_MAX
 * is listed but not descended: no request could name what lies below. */
static void list_tree(int dfd, const char *prefix, uint64_t depth, size_t *budget)
{
	struct buf rel = {0};
	if (prefix)
		buf_puts(&rel, prefix);
	struct walk w = {.fd = -1};
	if (walk_push(&w, dfd, budget, prefix ? prefix : ".") < 0)
		fail_errno(errno, "list", prefix ? prefix : ".");
	w.v[0].rel_len = rel.len;
	while (w.depth > 0) {
		struct frame *f = &w.v[w.depth - 1];
		if (f->i == f->n) {
			if (walk_pop(&w) < 0)
				fail_errno(errno, "list", rel.len ? rel.p : ".");
			if (w.depth > 0) {
				rel.len = w.v[w.depth - 1].rel_len;
				if (rel.p)
					rel.p[rel.len] = '\0';
			}
			continue;
		}
		const char *name = f->names[f->i++];
		rel.len = f->rel_len;
		if (rel.p)
			rel.p[rel.len] = '\0';
		struct stat st;
		if (fstatat(w.fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			/* Vanished or unsearchable entries are skipped: a
			 * listing is a snapshot, not a transaction. */
			if (errno == ENOENT || errno == EACCES)
				continue;
			fail_errno(errno, "stat", name);
		}
		if (rel.len)
			buf_add(&rel, "/", 1);
		buf_puts(&rel, name);
		stat_record(&g_out, rel.p, name, w.fd, name, &st);
		if (g_out.len > 65536)
			out_flush();
		if (!S_ISDIR(st.st_mode) || w.depth >= depth || rel.len + 1 + NAME_MAX >= PATH_MAX)
			continue;
		/* NO_SYMLINKS: if the entry was swapped for a symlink since
		 * fstatat, we refuse rather than descend. */
		int cfd = open_beneath(w.fd, name, O_RDONLY | O_DIRECTORY, 0, RES_NOSYM);
		if (cfd < 0) {
			if (errno != ENOENT && errno != EACCES && errno != ENOTDIR &&
			    errno != ELOOP)
				fail_errno(errno, "list", rel.p);
			continue;
		}
		size_t len = rel.len;
		if (walk_push(&w, cfd, budget, rel.p) < 0) {
			if (errno != EACCES)
				fail_errno(errno, "list", rel.p);
			continue;
		}
		w.v[w.depth - 1].rel_len = len;
	}
	walk_free(&w);
	free(rel.p);
}

static int cmd_list(int argc, char **argv)
{
	char *pos[2];
	parse_args(argc, argv, NULL, NULL, pos, 2);
	char *norm = norm_path(pos[0]);
	uint64_t depth = parse_uint(pos[1], "DEPTH");
	if (depth == 0)
		depth = 1;
	open_root();
	int fd = open_beneath(g_rootfd, norm, O_RDONLY | O_DIRECTORY, 0, RES_BENEATH);
	if (fd < 0)
		fail_errno(errno, "list", norm);
	size_t budget = LIST_MAX;
	list_tree(fd, is_root(norm) ? NULL : norm, depth, &budget);
	out_flush();
	return 0;
}

#define REMOVE_RETRIES 8

/* chmod the entry `name` of `pfd` itself, never what it links to: opened
 * O_PATH|O_NOFOLLOW and changed through its /proc/self/fd link, so a
 * directory swapped for a symlink meanwhile is refused, not followed.  Only
 * directories and regular files.  Returns -1 with errno set on failure. */
static int chmod_entry(int pfd, const char *name, mode_t mode, bool only_dir)
{
	int fd = openat(pfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	struct stat st;
	int rc = fstat(fd, &st);
	if (rc == 0 && !S_ISDIR(st.st_mode) && (only_dir || !S_ISREG(st.st_mode))) {
		errno = only_dir ? ENOTDIR : EINVAL;
		rc = -1;
	}
	if (rc == 0 && (st.st_mode & 07777) != mode) {
		char link[64];
		snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
		rc = chmod(link, mode);
	}
	int e = errno;
	close(fd);
	errno = e;
	return rc;
}

/* A directory about to be emptied is opened up first: its owner may have made
 * it unwritable (555) or unsearchable (000), which would stop the removal
 * halfway.  Its mode no longer matters, it is going away. */
static void open_up(int pfd, const char *name)
{
	struct stat st;
	if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode) &&
	    (st.st_mode & 0700) != 0700)
		(void)chmod_entry(pfd, name, (st.st_mode & 07777) | 0700, true);
}

/* Remove everything inside the directory `name` of `pfd`, depth first, one
 * open directory at a time (see struct walk).  Something inside that keeps
 * creating entries makes a directory be emptied again, REMOVE_RETRIES times
 * at most, then ENOTEMPTY.  Returns -1 with errno set on failure. */
static int empty_dir(int pfd, const char *name)
{
	open_up(pfd, name);
	int dfd = open_beneath(pfd, name, O_RDONLY | O_DIRECTORY, 0, RES_NOSYM);
	if (dfd < 0)
		return -1;
	struct walk w = {.fd = -1};
	if (walk_push(&w, dfd, NULL, name) < 0)
		return -1;
	int rc = 0;
	while (w.depth > 0) {
		struct frame *f = &w.v[w.depth - 1];
		if (f->i == f->n) {
			if (w.depth == 1)
				break;
			if (walk_pop(&w) < 0) {
				rc = -1;
				break;
			}
			/* Back in the parent: its current entry is the
			 * directory just emptied. */
			f = &w.v[w.depth - 1];
			const char *child = f->names[f->i - 1];
			if (unlinkat(w.fd, child, AT_REMOVEDIR) == 0 || errno == ENOENT) {
				f->retries = 0;
				continue;
			}
			if ((errno == ENOTEMPTY || errno == EEXIST) &&
			    ++f->retries < REMOVE_RETRIES) {
				f->i--; /* refilled meanwhile: empty it again */
				continue;
			}
			if (errno == EEXIST)
				errno = ENOTEMPTY;
			rc = -1;
			break;
		}
		const char *entry = f->names[f->i++];
		struct stat st;
		if (fstatat(w.fd, entry, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno == ENOENT) /* a concurrent writer was first */
				continue;
			rc = -1;
			break;
		}
		if (!S_ISDIR(st.st_mode)) {
			if (unlinkat(w.fd, entry, 0) < 0 && errno != ENOENT) {
				rc = -1;
				break;
			}
			continue;
		}
		if (unlinkat(w.fd, entry, AT_REMOVEDIR) == 0 || errno == ENOENT)
			continue; /* was empty already */
		if (errno != ENOTEMPTY && errno != EEXIST) {
			rc = -1;
			break;
		}
		open_up(w.fd, entry);
		int cfd = open_beneath(w.fd, entry, O_RDONLY | O_DIRECTORY, 0, RES_NOSYM);
		if (cfd < 0 || walk_push(&w, cfd, NULL, entry) < 0) {
			if (errno == ENOENT)
				continue;
			rc = -1;
			break;
		}
	}
	int e = errno;
	walk_free(&w);
	errno = e;
	return rc;
}

static int remove_dir(int pfd, const char *name, bool recursive)
{
	/* Retry a few times in case something inside keeps creating files;
	 * give up with ENOTEMPTY rather than loop forever. */
	for (int attempt = 0;; attempt++) {
		if (unlinkat(pfd, name, AT_REMOVEDIR) == 0)
			return 0;
		if (errno == EEXIST) /* some filesystems say EEXIST */
			errno = ENOTEMPTY;
		if (errno != ENOTEMPTY || !recursive || attempt >= REMOVE_RETRIES)
			return -1;
		if (empty_dir(pfd, name) < 0)
			return -1;
	}
}

/*
 * A tree is taken out of its place in one rename before it is deleted: a
 * removal that fails midway (something inside keeps making entries, an entry
 * its user cannot remove) must not leave half a tree where the whole one was.
 * The tree goes to the root under the import staging prefix, where the
 * server's start-up tidy finds whatever a failed deletion leaves; the remove
 * has taken effect once the rename is done.  A directory moving to another
 * parent must be writable (its ".." changes): one without u+w gets it first
 * (it is going away), and its mode back if the rename is refused, so a
 * refused remove changes nothing.  An empty directory is simply removed.
 */
static int remove_tree(int pfd, const char *name, const struct stat *st)
{
	if (unlinkat(pfd, name, AT_REMOVEDIR) == 0)
		return 0;
	if (errno != ENOTEMPTY && errno != EEXIST)
		return -1;
	char aside[64];
	uint32_t rnd;
	if (getrandom(&rnd, sizeof rnd, 0) != sizeof rnd)
		rnd = (uint32_t)clock();
	snprintf(aside, sizeof aside, ".sbx-import-rm-%ld-%08x", (long)getpid(), rnd);
	bool chmodded = !(st->st_mode & S_IWUSR);
	if (chmodded && chmod_entry(pfd, name, (st->st_mode & 07777) | S_IWUSR, true) < 0)
		return -1;
	sigset_t ends;
	sigemptyset(&ends);
	sigaddset(&ends, SIGHUP);
	sigaddset(&ends, SIGTERM);
	sigaddset(&ends, SIGINT);
	sigaddset(&ends, SIGPIPE);
	sigprocmask(SIG_BLOCK, &ends, NULL); /* once aside, the deletion runs to its end */
	if (renameat(pfd, name, g_rootfd, aside) < 0) {
		int e = errno;
		if (chmodded)
			(void)chmod_entry(pfd, name, st->st_mode & 07777, true);
		errno = e;
		return -1;
	}
	(void)remove_dir(g_rootfd, aside, true);
	return 0;
}

static int cmd_remove(int argc, char **argv)
{
	char *pos[1];
	bool recursive = false;
	parse_args(argc, argv, "--recursive", &recursive, pos, 1);
	char *norm = norm_path(pos[0]);
	open_root();
	if (is_root(norm))
		fail(1, "EINVAL", "refusing to remove the root directory");
	const char *name;
	char *parent = split_parent(norm, &name);
	int pfd = open_dir_path(parent, norm);
	struct stat st;
	if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		fail_errno(errno, "remove", norm);
	int r;
	if (S_ISDIR(st.st_mode) && recursive)
		r = remove_tree(pfd, name, &st);
	else if (S_ISDIR(st.st_mode))
		r = remove_dir(pfd, name, false);
	else
		r = unlinkat(pfd, name, 0);
	if (r < 0)
		fail_errno(errno, "remove", norm);
	return 0;
}

/* `sbx chmod PATH MODE`: set the mode of a directory or regular file (never
 * through a symlink).  An import unpacks directories open (u+rwx) so that tar
 * can fill them, then gives each its own mode back with this, deepest first. */
static int cmd_chmod(int argc, char **argv)
{
	char *pos[2];
	parse_args(argc, argv, NULL, NULL, pos, 2);
	char *norm = norm_path(pos[0]);
	const char *ms = pos[1];
	if (!*ms || strlen(ms) > 4 || strspn(ms, "01234567") != strlen(ms))
		usage("invalid MODE %s: expected octal like 755", ms);
	mode_t mode = (mode_t)strtoul(ms, NULL, 8) & 0777; /* no suid/sgid/sticky */
	open_root();
	if (is_root(norm))
		fail(1, "EINVAL", "refusing to change the mode of the root directory");
	const char *name;
	char *parent = split_parent(norm, &name);
	int pfd = open_dir_path(parent, norm);
	if (chmod_entry(pfd, name, mode, false) < 0)
		fail_errno(errno, "chmod", norm);
	return 0;
}

static int cmd_mkdir(int argc, char **argv)
{
	char *pos[1];
	bool parents = false;
	parse_args(argc, argv, "--parents", &parents, pos, 1);
	char *norm = norm_path(pos[0]);
	open_root();
	if (is_root(norm)) {
		if (!parents)
			fail(1, "EEXIST", "mkdir %s: root already exists", norm);
		print_stat(norm, -1, NULL);
		return 0;
	}
	const char *name;
	char *parent = split_parent(norm, &name);
	/* A refused last step takes back the parents made for it. */
	int pfd = parents ? mkdir_parents_noting(parent, true) : open_dir_path(parent, norm);
	if (mkdirat(pfd, name, 0755) < 0) {
		int e = errno;
		struct stat st;
		if (!(e == EEXIST && parents &&
		      fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		      S_ISDIR(st.st_mode)))
			fail_errno(e, "mkdir", norm);
	}
	g_made = 0;
	print_stat(norm, pfd, name);
	return 0;
}

/*
 * renameat2(RENAME_NOREPLACE), or where the file system refuses the flag (EINVAL: gVisor's
 * gofer mounts, e.g. a disk workspace under runsc) the same without it: a non-directory by
 * link then unlink (the link fails EEXIST, as the flag would), a directory by a plain rename
 * after a look (one created in between is replaced only if empty: rename refuses others).
 */
static int rename_noreplace(int sfd, const char *sname, int dfd, const char *dname)
{
	if (syscall(SYS_renameat2, sfd, sname, dfd, dname, 1 /* RENAME_NOREPLACE */) == 0)
		return 0;
	if (errno != EINVAL)
		return -1;
	struct stat st;
	if (fstatat(sfd, sname, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -1;
	if (!S_ISDIR(st.st_mode)) {
		if (linkat(sfd, sname, dfd, dname, 0) < 0)
			return -1;
		if (unlinkat(sfd, sname, 0) < 0) {
			int e = errno;
			(void)unlinkat(dfd, dname, 0);
			errno = e;
			return -1;
		}
		return 0;
	}
	if (fstatat(dfd, dname, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		errno = EEXIST;
		return -1;
	}
	if (errno != ENOENT)
		return -1;
	return renameat(sfd, sname, dfd, dname);
}

/*
 * `sbx move SRC DST [--overwrite]`: rename within the root (Move, and the commit of a
 * streamed write).  Both parents are resolved beneath the root, so neither path leads
 * through a symlink out of it; SRC and DST themselves are names in those directories (a
 * symlink is moved as itself).  Without --overwrite an existing DST is EEXIST, atomically
 * (RENAME_NOREPLACE).
 */
static int cmd_move(int argc, char **argv)
{
	char *pos[2];
	bool overwrite = false;
	parse_args(argc, argv, "--overwrite", &overwrite, pos, 2);
	char *src = norm_path(pos[0]);
	char *dst = norm_path(pos[1]);
	open_root();
	if (is_root(src) || is_root(dst))
		fail(1, "EINVAL", "move %s to %s: the workspace root cannot move", src, dst);
	const char *sname, *dname;
	char *sparent = split_parent(src, &sname);
	char *dparent = split_parent(dst, &dname);
	int sfd = open_dir_path(sparent, src);
	int dfd = open_dir_path(dparent, dst);
	int moved = overwrite ? renameat(sfd, sname, dfd, dname)
			      : rename_noreplace(sfd, sname, dfd, dname);
	if (moved < 0)
		fail_errno(errno, "move", errno == EEXIST || errno == ENOTEMPTY ? dst : src);
	print_stat(dst, dfd, dname);
	return 0;
}

/*
 * `sbx merge STAGE DEST [--replace]`: the swap half of an archive import, all
 * or nothing.  The server unpacked a checked archive into the fresh directory
 * STAGE; this moves its entries into DEST with renameat, so nothing is ever
 * written through a symlink: a directory is merged into a real directory only
 * (O_NOFOLLOW), and anything else in the way (a file, a symlink) is replaced,
 * never followed.  --replace takes the place of everything in DEST (sparing
 * STAGE if it lives there).
 *
 * Nothing of DEST is deleted before all of STAGE is in place: an entry that
 * gives way (one a staged entry replaces, or with --replace every entry) is
 * first renamed into TRASH, the directory STAGE.old made beside STAGE, and
 * each rename is written down.  A failure at any step (a rename refused, a
 * directory moved meanwhile) renames everything back, last first, so a
 * refused merge leaves DEST as it was.  Only then are TRASH and STAGE removed;
 * what a failed removal leaves has the import staging prefix, which the
 * server removes at its next start.  Renames need no room: a full workspace
 * cannot stop the swap halfway, and SIGHUP/SIGTERM (a cancelled call) are held
 * until the end, so neither can a cancel.
 */
static int open_sub(int pfd, const char *name)
{
	return open_beneath(pfd, name, O_RDONLY | O_DIRECTORY, 0, RES_NOSYM);
}

/* One rename of the swap, as the undo needs it. */
struct undo {
	char *path;	/* relative to DEST, and to STAGE */
	long trash;	/* DEST's entry that gave way is TRASH/<trash>; -1: none */
	bool staged;	/* DEST/path now holds what was STAGE/path */
	bool chmodded;	/* the entry that gave way had `mode` (u+w added to move it) */
	mode_t mode;
};

static struct {
	struct undo *v;
	size_t n, cap;
	long next;
	int stage, dest, trash;	/* directories, open for the whole merge */
	int parent;		/* STAGE's parent, where TRASH is */
	const char *trash_name;
} g_swap = {.stage = -1, .dest = -1, .trash = -1, .parent = -1};

/* The parent of `path` beneath `base` (a new descriptor), and its last name. */
static int open_parent(int base, const char *path, const char **name)
{
	const char *slash = strrchr(path, '/');
	if (!slash) {
		*name = path;
		return dup(base);
	}
	*name = slash + 1;
	char *parent = xmalloc((size_t)(slash - path) + 1);
	memcpy(parent, path, (size_t)(slash - path));
	parent[slash - path] = '\0';
	int fd = open_sub(base, parent);
	free(parent);
	return fd;
}

static void trash_name(char *out, size_t n, long k)
{
	snprintf(out, n, "%ld", k);
}

/* Rename everything back, last first: staged entries to STAGE, the entries
 * that gave way from TRASH to their place, with their own modes. */
static void swap_undo(void)
{
	for (size_t k = g_swap.n; k-- > 0;) {
		struct undo *u = &g_swap.v[k];
		const char *name, *sname;
		int d = open_parent(g_swap.dest, u->path, &name);
		if (d < 0)
			continue;
		if (u->staged) {
			int s = open_parent(g_swap.stage, u->path, &sname);
			if (s >= 0) {
				(void)renameat(d, name, s, sname);
				close(s);
			}
		}
		if (u->trash >= 0) {
			char t[32];
			trash_name(t, sizeof t, u->trash);
			if (renameat(g_swap.trash, t, d, name) == 0 && u->chmodded)
				(void)chmod_entry(d, name, u->mode, true);
		}
		close(d);
	}
	g_swap.n = 0;
	(void)unlinkat(g_swap.parent, g_swap.trash_name, AT_REMOVEDIR); /* empty again */
}

static struct undo *swap_note(const char *path)
{
	if (g_swap.n == g_swap.cap) {
		g_swap.cap = g_swap.cap ? g_swap.cap * 2 : 64;
		struct undo *nv = realloc(g_swap.v, g_swap.cap * sizeof *nv);
		if (!nv)
			oom();
		g_swap.v = nv;
	}
	struct undo *u = &g_swap.v[g_swap.n++];
	*u = (struct undo){.path = xstrdup(path), .trash = -1};
	return u;
}

/* DEST's entry `name` of `dfd` (DEST/path) gives way: renamed into TRASH.  A
 * directory moving to another parent must be writable (its ".." changes), so
 * one without u+w gets it for the move, and back on an undo. */
static void set_aside(int dfd, const char *name, const char *path)
{
	struct stat st;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		fail_errno(errno, "merge", path);
	bool chmodded = false;
	if (S_ISDIR(st.st_mode) && !(st.st_mode & S_IWUSR)) {
		if (chmod_entry(dfd, name, (st.st_mode & 07777) | S_IWUSR, true) < 0)
			fail_errno(errno, "merge", path);
		chmodded = true;
	}
	char t[32];
	long k = g_swap.next++;
	trash_name(t, sizeof t, k);
	if (renameat(dfd, name, g_swap.trash, t) < 0) {
		int e = errno;
		if (chmodded)
			(void)chmod_entry(dfd, name, st.st_mode & 07777, true);
		fail_errno(e, "merge", path);
	}
	struct undo *u = swap_note(path);
	u->trash = k;
	u->chmodded = chmodded;
	u->mode = st.st_mode & 07777;
}

/* STAGE/path (`name` of `sfd`) into its place in DEST (`dfd`), which is free. */
static void bring_in(int sfd, int dfd, const char *name, const char *path)
{
	if (rename_noreplace(sfd, name, dfd, name) < 0)
		fail_errno(errno, "merge", path);
	struct undo *last = g_swap.n ? &g_swap.v[g_swap.n - 1] : NULL;
	if (last && !last->staged && last->trash >= 0 && !strcmp(last->path, path))
		last->staged = true;
	else
		swap_note(path)->staged = true;
}

/* Merge the directory `src` into `dst` (both taken over), with a bounded
 * number of descriptors whatever the depth (see struct walk): the walk goes
 * down both trees in step, and back up through ".." checked on both. */
/* A dry run first: a destination directory the merge may not write (a 555
 * folder of the sandbox user's) is refused before anything moved. */
static bool g_merge_dry;

static void merge_tree(int src, int dst)
{
	struct walk w = {.fd = -1};
	struct buf rel = {0};
	buf_puts(&rel, "");
	/* ids[k]: the destination directory that goes with the walk's frame k */
	struct stat *ids = NULL;
	size_t ncap = 0;
	int dfd = dst;
	if (walk_push(&w, src, NULL, ".") < 0)
		fail_errno(errno, "merge", ".");
	ncap = 16;
	ids = xmalloc(ncap * sizeof *ids);
	if (fstat(dfd, &ids[0]) < 0)
		fail_errno(errno, "merge", ".");
	for (;;) {
		struct frame *f = &w.v[w.depth - 1];
		if (f->i == f->n) {
			if (w.depth == 1)
				break;
			if (walk_pop(&w) < 0)
				fail_errno(errno, "merge", rel.p);
			struct stat up_st;
			int up = openat(dfd, "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (up < 0 || fstat(up, &up_st) < 0)
				fail_errno(errno, "merge", rel.p);
			if (up_st.st_dev != ids[w.depth - 1].st_dev ||
			    up_st.st_ino != ids[w.depth - 1].st_ino)
				fail(1, "EIO", "merge %s: directory moved during the merge", rel.p);
			close(dfd);
			dfd = up;
			rel.len = w.v[w.depth - 1].rel_len;
			rel.p[rel.len] = '\0';
			continue;
		}
		const char *name = f->names[f->i++];
		rel.len = f->rel_len;
		rel.p[rel.len] = '\0';
		if (rel.len)
			buf_add(&rel, "/", 1);
		buf_puts(&rel, name);
		const char *sub = rel.p;
		struct stat ss, ds;
		if (fstatat(w.fd, name, &ss, AT_SYMLINK_NOFOLLOW) < 0)
			fail_errno(errno, "merge", sub);
		bool exists = fstatat(dfd, name, &ds, AT_SYMLINK_NOFOLLOW) == 0;
		if (!exists && errno != ENOENT)
			fail_errno(errno, "merge", sub);
		if (S_ISDIR(ss.st_mode) && exists && S_ISDIR(ds.st_mode)) {
			struct stat dst_st;
			int s2 = open_sub(w.fd, name);
			int d2 = s2 < 0 ? -1 : open_sub(dfd, name);
			if (s2 < 0 || d2 < 0 || fstat(d2, &dst_st) < 0)
				fail_errno(errno, "merge", sub);
			size_t len = rel.len;
			if (walk_push(&w, s2, NULL, sub) < 0)
				fail_errno(errno, "merge", sub);
			w.v[w.depth - 1].rel_len = len;
			if (w.depth > ncap) {
				ncap = w.depth * 2;
				struct stat *n2 = realloc(ids, ncap * sizeof *ids);
				if (!n2)
					oom();
				ids = n2;
			}
			ids[w.depth - 1] = dst_st;
			close(dfd);
			dfd = d2;
			continue;
		}
		if (g_merge_dry) {
			/* Only look: every directory that would change must let us. */
			if (faccessat(dfd, ".", W_OK | X_OK, AT_EACCESS) < 0)
				fail_errno(errno, "merge", sub);
			continue;
		}
		if (exists)
			set_aside(dfd, name, sub);
		bring_in(w.fd, dfd, name, sub);
	}
	walk_free(&w);
	close(dfd);
	free(ids);
	free(rel.p);
}

static bool same_entry(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* --replace: every entry of DEST but STAGE, TRASH and mount points into TRASH,
 * then every entry of STAGE into DEST.  A mount point (an entry on another file
 * system than DEST: a volume the sandbox mounts below /workspace) stays where
 * it is with its content: the kernel would refuse to rename it, and it is no
 * part of the workspace a snapshot restores. */
static void replace_all(int sfd, int dfd, const struct stat *stage_st,
			const struct stat *trash_st)
{
	struct stat dest_st;
	if (fstat(dfd, &dest_st) < 0)
		fail_errno(errno, "replace", ".");
	int fd = dup(dfd);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	if (!d)
		fail_errno(errno, "replace", ".");
	size_t n;
	char **names = read_names(d, &n, NULL, ".");
	closedir(d);
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		if (fstatat(dfd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno == ENOENT)
				continue;
			fail_errno(errno, "replace", names[i]);
		}
		if (st.st_dev != dest_st.st_dev)
			continue; /* a mount point */
		if (!same_entry(&st, stage_st) && !same_entry(&st, trash_st))
			set_aside(dfd, names[i], names[i]);
	}
	fd = dup(sfd);
	d = fd < 0 ? NULL : fdopendir(fd);
	if (!d)
		fail_errno(errno, "replace", ".");
	size_t m;
	char **staged = read_names(d, &m, NULL, ".");
	closedir(d);
	for (size_t i = 0; i < m; i++)
		bring_in(sfd, dfd, staged[i], staged[i]);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	for (size_t i = 0; i < m; i++)
		free(staged[i]);
	free(names);
	free(staged);
}

/* Best effort once the swap is done: a leftover is removed at the server's next start. */
static void remove_quietly(int pfd, const char *name)
{
	(void)remove_dir(pfd, name, true);
}

static int cmd_merge(int argc, char **argv)
{
	char *pos[2];
	bool replace = false;
	parse_args(argc, argv, "--replace", &replace, pos, 2);
	char *stage = norm_path(pos[0]);
	char *dest = norm_path(pos[1]);
	open_root();
	if (is_root(stage))
		fail(1, "EINVAL", "merge: the stage cannot be the root");
	int sfd = open_beneath(g_rootfd, stage, O_RDONLY | O_DIRECTORY, 0, RES_NOSYM);
	if (sfd < 0)
		fail_errno(errno, "open stage", stage);
	int dfd = open_beneath(g_rootfd, dest, O_RDONLY | O_DIRECTORY, 0, RES_BENEATH);
	if (dfd < 0)
		fail_errno(errno, "open", dest);
	struct stat st, tst;
	if (fstat(sfd, &st) < 0)
		fail_errno(errno, "stat stage", stage);
	if (replace) {
		if (faccessat(dfd, ".", W_OK | X_OK, AT_EACCESS) < 0)
			fail_errno(errno, "merge", dest);
	} else {
		/* Fresh descriptors: the walk reads and closes what it is given. */
		int s2 = openat(sfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		int d2 = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (s2 < 0 || d2 < 0)
			fail_errno(errno, "merge", dest);
		g_merge_dry = true;
		merge_tree(s2, d2);
		g_merge_dry = false;
	}
	const char *name;
	char *parent = split_parent(stage, &name);
	int pfd = open_beneath(g_rootfd, parent, O_RDONLY | O_DIRECTORY, 0, RES_BENEATH);
	if (pfd < 0)
		fail_errno(errno, "open", parent);
	char *trash = xmalloc(strlen(name) + 5);
	snprintf(trash, strlen(name) + 5, "%s.old", name);
	if (mkdirat(pfd, trash, 0700) < 0)
		fail_errno(errno, "make the trash of", stage);
	g_swap.trash = open_sub(pfd, trash);
	if (g_swap.trash < 0 || fstat(g_swap.trash, &tst) < 0) {
		int e = errno;
		(void)unlinkat(pfd, trash, AT_REMOVEDIR);
		fail_errno(e, "open the trash of", stage);
	}
	sigset_t ends;
	sigemptyset(&ends);
	sigaddset(&ends, SIGHUP);
	sigaddset(&ends, SIGTERM);
	sigaddset(&ends, SIGINT);
	sigaddset(&ends, SIGPIPE);
	sigprocmask(SIG_BLOCK, &ends, NULL);
	g_swap.stage = dup(sfd);
	g_swap.dest = dup(dfd);
	g_swap.parent = pfd;
	g_swap.trash_name = trash;
	if (g_swap.stage < 0 || g_swap.dest < 0)
		fail_errno(errno, "merge", dest);
	g_undo = swap_undo;
	if (replace)
		replace_all(sfd, dfd, &st, &tst);
	else
		merge_tree(sfd, dfd);
	g_undo = NULL; /* in place: from here on nothing is taken back */
	remove_quietly(pfd, trash);
	remove_quietly(pfd, name);
	return 0;
}

/* ------------------------------------------------------------------ */
/* /proc scanning                                                      */
/* ------------------------------------------------------------------ */

/* Read a small /proc file into buf (NUL-terminated); returns length. */
static ssize_t read_small(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t len = 0;
	while (len < cap - 1) {
		ssize_t n = read_retry(fd, buf + len, cap - 1 - len);
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	return (ssize_t)len;
}

static pid_t read_ppid_state(pid_t pid, char *state_out)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
	if (read_small(path, buf, sizeof buf) <= 0)
		return -1;
	/* comm may contain spaces and ')' itself; fields resume after the
	 * last ')' and comm is far shorter than our buffer. */
	char *p = strrchr(buf, ')');
	char state;
	long ppid;
	if (!p || sscanf(p + 1, " %c %ld", &state, &ppid) != 2)
		return -1;
	if (state_out)
		*state_out = state;
	return (pid_t)ppid;
}

static pid_t read_ppid(pid_t pid)
{
	return read_ppid_state(pid, NULL);
}

struct proc {
	pid_t pid, ppid;
};

static int cmp_proc(const void *a, const void *b)
{
	pid_t x = ((const struct proc *)a)->pid, y = ((const struct proc *)b)->pid;
	return (x > y) - (x < y);
}

/* Snapshot of all visible processes as (pid, ppid), sorted by pid. */
static struct proc *scan_procs(size_t *count)
{
	struct proc *v = NULL;
	size_t n = 0, cap = 0;
	DIR *d = opendir("/proc");
	if (!d) {
		*count = 0;
		return NULL;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 0)
			continue;
		pid_t ppid = read_ppid((pid_t)pid);
		if (ppid < 0)
			continue; /* exited meanwhile */
		if (n == cap) {
			cap = cap ? cap * 2 : 256;
			struct proc *nv = realloc(v, cap * sizeof *v);
			if (!nv)
				oom();
			v = nv;
		}
		v[n].pid = (pid_t)pid;
		v[n].ppid = ppid;
		n++;
	}
	closedir(d);
	if (n)
		qsort(v, n, sizeof *v, cmp_proc);
	*count = n;
	return v;
}

/* Extend `mark` to every descendant of a marked process (or of `root`, if
 * > 0).  Fixpoint over the parent relation; passes <= tree depth. */
static void mark_descendants(const struct proc *v, size_t n, bool *mark, pid_t root)
{
	for (bool changed = true; changed;) {
		changed = false;
		for (size_t i = 0; i < n; i++) {
			if (mark[i] || v[i].pid == root)
				continue;
			bool desc = root > 0 && v[i].ppid == root;
			if (!desc) {
				struct proc key = {.pid = v[i].ppid};
				struct proc *par = bsearch(&key, v, n, sizeof *v, cmp_proc);
				desc = par && mark[par - v];
			}
			if (desc) {
				mark[i] = true;
				changed = true;
			}
		}
	}
}

/* SIGKILL every descendant of `self`; returns how many were signalled. */
static size_t kill_descendants(pid_t self)
{
	size_t n;
	struct proc *v = scan_procs(&n);
	bool *mark = xmalloc(n * sizeof *mark);
	memset(mark, 0, n * sizeof *mark);
	mark_descendants(v, n, mark, self);
	size_t killed = 0;
	for (size_t i = 0; i < n; i++) {
		if (mark[i]) {
			kill(v[i].pid, SIGKILL);
			killed++;
		}
	}
	free(mark);
	free(v);
	return killed;
}

static uid_t proc_uid(pid_t pid, bool *ok);

/* Is PID 1 of our PID namespace sandboxd's keeper (`sbx idle`, itself or
 * under docker-init)?  Only there does a parent of 1 mean "orphan": on any
 * other machine (the unit tests' host) PID 1 adopts daemons by design. */
static bool in_sandbox(void)
{
	char buf[4096];
	ssize_t len = read_small("/proc/1/cmdline", buf, sizeof buf);
	const char *args[64];
	size_t n = 0;
	for (size_t off = 0; len > 0 && off < (size_t)len && n < 64;) {
		args[n++] = buf + off;
		off += strlen(buf + off) + 1;
	}
	if (n < 2 || strcmp(args[n - 1], "idle"))
		return false;
	const char *base = strrchr(args[n - 2], '/');
	return !strcmp(base ? base + 1 : args[n - 2], "sbx");
}

/*
 * Kill the orphans of dead supervisors: processes of our uid whose parent is
 * PID 1, with everything below them, except `sbx` processes (the keeper, if
 * it shares our uid, and a monitor busy cleaning up after its supervisor).
 * Inside a sandbox every command runs under a living supervisor, a subreaper,
 * so its orphans never reach PID 1 while that supervisor lives; one that did
 * escaped a supervisor killed together with its monitor, or survived a
 * `kill -9 -1` it sent itself.  Repeated until a round finds none, so an
 * orphan that forks meanwhile loses.  Returns how many were killed.
 */
static size_t reap_orphans(void)
{
	if (getuid() == 0 || !in_sandbox())
		return 0;
	uid_t me = getuid();
	struct stat self_exe;
	if (stat("/proc/self/exe", &self_exe) < 0)
		memset(&self_exe, 0, sizeof self_exe);
	size_t total = 0;
	for (int round = 0; round < 1000; round++) {
		size_t n, killed = 0;
		struct proc *v = scan_procs(&n);
		bool *mark = xmalloc(n * sizeof *mark);
		memset(mark, 0, n * sizeof *mark);
		for (size_t i = 0; i < n; i++) {
			bool ok;
			char path[64];
			struct stat st;
			if (v[i].ppid != 1 || v[i].pid == 1 || proc_uid(v[i].pid, &ok) != me || !ok)
				continue;
			snprintf(path, sizeof path, "/proc/%ld/exe", (long)v[i].pid);
			if (stat(path, &st) == 0 && st.st_dev == self_exe.st_dev &&
			    st.st_ino == self_exe.st_ino)
				continue;
			mark[i] = true;
		}
		mark_descendants(v, n, mark, 0);
		for (size_t i = 0; i < n; i++) {
			char state = '?';
			if (mark[i] && read_ppid_state(v[i].pid, &state) >= 0 && state != 'Z') {
				kill(v[i].pid, SIGKILL);
				killed++;
			}
		}
		free(mark);
		free(v);
		if (!killed)
			break;
		total += killed;
		struct timespec ts = {0, 1000000}; /* 1 ms: let init reap them */
		nanosleep(&ts, NULL);
	}
	return total;
}

/*
 * Kill and reap the whole tree below us.  Termination is decided by
 * waitpid returning ECHILD, which is exact: as a child subreaper, every
 * living descendant is either our child or has a living descendant parent,
 * so "no children" implies "no descendants".  The /proc scan only makes it
 * fast (grandchildren die now instead of after cascading reparenting).  A
 * process signalled with SIGKILL cannot fork any more, so fork bombs lose
 * the race after a few rounds.
 */
/*
 * gVisor (Debian 12's runsc) refuses PR_SET_CHILD_SUBREAPER with EINVAL.  There
 * the tree is still killed by process group and by the /proc scan, and orphans
 * that escaped to PID 1 (double fork + setsid) are reaped after every kill
 * instead of waiting for the next command.
 */
static bool g_subreaper = true;

static int become_subreaper(void)
{
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) == 0)
		return 0;
	if (errno != EINVAL)
		return -1;
	g_subreaper = false;
	return 0;
}

static void kill_tree_once(pid_t pgid);

static void kill_tree(pid_t pgid)
{
	kill_tree_once(pgid);
	if (!g_subreaper)
		reap_orphans();
}

static void kill_tree_once(pid_t pgid)
{
	pid_t self = getpid();
	for (int iter = 0; iter < 5000; iter++) {
		if (pgid > 0)
			kill(-pgid, SIGKILL);
		kill_descendants(self);
		for (;;) {
			pid_t w = waitpid(-1, NULL, WNOHANG);
			if (w > 0)
				continue;
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0 && errno == ECHILD)
				return;
			break;
		}
		struct timespec ts = {0, 1000000}; /* 1 ms */
		nanosleep(&ts, NULL);
	}
}

/* ------------------------------------------------------------------ */
/* run                                                                 */
/* ------------------------------------------------------------------ */

enum stage { ST_SETUP = 1, ST_CWD, ST_ESCAPE, ST_EXEC };

struct report {
	int stage;
	int err;
};

__attribute__((noreturn))
static void child_report(int fd, int stage, int err)
{
	struct report r = {stage, err};
	(void)write_all(fd, &r, sizeof r);
	_exit(126);
}

static bool path_within(const char *path, const char *root)
{
	size_t n = strlen(root);
	if (n == 1 && root[0] == '/')
		return true;
	return !strncmp(path, root, n) && (path[n] == '\0' || path[n] == '/');
}

/*
 * The directories a bare command name is looked up in, whatever PATH the
 * caller set: the server's allowlist names a program, and that program must
 * be the image's, never a file of the same name the caller put in a
 * directory of its own (the server allows an absolute argv[0] only in these
 * directories too).  Same list as the sessions' default PATH.
 */
#define FIXED_PATH "/usr/local/bin:/usr/bin:/bin"

/* Variables the dynamic loader and libc read in every program: with them an
 * allowlisted program would load the caller's library, gconv module or
 * locale.  Same list as validation.py's LOADER_ENV_KEYS, plus every LD_*. */
static bool loader_var(const char *entry)
{
	static const char *const names[] = {
		"GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES",
		"LOCALDOMAIN", "LOCPATH", "MALLOC_TRACE", "NIS_PATH", "NLSPATH",
		"RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR",
	};
	if (!strncmp(entry, "LD_", 3))
		return true;
	size_t n = strcspn(entry, "=");
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (strlen(names[i]) == n && !strncmp(entry, names[i], n))
			return true;
	return false;
}

/* The command's environment: ours minus the loader variables, or with
 * --clean-env (the server's own runs, e.g. tar) only fixed values, so no
 * caller variable reaches them. */
static char **command_env(bool clean)
{
	extern char **environ;
	size_t n = 0;
	for (char **e = environ; *e; e++)
		n++;
	char **out = xmalloc((n + 4) * sizeof *out);
	size_t o = 0;
	if (clean) {
		static char home[PATH_MAX + 8];
		snprintf(home, sizeof home, "HOME=%s", g_root);
		out[o++] = "PATH=" FIXED_PATH;
		out[o++] = "LANG=C.UTF-8";
		out[o++] = home;
	} else {
		for (char **e = environ; *e; e++)
			if (!loader_var(*e))
				out[o++] = *e;
	}
	out[o] = NULL;
	return out;
}

/* execve argv[0] as given when it holds a '/', else looked up on FIXED_PATH
 * (never the environment's PATH).  Returns only on failure, with the errno
 * execvp would report: EACCES if some candidate was not executable. */
static int exec_command(char **cmd, char **envp)
{
	if (strchr(cmd[0], '/')) {
		execve(cmd[0], cmd, envp);
		return errno;
	}
	if (!cmd[0][0])
		return ENOENT;
	bool denied = false;
	for (const char *dir = FIXED_PATH; *dir;) {
		size_t n = strcspn(dir, ":");
		char path[PATH_MAX];
		if (n + 1 + strlen(cmd[0]) < sizeof path) {
			snprintf(path, sizeof path, "%.*s/%s", (int)n, dir, cmd[0]);
			execve(path, cmd, envp);
			if (errno == EACCES)
				denied = true;
			else if (errno != ENOENT && errno != ENOTDIR)
				return errno;
		}
		dir += n;
		if (*dir == ':')
			dir++;
	}
	return denied ? EACCES : ENOENT;
}

__attribute__((noreturn))
static void child_main(int repfd, pid_t parent, const char *cwd,
		       const char *realroot, const struct winsize *tty, char **cmd,
		       char **envp)
{
	/* If the monitor is SIGKILLed, the direct child goes with it; the
	 * rest of the tree is then the supervisor's (see monitor_main). */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
		child_report(repfd, ST_SETUP, errno);
	if (getppid() != parent)
		_exit(EXIT_KILLED);
	if (tty) {
		/* On a terminal (docker exec -t makes us its session leader):
		 * own process group, made the foreground one, so ^C and
		 * SIGWINCH from the terminal reach the command.  A new session
		 * would lose the terminal.  SIGTTOU is ignored for the
		 * tcsetpgrp of a background group; reset below. */
		signal(SIGTTOU, SIG_IGN);
		if (setpgid(0, 0) < 0 || tcsetpgrp(0, getpid()) < 0)
			child_report(repfd, ST_SETUP, errno);
		/* The engine can only resize a started exec: set the first
		 * size here, before the command can ask for it. */
		if (ioctl(0, TIOCSWINSZ, tty) < 0)
			child_report(repfd, ST_SETUP, errno);
	} else if (setsid() < 0) {
		/* Own session + process group: lets us signal the job as a
		 * unit and detaches it from any controlling terminal. */
		child_report(repfd, ST_SETUP, errno);
	}
	/* Relative --cwd is taken relative to the root. */
	if (fchdir(g_rootfd) < 0)
		child_report(repfd, ST_CWD, errno);
	if (cwd && chdir(cwd) < 0)
		child_report(repfd, ST_CWD, errno);
	char here[PATH_MAX];
	if (!getcwd(here, sizeof here))
		child_report(repfd, ST_CWD, errno);
	if (!path_within(here, realroot))
		child_report(repfd, ST_ESCAPE, 0);
	/* The command must not inherit our blocked mask or dispositions. */
	for (int s = 1; s < NSIG; s++) {
		if (s == SIGKILL || s == SIGSTOP)
			continue;
		/* Raw syscall: glibc refuses its reserved real-time signals (32,
		 * 33), yet an ignored one is inherited across exec all the same.
		 * An all-zero kernel sigaction is SIG_DFL, no flags, empty mask,
		 * whatever the architecture's field order. */
		unsigned long ksa[4] = {0};
		syscall(SYS_rt_sigaction, s, ksa, NULL, 8);
	}
	sigset_t none;
	sigemptyset(&none);
	if (sigprocmask(SIG_SETMASK, &none, NULL) < 0)
		child_report(repfd, ST_SETUP, errno);
	child_report(repfd, ST_EXEC, exec_command(cmd, envp));
}

/*
 * The monitor: the command's parent, between it and the supervisor.  A
 * command can always signal its parent (same uid, `kill -KILL $PPID`), so the
 * parent must not be the process whose death would free the tree:
 *
 *   - the monitor is killed: the command dies with it (PDEATHSIG), its
 *     orphans go to the supervisor (a subreaper), which sees its child end
 *     without a status report and kills the whole tree;
 *   - the supervisor is killed: the monitor, a subreaper itself and so the
 *     holder of every orphan below it, gets SIGHUP (PDEATHSIG) and kills the
 *     tree before it exits.
 *
 * Only killing both in the same instant (or `kill -9 -1`, which spares the
 * caller) leaves the caller's own process behind; see helper/README.md.
 * When the command ends normally the monitor kills what it left, reports the
 * wait status on `infofd` and exits.
 */
__attribute__((noreturn))
static void monitor_main(int repfd, int infofd, pid_t parent, const char *cwd,
			 const char *realroot, const struct winsize *tty, char **cmd,
			 char **envp)
{
	if (become_subreaper() < 0 || prctl(PR_SET_PDEATHSIG, SIGHUP) < 0)
		child_report(repfd, ST_SETUP, errno);
	if (getppid() != parent)
		_exit(EXIT_KILLED);
	pid_t self = getpid();
	pid_t child = fork();
	if (child < 0)
		child_report(repfd, ST_SETUP, errno);
	if (child == 0) {
		close(infofd);
		child_main(repfd, self, cwd, realroot, tty, cmd, envp);
	}
	close(repfd);
	if (write_all(infofd, &child, sizeof child) < 0) {
		kill_tree(child);
		_exit(EXIT_KILLED);
	}
	/* The monitor holds none of the command's stdio: once the supervisor
	 * has gone, nothing of ours keeps the exec's streams open. */
	int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	for (int fd = 0; fd < 3; fd++) {
		if (devnull >= 0)
			dup2(devnull, fd);
		else
			close(fd);
	}
	/* Every signal the supervisor blocked is still blocked here. */
	sigset_t set;
	sigemptyset(&set);
	int sigs[] = {SIGCHLD, SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP, SIGQUIT};
	for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++)
		sigaddset(&set, sigs[k]);
	for (;;) {
		siginfo_t si;
		int sig = sigwaitinfo(&set, &si);
		if (sig < 0)
			continue;
		if (sig != SIGCHLD) {
			/* The supervisor died (SIGHUP), or someone signals us:
			 * either way the command's tree ends now. */
			kill_tree(child);
			_exit(EXIT_KILLED);
		}
		int status = 0;
		pid_t w;
		while ((w = waitpid(-1, &status, WNOHANG)) != 0) {
			if (w < 0) {
				if (errno == EINTR)
					continue;
				break;
			}
			if (w == child) {
				kill_tree(child);
				(void)write_all(infofd, &status, sizeof status);
				_exit(0);
			}
		}
	}
}

static bool forwardable(int sig)
{
	static const int ok[] = {SIGHUP, SIGINT, SIGQUIT, SIGKILL, SIGTERM, SIGUSR1,
				 SIGUSR2, SIGSTOP, SIGCONT, SIGWINCH};
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
		if (ok[i] == sig)
			return true;
	return false;
}

/*
 * The engine keeps an exec's output open until its stdin has been delivered
 * (the shim holds the pipe), so a command that exits without reading its
 * input would look, to the server, like one that never ends.  Once the tree
 * is gone, read what is still coming and discard it: until EOF, or until
 * stdin has been quiet for a moment (an interactive caller may keep it open).
 */
static void discard_pending_stdin(void)
{
	if (isatty(STDIN_FILENO))
		return;
	char buf[65536];
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
		int r = poll(&p, 1, 50);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return; /* quiet, or not pollable */
		ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
		if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
			return;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - start.tv_sec >= 2)
			return; /* bounded: the server caps what it sends anyway */
	}
}

/*
 * The status record: an exit status of 128+N is either a command that died
 * of signal N or one that called exit(128+N); the exec's exit code cannot
 * tell them apart.  When the command dies of a signal, the supervisor of a
 * `run --id ID` leaves "signal N" in STATUS_DIR/ID, which `sbx status ID`
 * prints (and removes).  No record: the command exited normally.  The
 * record is written by the sandbox user, so a command can only ever claim a
 * signal for itself, which it could as well have raised.
 */
#define STATUS_DIR "/tmp"
#define STATUS_PREFIX ".sbx-status-"
static const char *g_run_id;

static bool valid_run_id(const char *id)
{
	size_t n = strlen(id);
	return n > 0 && n <= 64 &&
	       strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") == n;
}

static void write_status(int sig)
{
	if (!g_run_id || !valid_run_id(g_run_id))
		return;
	char path[128], text[32];
	snprintf(path, sizeof path, STATUS_DIR "/" STATUS_PREFIX "%s", g_run_id);
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return; /* best effort: the server then reports the exit code only */
	int n = snprintf(text, sizeof text, "signal %d\n", sig);
	(void)write_all(fd, text, (size_t)n);
	close(fd);
}

/* `sbx status ID`: "signal N" when the command run with --id ID died of
 * signal N, "exit" otherwise; the record is removed. */
static int cmd_status(int argc, char **argv)
{
	char *pos[1];
	parse_args(argc, argv, NULL, NULL, pos, 1);
	if (!valid_run_id(pos[0]))
		usage("invalid ID %s", pos[0]);
	char path[128], text[32] = {0};
	snprintf(path, sizeof path, STATUS_DIR "/" STATUS_PREFIX "%s", pos[0]);
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		if (errno != ENOENT)
			fail_errno(errno, "status", pos[0]);
		puts("exit");
		return 0;
	}
	struct stat st;
	ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode)
			    ? read_retry(fd, text, sizeof text - 1) : -1;
	close(fd);
	unlink(path);
	int sig = 0;
	char extra;
	if (n > 0 && sscanf(text, "signal %d%c", &sig, &extra) == 2 && extra == '\n' &&
	    sig > 0 && sig < 65)
		printf("signal %d\n", sig);
	else
		puts("exit");
	return 0;
}

static int cmd_run(int argc, char **argv)
{
	const char *cwd = NULL;
	uint64_t timeout_ms = 0;
	struct winsize ws = {0};
	bool tty = false, clean_env = false;
	int i = 0;
	for (; i < argc; i++) {
		if (!strcmp(argv[i], "--")) {
			i++;
			break;
		} else if (!strcmp(argv[i], "--clean-env")) {
			clean_env = true;
		} else if (!strcmp(argv[i], "--tty") && i + 1 < argc) {
			unsigned rows, cols;
			char extra;
			if (sscanf(argv[++i], "%ux%u%c", &rows, &cols, &extra) != 2 ||
			    !rows || !cols || rows > 65535 || cols > 65535)
				usage("run: --tty wants ROWSxCOLS, got %s", argv[i]);
			ws.ws_row = (unsigned short)rows;
			ws.ws_col = (unsigned short)cols;
			tty = true;
		} else if (!strcmp(argv[i], "--id") && i + 1 < argc) {
			/* matched from /proc/PID/cmdline by kill/signal; names the
			 * status record (see write_status) */
			g_run_id = argv[++i];
		} else if (!strcmp(argv[i], "--timeout-ms") && i + 1 < argc) {
			timeout_ms = parse_uint(argv[++i], "--timeout-ms");
		} else if (!strcmp(argv[i], "--cwd") && i + 1 < argc) {
			cwd = argv[++i];
		} else {
			usage("run: unknown option %s (command must follow --)", argv[i]);
		}
	}
	if (i >= argc)
		usage("run: missing command after --");
	char **cmd = argv + i;

	g_rootfd = open(g_root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (g_rootfd < 0)
		fail_errno_code(126, errno, "open root", g_root);
	char *realroot = realpath(g_root, NULL);
	if (!realroot)
		fail_errno_code(126, errno, "resolve root", g_root);

	/* Signals are consumed synchronously with sigtimedwait: no handlers,
	 * no async-signal-safety pitfalls, no lost wakeups. */
	sigset_t set;
	sigemptyset(&set);
	int sigs[] = {SIGCHLD, SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP, SIGQUIT};
	for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++)
		sigaddset(&set, sigs[k]);
	if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
		fail_errno_code(126, errno, "sigprocmask", "");
	/* Orphans of the tree (double fork, setsid, nohup) come to us, not
	 * to PID 1, so they stay findable and killable. */
	if (become_subreaper() < 0)
		fail_errno_code(126, errno, "prctl", "PR_SET_CHILD_SUBREAPER");

	/* Whatever an earlier command left behind by killing its supervisor
	 * and monitor together dies before this one starts. */
	reap_orphans();
	char **envp = command_env(clean_env);
	int rep[2], info[2];
	if (pipe2(rep, O_CLOEXEC) < 0 || pipe2(info, O_CLOEXEC) < 0)
		fail_errno_code(126, errno, "pipe", "");
	pid_t self = getpid();
	pid_t monitor = fork();
	if (monitor < 0)
		fail_errno_code(126, errno, "fork", "");
	if (monitor == 0) {
		close(rep[0]);
		close(info[0]);
		monitor_main(rep[1], info[1], self, cwd, realroot, tty ? &ws : NULL, cmd, envp);
	}
	close(rep[1]);
	close(info[1]);

	/* The monitor names the command first (its process group, for
	 * forwarded signals), and later reports the command's wait status. */
	pid_t child = 0;
	size_t got = 0;
	while (got < sizeof child) {
		ssize_t n = read_retry(info[0], (char *)&child + got, sizeof child - got);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	if (got != sizeof child)
		child = 0;

	/* EOF means execve succeeded (CLOEXEC closed the pipe); a report
	 * means it never ran, and we know exactly why. */
	struct report r;
	got = 0;
	while (got < sizeof r) {
		ssize_t n = read_retry(rep[0], (char *)&r + got, sizeof r - got);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(rep[0]);
	if (got != sizeof r && child <= 0) {
		/* The monitor died before starting the command. */
		r.stage = ST_SETUP;
		r.err = EIO;
		got = sizeof r;
	}
	if (got == sizeof r) {
		kill_tree(child);
		const char *c = cwd ? cwd : g_root;
		switch (r.stage) {
		case ST_CWD:
			fail_errno_code(126, r.err, "chdir", c);
		case ST_ESCAPE:
			fail(126, "ESCAPE", "working directory %s is outside the root", c);
		case ST_EXEC:
			if (r.err == ENOENT)
				fail(127, "ENOENT", "command not found: %s", cmd[0]);
			fail_errno_code(126, r.err, "cannot execute", cmd[0]);
		default:
			fail_errno_code(126, r.err, "setup", "child");
		}
	}

	struct timespec deadline = {0, 0};
	if (timeout_ms) {
		clock_gettime(CLOCK_MONOTONIC, &deadline);
		deadline.tv_sec += (time_t)(timeout_ms / 1000);
		deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
		if (deadline.tv_nsec >= 1000000000L) {
			deadline.tv_sec++;
			deadline.tv_nsec -= 1000000000L;
		}
	}

	for (;;) {
		siginfo_t si;
		int sig;
		if (timeout_ms) {
			/* Waits of at most a second: a sandbox restored from a
			 * memory checkpoint finds its monotonic clock moved on by
			 * the time it was suspended, which a timeout must not
			 * count. A wait that took far longer than asked (more
			 * than SUSPEND_JUMP_NS over) was such a pause, and moves
			 * the deadline on by it. */
			struct timespec now, rem, after;
			clock_gettime(CLOCK_MONOTONIC, &now);
			rem.tv_sec = deadline.tv_sec - now.tv_sec;
			rem.tv_nsec = deadline.tv_nsec - now.tv_nsec;
			if (rem.tv_nsec < 0) {
				rem.tv_sec--;
				rem.tv_nsec += 1000000000L;
			}
			if (rem.tv_sec < 0) {
				kill_tree(child);
				_exit(EXIT_KILLED);
			}
			if (rem.tv_sec >= 1) {
				rem.tv_sec = 1;
				rem.tv_nsec = 0;
			}
			sig = sigtimedwait(&set, &si, &rem);
			int saved = errno;
			clock_gettime(CLOCK_MONOTONIC, &after);
			int64_t took = (int64_t)(after.tv_sec - now.tv_sec) * 1000000000LL +
				       (after.tv_nsec - now.tv_nsec);
			int64_t asked = (int64_t)rem.tv_sec * 1000000000LL + rem.tv_nsec;
			if (took - asked > SUSPEND_JUMP_NS) {
				int64_t over = took - asked;
				deadline.tv_sec += (time_t)(over / 1000000000LL);
				deadline.tv_nsec += (long)(over % 1000000000LL);
				if (deadline.tv_nsec >= 1000000000L) {
					deadline.tv_sec++;
					deadline.tv_nsec -= 1000000000L;
				}
			}
			errno = saved;
			if (sig < 0 && errno == EAGAIN)
				continue; /* a slice ended: the deadline is checked above */
		} else {
			sig = sigwaitinfo(&set, &si);
		}
		if (sig < 0) {
			if (errno == EAGAIN) { /* deadline reached */
				kill_tree(child);
				_exit(EXIT_KILLED);
			}
			continue; /* EINTR, e.g. after SIGSTOP/SIGCONT of us */
		}
		if (sig == SIGCHLD) {
			int status = 0;
			bool done = false;
			pid_t w;
			/* Reap reparented orphans as well; only the main
			 * child's status matters. */
			while ((w = waitpid(-1, &status, WNOHANG)) != 0) {
				if (w < 0) {
					if (errno == EINTR)
						continue;
					break;
				}
				if (w == monitor) {
					done = true;
					break;
				}
			}
			if (done) {
				/* The monitor's report is the command's status; a
				 * monitor that ended without one was killed (by the
				 * command, or anyone): the tree goes, status 137. */
				int cstatus;
				got = 0;
				while (got < sizeof cstatus) {
					ssize_t n = read_retry(info[0], (char *)&cstatus + got,
							       sizeof cstatus - got);
					if (n <= 0)
						break;
					got += (size_t)n;
				}
				kill_tree(child);
				if (got != sizeof cstatus || !WIFEXITED(status) ||
				    WEXITSTATUS(status) != 0)
					_exit(EXIT_KILLED);
				status = cstatus;
				discard_pending_stdin();
				if (WIFSIGNALED(status)) {
					write_status(WTERMSIG(status));
					_exit(128 + WTERMSIG(status));
				}
				_exit(WEXITSTATUS(status));
			}
		} else if (sig == SIGUSR2) {
			int fwd = si.si_value.sival_int;
			if (si.si_code == SI_QUEUE && forwardable(fwd))
				kill(-child, fwd);
		} else {
			/* SIGUSR1 (sbx kill), SIGTERM, SIGINT, SIGHUP, SIGQUIT */
			kill_tree(child);
			_exit(EXIT_KILLED);
		}
	}
}

/* ------------------------------------------------------------------ */
/* kill / signal                                                       */
/* ------------------------------------------------------------------ */

/* Is this NUL-separated cmdline an `sbx [--root R] run ... --id TOKEN ...
 * [-- ...]` invocation, parsed the way main() and cmd_run() parse it? */
static bool cmdline_matches(char *buf, size_t len, const char *token,
			    const struct stat *self_exe, pid_t pid)
{
	char *args[4096];
	size_t n = 0;
	for (size_t off = 0; off < len && n < sizeof args / sizeof args[0];) {
		args[n++] = buf + off;
		off += strlen(buf + off) + 1;
	}
	if (n < 2)
		return false;
	const char *base = strrchr(args[0], '/');
	base = base ? base + 1 : args[0];
	if (strcmp(base, "sbx")) {
		/* Renamed binary: accept it if it is literally us. */
		char path[64];
		struct stat st;
		snprintf(path, sizeof path, "/proc/%ld/exe", (long)pid);
		if (stat(path, &st) < 0 || st.st_dev != self_exe->st_dev ||
		    st.st_ino != self_exe->st_ino)
			return false;
	}
	size_t i = 1;
	while (i + 1 < n && !strcmp(args[i], "--root"))
		i += 2;
	if (i >= n || strcmp(args[i], "run"))
		return false;
	for (i++; i < n && strcmp(args[i], "--"); i++) {
		if (!strcmp(args[i], "--id") && i + 1 < n && !strcmp(args[i + 1], token))
			return true;
		if (!strcmp(args[i], "--id") || !strcmp(args[i], "--timeout-ms") ||
		    !strcmp(args[i], "--cwd") || !strcmp(args[i], "--tty"))
			i++;
	}
	return false;
}

static uid_t proc_uid(pid_t pid, bool *ok)
{
	char path[64], buf[4096];
	snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
	*ok = false;
	if (read_small(path, buf, sizeof buf) <= 0)
		return 0;
	char *p = strstr(buf, "\nUid:");
	unsigned long uid;
	if (!p || sscanf(p + 5, "%lu", &uid) != 1)
		return 0;
	*ok = true;
	return (uid_t)uid;
}

/* Send `sig` (with `val` via sigqueue when `queue`) to every supervisor
 * started with --id TOKEN.  Returns the number signalled. */
static size_t signal_supervisors(const char *token, int sig, bool queue, int val)
{
	struct stat self_exe;
	if (stat("/proc/self/exe", &self_exe) < 0)
		memset(&self_exe, 0, sizeof self_exe);
	pid_t self = getpid();
	uid_t uid = getuid();
	size_t cap = 1 << 16;
	char *buf = xmalloc(cap);
	pid_t *match = NULL;
	size_t nmatch = 0;

	DIR *d = opendir("/proc");
	if (!d)
		fail_errno(errno, "open", "/proc");
	struct dirent *e;
	while ((e = readdir(d))) {
		char *end, path[64];
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 0 || pid == self)
			continue;
		bool ok;
		uid_t pu = proc_uid((pid_t)pid, &ok);
		if (!ok || pu != uid)
			continue;
		snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
		ssize_t len = read_small(path, buf, cap);
		if (len <= 0 || !cmdline_matches(buf, (size_t)len, token, &self_exe, (pid_t)pid))
			continue;
		pid_t *nm = realloc(match, (nmatch + 1) * sizeof *match);
		if (!nm)
			oom();
		match = nm;
		match[nmatch++] = (pid_t)pid;
	}
	closedir(d);
	free(buf);

	size_t sent = 0;
	for (size_t i = 0; i < nmatch; i++) {
		/* Between fork and exec the supervisor's child still carries
		 * the same cmdline; signal only the supervisor itself. */
		pid_t pp = read_ppid(match[i]);
		bool child_of_match = false;
		for (size_t j = 0; j < nmatch; j++)
			if (match[j] == pp)
				child_of_match = true;
		if (child_of_match)
			continue;
		int rc;
		if (queue) {
			union sigval sv = {.sival_int = val};
			rc = sigqueue(match[i], sig, sv);
		} else {
			rc = kill(match[i], sig);
		}
		/* A command can SIGSTOP its supervisor (same uid); a stopped
		 * one would hold the request pending forever. */
		if (rc == 0) {
			kill(match[i], SIGCONT);
			sent++;
		}
	}
	free(match);
	return sent;
}

static int cmd_kill(int argc, char **argv)
{
	char *pos[1];
	parse_args(argc, argv, NULL, NULL, pos, 1);
	size_t sent = signal_supervisors(pos[0], SIGUSR1, false, 0);
	/* The server kills by token when a call ends early; a supervisor that
	 * is gone may have left orphans behind. */
	reap_orphans();
	if (!sent)
		fail(1, "NOT_FOUND", "no supervisor with id %s", pos[0]);
	return 0;
}

/* `sbx reap`: for the server, after an exec ended without its supervisor's
 * report (killed); prints how many orphans it killed. */
static int cmd_reap(int argc, char **argv)
{
	(void)argv;
	if (argc != 0)
		usage("usage: sbx reap");
	printf("%zu\n", reap_orphans());
	return 0;
}

static int cmd_signal(int argc, char **argv)
{
	static const struct {
		const char *name;
		int sig;
	} names[] = {
		{"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},   {"SIGQUIT", SIGQUIT},
		{"SIGKILL", SIGKILL}, {"SIGTERM", SIGTERM}, {"SIGUSR1", SIGUSR1},
		{"SIGUSR2", SIGUSR2}, {"SIGSTOP", SIGSTOP}, {"SIGCONT", SIGCONT},
		{"SIGWINCH", SIGWINCH},
	};
	char *pos[2];
	parse_args(argc, argv, NULL, NULL, pos, 2);
	int sig = 0;
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (!strcmp(pos[1], names[i].name))
			sig = names[i].sig;
	if (!sig)
		usage("unsupported signal %s", pos[1]);
	if (!signal_supervisors(pos[0], SIGUSR2, true, sig))
		fail(1, "NOT_FOUND", "no supervisor with id %s", pos[0]);
	return 0;
}

/* ------------------------------------------------------------------ */

/*
 * `sbx idle`: the container's main process.  It runs under a uid of its own
 * (the keeper), so a command's `kill -9 -1` cannot reach it and end the
 * container, which would take the workspace tmpfs with it.  It holds no
 * files open and does nothing until the engine stops the container.
 */
static int cmd_idle(int argc, char **argv)
{
	(void)argv;
	if (argc != 0)
		usage("usage: sbx idle");
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigprocmask(SIG_BLOCK, &set, NULL);
	for (;;) {
		int sig = sigwaitinfo(&set, NULL);
		if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP)
			return 0;
	}
}

int main(int argc, char **argv)
{
	int i = 1;
	/* The walk gVisor needs, forced on a kernel with openat2: tests run
	 * every confinement case through it too.  Never less safe. */
	if (getenv("SBX_NO_OPENAT2"))
		g_no_openat2 = true;
	while (i < argc && !strcmp(argv[i], "--root")) {
		if (i + 1 >= argc || !argv[i + 1][0])
			usage("--root requires a directory");
		g_root = argv[i + 1];
		i += 2;
	}
	if (i >= argc)
		usage("usage: sbx [--root DIR] run|kill|signal|reap|stat|read|write|list|remove|mkdir|chmod|merge|move|status|idle|watch|dial|agent ...");
	const char *sub = argv[i++];
	int rest = argc - i;
	char **rv = argv + i;

	static const struct {
		const char *name;
		int (*fn)(int, char **);
	} cmds[] = {
		{"run", cmd_run},     {"kill", cmd_kill},   {"signal", cmd_signal},
		{"stat", cmd_stat},   {"read", cmd_read},   {"write", cmd_write},
		{"list", cmd_list},   {"remove", cmd_remove}, {"mkdir", cmd_mkdir},
		{"idle", cmd_idle},   {"merge", cmd_merge}, {"reap", cmd_reap},
		{"chmod", cmd_chmod}, {"status", cmd_status},
		{"move", cmd_move},
		{"watch", cmd_watch},
		{"dial", cmd_dial},
		{"agent", cmd_agent},
	};
	for (size_t k = 0; k < sizeof cmds / sizeof cmds[0]; k++) {
		if (strcmp(sub, cmds[k].name))
			continue;
		/* A closed stdout must become an EIO error, not a silent
		 * death by SIGPIPE.  `run` leaves dispositions alone. */
		if (cmds[k].fn != cmd_run)
			signal(SIGPIPE, SIG_IGN);
		return cmds[k].fn(rest, rv);
	}
	usage("unknown subcommand %s", sub);
}
