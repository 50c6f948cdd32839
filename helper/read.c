/*
 * read.c - `sbx read PATH MAXBYTES`: a header line, then the file's bytes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

#include "sbx.h"
#include "files.h"

int cmd_read(int argc, char **argv)
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
