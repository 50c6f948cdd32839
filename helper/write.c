/*
 * write.c - `sbx write PATH MODE MAXBYTES`: stdin into a temp file, renamed over
 * the target, so readers see the old file or the new one, never a mix.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

#include "sbx.h"
#include "files.h"

/* Async-signal-safe: unlinkat and _exit only. */
static void write_ended(int sig)
{
	if (g_tmp_name[0])
		unlinkat(g_tmp_dirfd, g_tmp_name, 0);
	unmake_dirs();
	_exit(128 + sig);
}

int cmd_write(int argc, char **argv)
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
