/*
 * proc.h - processes: /proc scans and tree kills (procs.c), the command's
 * side of `run` (run_child.c) and the status record (status.c), shared by
 * run, kill, signal and reap.
 */
#ifndef SBX_PROC_H
#define SBX_PROC_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/types.h>

/* What `run` exits with when it killed the command's tree. */
#define EXIT_KILLED 137

/*
 * What `sbx signal` (and the agent, relaying) asks an `sbx run` supervisor to
 * forward to its command with: a real-time signal whose value is the signal
 * to forward.  Real-time signals queue, each with its value, so STOP, CONT and
 * KILL sent before the supervisor takes the first all arrive; SIGUSR2, what
 * older helpers use and still taken, is pending at most once and would drop
 * the later ones.  kill.c's forward_request picks which one a supervisor gets.
 */
#define SIG_FORWARD SIGRTMIN
/* run.c: the signals a supervisor blocks and takes (its monitor waits on the same). */
void supervisor_signals(sigset_t *set);

/* procs.c */
/* Read a small file (/proc's) into buf, NUL-terminated: its length, or -1. */
ssize_t read_small(const char *path, char *buf, size_t cap);

/* One process's /proc/PID/stat: the fields the helper and the agent read. */
struct pstat {
	pid_t pid, ppid, pgrp, sid;
	char state;
	bool counted; /* num_threads and rss were given (a full line) */
	long threads; /* num_threads */
	long rss;     /* resident pages */
};
bool read_pstat(pid_t pid, struct pstat *ps);
/* Every process /proc lists and that has not ended meanwhile, in /proc's
 * order: `*count` of them (the caller frees; NULL when none). */
struct pstat *scan_pstats(size_t *count);
pid_t read_ppid(pid_t pid);
uid_t proc_uid(pid_t pid, bool *ok);
size_t reap_orphans(void);
int become_subreaper(void);
void kill_tree(pid_t pgid);
bool reap_until(pid_t pid, int *status);

/* run_child.c: how far the command's child got before exec, over the report pipe */
enum stage { ST_SETUP = 1, ST_CWD, ST_ESCAPE, ST_EXEC };

struct report {
	int stage;
	int err;
};

__attribute__((noreturn)) void monitor_main(int repfd, int infofd, pid_t parent,
					    const char *cwd, const char *realroot,
					    const struct winsize *tty, char **cmd, char **envp);

/* status.c: leave "signal SIG" for `sbx status ID` (run --id ID). */
void write_status(const char *id, int sig);

#endif
