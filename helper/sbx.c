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
 * This file holds the subcommand table and main(); each subcommand has a file
 * of its own (helper/README.md has the map).
 *
 * Build: `make helper` (every helper C file into one static build/sbx)
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "sbx.h"

const char *g_root = "/workspace";

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
		usage("usage: sbx [--root DIR] run|kill|signal|reap|stat|read|write|list|remove|mkdir|chmod|merge|move|status|idle|watch|dial|agent|zpack|zunpack ...");
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
		{"zpack", cmd_zpack},
		{"zunpack", cmd_zunpack},
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
