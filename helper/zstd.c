/*
 * zstd.c - `sbx zpack` and `sbx zunpack`: tar's archive compressed inside the sandbox, so
 * that the server relays compressed bytes and never carries the uncompressed stream.
 *
 * sbx zpack LEVEL MAXBYTES -- ARGV...
 *   Runs ARGV (tar -c) with its stdout into a pipe and writes that output as zstd frames to
 *   stdout. Past MAXBYTES of uncompressed output (a sparse file's archive) it kills ARGV and
 *   fails TOO_LARGE: the cap the server holds an uncompressed export to still holds.
 *
 * sbx zunpack -- ARGV...
 *   Runs ARGV (tar -x) with its stdin from a pipe and builds that input from the records on
 *   its own stdin, each a type byte, a 4-byte big-endian length and the payload:
 *     'Z' bytes  the caller's compressed archive, as it came (queued, decoded on demand)
 *     'L' bytes  literal bytes for tar (the headers the server wrote for checked members)
 *     'S' u64    skip that many decoded bytes (the caller's own headers and padding)
 *     'C' u64    copy that many decoded bytes to tar (a checked member's content)
 *   tar therefore sees only headers the server wrote and content ranges it checked: the
 *   caller's compressed bytes never reach tar as they are.
 *
 * Both exit with ARGV's status (128 + the signal if it was killed); their own failures are the
 * usual error line with status 125.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include "sbx.h"

#define IO_BYTES (128 * 1024)
#define WINDOW_LOG_MAX 23		 /* 8 MiB: what levels up to 19 use; the server's limit too */
#define QUEUE_MAX (64u * 1024 * 1024) /* compressed bytes queued ahead of the records using them */
#define RECORD_MAX (16u * 1024 * 1024)

static pid_t g_child = -1;

static void kill_child(void)
{
	if (g_child > 0)
		kill(g_child, SIGKILL);
}

static pid_t spawn(char **argv, int fd, int target)
{
	pid_t pid = fork();
	if (pid < 0)
		fail_errno(errno, "fork", argv[0]);
	if (pid == 0) {
		if (dup2(fd, target) < 0)
			_exit(126);
		close(fd);
		signal(SIGPIPE, SIG_DFL);
		execvp(argv[0], argv);
		_exit(errno == ENOENT ? 127 : 126);
	}
	close(fd);
	return pid;
}

static int child_status(void)
{
	int st;
	while (waitpid(g_child, &st, 0) < 0)
		if (errno != EINTR)
			fail_errno(errno, "waitpid", "child");
	g_child = -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char **after_dashes(int argc, char **argv, int *first)
{
	for (int i = 0; i < argc; i++)
		if (!strcmp(argv[i], "--")) {
			if (i + 1 >= argc)
				usage("a command is needed after --");
			*first = i;
			return argv + i + 1;
		}
	usage("usage: sbx zpack LEVEL MAXBYTES -- ARGV... | sbx zunpack -- ARGV...");
}

static void zfail(size_t code, const char *what)
{
	kill_child();
	fail(125, "EINVAL", "%s: %s", what, ZSTD_getErrorName(code));
}

int cmd_zpack(int argc, char **argv)
{
	int first;
	char **cmd = after_dashes(argc, argv, &first);
	if (first != 2)
		usage("usage: sbx zpack LEVEL MAXBYTES -- ARGV...");
	int level = atoi(argv[0]);
	uint64_t max = parse_uint(argv[1], "MAXBYTES");
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) < 0)
		fail_errno(errno, "pipe", "zpack");
	g_child = spawn(cmd, fds[1], 1);
	int in = fds[0];

	ZSTD_CCtx *cctx = ZSTD_createCCtx();
	if (!cctx)
		oom();
	size_t r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
	if (ZSTD_isError(r))
		zfail(r, "compression level");
	ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
	size_t out_cap = ZSTD_CStreamOutSize();
	char *ibuf = xmalloc(IO_BYTES), *obuf = xmalloc(out_cap);
	uint64_t total = 0;
	for (;;) {
		ssize_t n = read_retry(in, ibuf, IO_BYTES);
		if (n < 0)
			fail_errno(errno, "read", "the command's output");
		total += (uint64_t)n;
		if (total > max) {
			kill_child();
			child_status();
			fail(125, "TOO_LARGE", "the archive is over %llu bytes",
			     (unsigned long long)max);
		}
		ZSTD_EndDirective mode = n == 0 ? ZSTD_e_end : ZSTD_e_continue;
		ZSTD_inBuffer zin = {ibuf, (size_t)n, 0};
		size_t left;
		do {
			ZSTD_outBuffer zout = {obuf, out_cap, 0};
			left = ZSTD_compressStream2(cctx, &zout, &zin, mode);
			if (ZSTD_isError(left))
				zfail(left, "compress");
			if (zout.pos && write_all(1, obuf, zout.pos) < 0) {
				kill_child();
				fail_errno(errno, "write", "stdout");
			}
		} while (mode == ZSTD_e_end ? left != 0 : zin.pos < zin.size);
		if (n == 0)
			break;
	}
	ZSTD_freeCCtx(cctx);
	return child_status();
}

/* ---- zunpack ---- */

struct unpack {
	ZSTD_DCtx *dctx;
	char *queue; /* compressed bytes not yet decoded: queue[qpos, qlen) */
	size_t qpos, qlen, qcap;
	char *out; /* decoded, not yet used: out[opos, olen) */
	size_t opos, olen, ocap;
	bool pending; /* the last decode filled `out`: it may hold more without new input */
	int to_tar;   /* -1 once tar stopped reading */
	char *rec;
	size_t rcap;
};

static int read_exact(void *p, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read_retry(0, (char *)p + got, n - got);
		if (r < 0)
			fail_errno(errno, "read", "stdin");
		if (r == 0)
			return got == 0 ? 0 : -1;
		got += (size_t)r;
	}
	return 1;
}

/* The next record: its type, payload in u->rec; 0 at the end of stdin. */
static int next_record(struct unpack *u, uint32_t *len)
{
	unsigned char head[5];
	int r = read_exact(head, 5);
	if (r == 0)
		return 0;
	if (r < 0)
		fail(125, "EINVAL", "zunpack: stdin ends inside a record");
	*len = (uint32_t)head[1] << 24 | (uint32_t)head[2] << 16 | (uint32_t)head[3] << 8 | head[4];
	if (*len > RECORD_MAX)
		fail(125, "EINVAL", "zunpack: a record of %u bytes", *len);
	if (*len > u->rcap) {
		free(u->rec);
		u->rcap = *len;
		u->rec = xmalloc(u->rcap);
	}
	if (*len && read_exact(u->rec, *len) != 1)
		fail(125, "EINVAL", "zunpack: stdin ends inside a record");
	return head[0];
}

static void queue_add(struct unpack *u, const char *p, size_t n)
{
	if (u->qpos && u->qpos == u->qlen)
		u->qpos = u->qlen = 0;
	if (u->qlen + n > u->qcap) {
		memmove(u->queue, u->queue + u->qpos, u->qlen - u->qpos);
		u->qlen -= u->qpos;
		u->qpos = 0;
	}
	if (u->qlen + n > QUEUE_MAX)
		fail(125, "EINVAL", "zunpack: more than %u compressed bytes ahead", QUEUE_MAX);
	grow_bytes(&u->queue, &u->qcap, u->qlen + n, IO_BYTES);
	memcpy(u->queue + u->qlen, p, n);
	u->qlen += n;
}

static void to_tar(struct unpack *u, const char *p, size_t n)
{
	if (u->to_tar < 0 || !n)
		return;
	if (write_all(u->to_tar, p, n) < 0) {
		/* tar gave up (no room, a damaged member): its status says why */
		close(u->to_tar);
		u->to_tar = -1;
	}
}

/* Decode more into u->out; reads 'Z' records from stdin when the queue runs dry. */
static void decode_more(struct unpack *u)
{
	for (;;) {
		if (u->qpos < u->qlen || u->pending) {
			ZSTD_inBuffer zin = {u->queue, u->qlen, u->qpos};
			ZSTD_outBuffer zout = {u->out, u->ocap, 0};
			size_t r = ZSTD_decompressStream(u->dctx, &zout, &zin);
			if (ZSTD_isError(r))
				zfail(r, "zunpack: the compressed archive is damaged");
			u->qpos = zin.pos;
			u->opos = 0;
			u->olen = zout.pos;
			u->pending = zout.pos == zout.size;
			if (zout.pos)
				return;
			if (u->qpos < u->qlen)
				continue;
		}
		uint32_t len;
		int type = next_record(u, &len);
		if (type != 'Z')
			fail(125, "EINVAL", "zunpack: a copy or skip past the compressed bytes sent");
		queue_add(u, u->rec, len);
	}
}

static void take(struct unpack *u, uint64_t n, bool copy)
{
	while (n) {
		if (u->opos == u->olen)
			decode_more(u);
		size_t step = u->olen - u->opos;
		if (step > n)
			step = (size_t)n;
		if (copy)
			to_tar(u, u->out + u->opos, step);
		u->opos += step;
		n -= step;
	}
}

int cmd_zunpack(int argc, char **argv)
{
	int first;
	char **cmd = after_dashes(argc, argv, &first);
	if (first != 0)
		usage("usage: sbx zunpack -- ARGV...");
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) < 0)
		fail_errno(errno, "pipe", "zunpack");
	g_child = spawn(cmd, fds[0], 0);
	struct unpack u = {0};
	u.to_tar = fds[1];
	u.dctx = ZSTD_createDCtx();
	if (!u.dctx)
		oom();
	ZSTD_DCtx_setParameter(u.dctx, ZSTD_d_windowLogMax, WINDOW_LOG_MAX);
	u.ocap = ZSTD_DStreamOutSize();
	u.out = xmalloc(u.ocap);
	uint32_t len;
	int type;
	while ((type = next_record(&u, &len))) {
		uint64_t n = 0;
		if (type == 'S' || type == 'C') {
			if (len != 8)
				fail(125, "EINVAL", "zunpack: a count of %u bytes", len);
			for (int i = 0; i < 8; i++)
				n = n << 8 | (unsigned char)u.rec[i];
		}
		switch (type) {
		case 'Z':
			queue_add(&u, u.rec, len);
			break;
		case 'L':
			to_tar(&u, u.rec, len);
			break;
		case 'S':
		case 'C':
			take(&u, n, type == 'C');
			break;
		default:
			kill_child();
			fail(125, "EINVAL", "zunpack: unknown record type %d", type);
		}
	}
	if (u.to_tar >= 0)
		close(u.to_tar);
	ZSTD_freeDCtx(u.dctx);
	return child_status();
}
