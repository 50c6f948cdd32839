/*
 * run_child.c - the command's side of `sbx run`: the monitor between the
 * supervisor and the command, the child that execs it, its environment.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "sbx.h"
#include "proc.h"

__attribute__((noreturn))
static void child_report(int fd, int stage, int err)
{
	struct report r = {stage, err};
	(void)write_all(fd, &r, sizeof r);
	_exit(126);
}

/* Whether `path` is `root` or below it (the command's cwd, both ways it starts). */
bool path_within(const char *path, const char *root)
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
bool loader_var(const char *entry)
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

/* The command's environment, both ways it starts (`sbx run`: ours; the agent:
 * the request's): `envp` minus the loader variables, or with --clean-env (the
 * server's own runs, e.g. tar) only fixed values, so no caller variable reaches
 * them.  Every string a copy of its own (str_array_free frees it all). */
char **command_env(char **envp, bool clean)
{
	size_t n = 0;
	for (char **e = envp; *e; e++)
		n++;
	char **out = xmalloc((n + 4) * sizeof *out);
	size_t o = 0;
	if (clean) {
		char home[PATH_MAX + 8];
		snprintf(home, sizeof home, "HOME=%s", g_root);
		out[o++] = xstrdup("PATH=" FIXED_PATH);
		out[o++] = xstrdup("LANG=C.UTF-8");
		out[o++] = xstrdup(home);
	} else {
		for (char **e = envp; *e; e++)
			if (!loader_var(*e))
				out[o++] = xstrdup(*e);
	}
	out[o] = NULL;
	return out;
}

/* execve argv[0] as given when it holds a '/', else looked up on FIXED_PATH
 * (never the environment's PATH), both ways a command starts.  Returns only on
 * failure, with the errno execvp would report: EACCES if some candidate was not
 * executable. */
int exec_command(char **cmd, char **envp)
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

/*
 * Every disposition back to the default and nothing blocked, for a command
 * about to exec (both ways it starts): what the supervisor or the agent blocked
 * or ignored must not reach it.  Through the raw call: glibc refuses its
 * reserved real-time signals (32, 33), yet an ignored one is inherited across
 * exec all the same.  An all-zero kernel sigaction is SIG_DFL, no flags, an
 * empty mask, whatever the architecture's field order.  Plain system calls
 * only: the agent's child runs it between vfork and exec.  Returns
 * sigprocmask's result.
 */
int reset_signals(void)
{
	for (int s = 1; s < NSIG; s++) {
		if (s == SIGKILL || s == SIGSTOP)
			continue;
		unsigned long ksa[4] = {0};
		syscall(SYS_rt_sigaction, s, ksa, NULL, 8);
	}
	sigset_t none;
	sigemptyset(&none);
	return sigprocmask(SIG_SETMASK, &none, NULL);
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
	if (reset_signals() < 0)
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
void monitor_main(int repfd, int infofd, pid_t parent, const char *cwd,
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
	supervisor_signals(&set);
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
		if (reap_until(child, &status)) {
			kill_tree(child);
			(void)write_all(infofd, &status, sizeof status);
			_exit(0);
		}
	}
}
