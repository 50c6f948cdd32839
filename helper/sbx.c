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
#include "files.h"
#include "proc.h"
#include "tree.h"

const char *g_root = "/workspace";

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

int cmd_kill(int argc, char **argv)
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
int cmd_reap(int argc, char **argv)
{
	(void)argv;
	if (argc != 0)
		usage("usage: sbx reap");
	printf("%zu\n", reap_orphans());
	return 0;
}

int cmd_signal(int argc, char **argv)
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
