/*
 * run.c - `sbx run`: the supervisor, which kills the command's whole tree when it
 * ends, on timeout or on request, and exits with its status.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "sbx.h"
#include "proc.h"

/* A wait that overran by more than this was a memory suspend (or a host that stalled the
 * sandbox as long): the supervisor's deadline does not count it (cmd_run). */
#define SUSPEND_JUMP_NS 500000000LL

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
 * What the supervisor blocks from its start and takes with sigwaitinfo: the
 * command's end, kill requests, forward requests in both spellings (SIG_FORWARD
 * and an older helper's SIGUSR2), and the signals that end it.  Its monitor
 * inherits the mask and waits on the same set.
 */
void supervisor_signals(sigset_t *set)
{
	static const int sigs[] = {SIGCHLD, SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP, SIGQUIT};
	sigemptyset(set);
	for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++)
		sigaddset(set, sigs[k]);
	sigaddset(set, SIG_FORWARD);
}

int cmd_run(int argc, char **argv)
{
	const char *run_id = NULL;
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
			run_id = argv[++i];
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
	supervisor_signals(&set);
	if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
		fail_errno_code(126, errno, "sigprocmask", "");
	/* Orphans of the tree (double fork, setsid, nohup) come to us, not
	 * to PID 1, so they stay findable and killable. */
	if (become_subreaper() < 0)
		fail_errno_code(126, errno, "prctl", "PR_SET_CHILD_SUBREAPER");

	/* Whatever an earlier command left behind by killing its supervisor
	 * and monitor together dies before this one starts. */
	reap_orphans();
	extern char **environ;
	char **envp = command_env(environ, clean_env);
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
			/* Reap reparented orphans as well; only the main
			 * child's status matters. */
			bool done = reap_until(monitor, &status);
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
					write_status(run_id, WTERMSIG(status));
					_exit(128 + WTERMSIG(status));
				}
				_exit(WEXITSTATUS(status));
			}
		} else if (sig == SIG_FORWARD || sig == SIGUSR2) {
			/* SIGUSR2: from an older helper's `sbx signal` or agent */
			int fwd = si.si_value.sival_int;
			if (si.si_code == SI_QUEUE && signal_forwardable(fwd))
				kill(-child, fwd);
		} else {
			/* SIGUSR1 (sbx kill), SIGTERM, SIGINT, SIGHUP, SIGQUIT */
			kill_tree(child);
			_exit(EXIT_KILLED);
		}
	}
}
