/*
 * kill.c - `sbx kill`, `sbx signal` and `sbx reap`: finding supervisors by token.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sbx.h"
#include "proc.h"

/* Whether `path` (a file, or /proc/PID/exe for what PID runs) is this very
 * executable, by device and inode: the agent's own helper, a renamed copy of
 * us, a supervisor of this build. */
bool own_executable(const char *path)
{
	static struct stat self;
	static bool known;
	if (!known && stat("/proc/self/exe", &self) == 0)
		known = true;
	struct stat st;
	return known && stat(path, &st) == 0 && st.st_dev == self.st_dev && st.st_ino == self.st_ino;
}

static bool runs_us(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%ld/exe", (long)pid);
	return own_executable(path);
}

/* Is this NUL-separated cmdline an `sbx [--root R] run ... --id TOKEN ...
 * [-- ...]` invocation, parsed the way main() and cmd_run() parse it? */
static bool cmdline_matches(char *buf, size_t len, const char *token, pid_t pid)
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
	/* Renamed binary: accept it if it is literally us. */
	if (strcmp(base, "sbx") && !runs_us(pid))
		return false;
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

/*
 * Ask the `sbx run` supervisor `pid` to forward `sig` to its command's group.
 * SIG_FORWARD, which queues every request with its value, when the supervisor
 * runs this very executable (it blocks and takes that signal); SIGUSR2 to any
 * other, all an older helper's supervisor knows: a real-time signal it does not
 * block would end it.  Old and new meet only where a sandbox's processes are
 * older than its helper volume: a memory checkpoint of an older server's,
 * resumed by a newer one (helper/README.md, "kill / signal").  Where /proc/PID/exe
 * cannot be read, SIGUSR2 too: never worse than before.
 */
int forward_request(pid_t pid, int sig)
{
	union sigval v = {.sival_int = sig};
	return sigqueue(pid, runs_us(pid) ? SIG_FORWARD : SIGUSR2, v);
}

/* To every supervisor started with --id TOKEN: a request to forward
 * `forward`, or with 0, sbx kill's SIGUSR1.  Returns the number signalled;
 * `*err`: why a send to a supervisor that is still there failed, else 0. */
static size_t signal_supervisors(const char *token, int forward, int *err)
{
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
		if (len <= 0 || !cmdline_matches(buf, (size_t)len, token, (pid_t)pid))
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
	*err = 0;
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
		int rc = forward ? forward_request(match[i], forward) : kill(match[i], SIGUSR1);
		/* A command can SIGSTOP its supervisor (same uid); a stopped
		 * one would hold the request pending forever. */
		if (rc == 0) {
			kill(match[i], SIGCONT);
			sent++;
		} else if (errno != ESRCH) {
			*err = errno;
		}
	}
	free(match);
	return sent;
}

int cmd_kill(int argc, char **argv)
{
	char *pos[1];
	parse_args(argc, argv, NULL, NULL, pos, 1);
	int err;
	size_t sent = signal_supervisors(pos[0], 0, &err);
	/* The server kills by token when a call ends early; a supervisor that
	 * is gone may have left orphans behind. */
	reap_orphans();
	if (!sent)
		fail(1, "NOT_FOUND", "no supervisor with id %s", pos[0]);
	return 0;
}

/* `sbx reap`: for the server, after an exec ended without its supervisor's
 * report (killed); prints how many orphans it killed. */
int cmd_reap(int argc, char **argv)
{
	(void)argv;
	if (argc != 0)
		usage("usage: sbx reap");
	printf("%zu\n", reap_orphans());
	return 0;
}

/* The signals a caller may name (Signal, `sbx signal`): the only ones a
 * supervisor forwards to its command, whichever way it was asked. */
static const struct {
	const char *name;
	int sig;
} g_signals[] = {
	{"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},   {"SIGQUIT", SIGQUIT},
	{"SIGKILL", SIGKILL}, {"SIGTERM", SIGTERM}, {"SIGUSR1", SIGUSR1},
	{"SIGUSR2", SIGUSR2}, {"SIGSTOP", SIGSTOP}, {"SIGCONT", SIGCONT},
	{"SIGWINCH", SIGWINCH},
};

/* 0 for a name not in the table. */
int signal_by_name(const char *name)
{
	for (size_t i = 0; i < sizeof g_signals / sizeof g_signals[0]; i++)
		if (!strcmp(name, g_signals[i].name))
			return g_signals[i].sig;
	return 0;
}

bool signal_forwardable(int sig)
{
	for (size_t i = 0; i < sizeof g_signals / sizeof g_signals[0]; i++)
		if (sig == g_signals[i].sig)
			return true;
	return false;
}

int cmd_signal(int argc, char **argv)
{
	char *pos[2];
	parse_args(argc, argv, NULL, NULL, pos, 2);
	int sig = signal_by_name(pos[1]);
	if (!sig)
		usage("unsupported signal %s", pos[1]);
	int err;
	if (signal_supervisors(pos[0], sig, &err))
		return 0;
	/* EAGAIN: the supervisor's user has as many signals queued as its
	 * RLIMIT_SIGPENDING allows (its commands can queue them too); the
	 * request was not delivered, which is no "it has ended". */
	if (err == EAGAIN)
		fail(1, "KERNEL_LIMIT", "signal %s: the sandbox's user has as many "
		     "signals queued as the kernel allows (RLIMIT_SIGPENDING)", pos[0]);
	if (err)
		fail(1, "EIO", "signal %s: %s", pos[0], strerror(err));
	fail(1, "NOT_FOUND", "no supervisor with id %s", pos[0]);
	return 0;
}
