/*
 * status.c - the status record of `run --id ID` and `sbx status ID`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "sbx.h"
#include "proc.h"

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

static bool valid_run_id(const char *id)
{
	size_t n = strlen(id);
	return n > 0 && n <= 64 &&
	       strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") == n;
}

void write_status(const char *id, int sig)
{
	if (!id || !valid_run_id(id))
		return;
	char path[128], text[32];
	snprintf(path, sizeof path, STATUS_DIR "/" STATUS_PREFIX "%s", id);
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return; /* best effort: the server then reports the exit code only */
	int n = snprintf(text, sizeof text, "signal %d\n", sig);
	(void)write_all(fd, text, (size_t)n);
	close(fd);
}

/* `sbx status ID`: "signal N" when the command run with --id ID died of
 * signal N, "exit" otherwise; the record is removed. */
int cmd_status(int argc, char **argv)
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
