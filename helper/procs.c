/*
 * procs.c - processes from /proc: descendants, orphans of a dead supervisor, and
 * killing a whole tree (run, kill, reap).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "sbx.h"
#include "proc.h"

/* Read a small /proc file into buf (NUL-terminated); returns length. */
ssize_t read_small(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t len = 0;
	while (len < cap - 1) {
		ssize_t n = read_retry(fd, buf + len, cap - 1 - len);
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	return (ssize_t)len;
}

bool read_pstat(pid_t pid, struct pstat *ps)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
	if (read_small(path, buf, sizeof buf) <= 0)
		return false;
	/* comm may contain spaces and ')' itself; fields resume after the
	 * last ')' and comm is far shorter than our buffer. */
	const char *p = strrchr(buf, ')');
	long ppid, pgrp, sid, threads, rss;
	/* state ppid pgrp session ... num_threads (20th) ... rss (24th, pages) */
	int got = p ? sscanf(p + 1,
			     " %c %ld %ld %ld %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d"
			     " %ld %*d %*u %*u %ld",
			     &ps->state, &ppid, &pgrp, &sid, &threads, &rss)
		    : 0;
	if (got < 4)
		return false;
	ps->pid = pid;
	ps->ppid = (pid_t)ppid;
	ps->pgrp = (pid_t)pgrp;
	ps->sid = (pid_t)sid;
	ps->counted = got == 6;
	ps->threads = ps->counted ? threads : 0;
	ps->rss = ps->counted ? rss : 0;
	return true;
}

pid_t read_ppid(pid_t pid)
{
	struct pstat ps;
	return read_pstat(pid, &ps) ? ps.ppid : -1;
}

struct pstat *scan_pstats(size_t *count)
{
	struct pstat *v = NULL;
	size_t n = 0, cap = 0;
	DIR *d = opendir("/proc");
	struct dirent *e;
	while (d && (e = readdir(d))) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 0)
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 256;
			struct pstat *nv = realloc(v, cap * sizeof *v);
			if (!nv)
				oom();
			v = nv;
		}
		if (read_pstat((pid_t)pid, &v[n]))
			n++; /* else it exited meanwhile */
	}
	if (d)
		closedir(d);
	*count = n;
	return v;
}

static int cmp_pid(const void *a, const void *b)
{
	pid_t x = ((const struct pstat *)a)->pid, y = ((const struct pstat *)b)->pid;
	return (x > y) - (x < y);
}

/* Snapshot of all visible processes, sorted by pid. */
static struct pstat *scan_procs(size_t *count)
{
	struct pstat *v = scan_pstats(count);
	if (*count)
		qsort(v, *count, sizeof *v, cmp_pid);
	return v;
}

/* Extend `mark` to every descendant of a marked process (or of `root`, if
 * > 0).  Fixpoint over the parent relation; passes <= tree depth. */
static void mark_descendants(const struct pstat *v, size_t n, bool *mark, pid_t root)
{
	for (bool changed = true; changed;) {
		changed = false;
		for (size_t i = 0; i < n; i++) {
			if (mark[i] || v[i].pid == root)
				continue;
			bool desc = root > 0 && v[i].ppid == root;
			if (!desc) {
				struct pstat key = {.pid = v[i].ppid};
				struct pstat *par = bsearch(&key, v, n, sizeof *v, cmp_pid);
				desc = par && mark[par - v];
			}
			if (desc) {
				mark[i] = true;
				changed = true;
			}
		}
	}
}

/* SIGKILL every descendant of `self`; returns how many were signalled. */
static size_t kill_descendants(pid_t self)
{
	size_t n;
	struct pstat *v = scan_procs(&n);
	bool *mark = xmalloc(n * sizeof *mark);
	memset(mark, 0, n * sizeof *mark);
	mark_descendants(v, n, mark, self);
	size_t killed = 0;
	for (size_t i = 0; i < n; i++) {
		if (mark[i]) {
			kill(v[i].pid, SIGKILL);
			killed++;
		}
	}
	free(mark);
	free(v);
	return killed;
}

uid_t proc_uid(pid_t pid, bool *ok);

/* Is PID 1 of our PID namespace sandboxd's keeper (`sbx idle`, itself or
 * under docker-init)?  Only there does a parent of 1 mean "orphan": on any
 * other machine (the unit tests' host) PID 1 adopts daemons by design. */
static bool in_sandbox(void)
{
	char buf[4096];
	ssize_t len = read_small("/proc/1/cmdline", buf, sizeof buf);
	const char *args[64];
	size_t n = 0;
	for (size_t off = 0; len > 0 && off < (size_t)len && n < 64;) {
		args[n++] = buf + off;
		off += strlen(buf + off) + 1;
	}
	if (n < 2 || strcmp(args[n - 1], "idle"))
		return false;
	const char *base = strrchr(args[n - 2], '/');
	return !strcmp(base ? base + 1 : args[n - 2], "sbx");
}

/*
 * Kill the orphans of dead supervisors: processes of our uid whose parent is
 * PID 1, with everything below them, except `sbx` processes (the keeper, if
 * it shares our uid, and a monitor busy cleaning up after its supervisor).
 * Inside a sandbox every command runs under a living supervisor, a subreaper,
 * so its orphans never reach PID 1 while that supervisor lives; one that did
 * escaped a supervisor killed together with its monitor, or survived a
 * `kill -9 -1` it sent itself.  Repeated until a round finds none, so an
 * orphan that forks meanwhile loses.  Returns how many were killed.
 */
size_t reap_orphans(void)
{
	if (getuid() == 0 || !in_sandbox())
		return 0;
	uid_t me = getuid();
	struct stat self_exe;
	if (stat("/proc/self/exe", &self_exe) < 0)
		memset(&self_exe, 0, sizeof self_exe);
	size_t total = 0;
	for (int round = 0; round < 1000; round++) {
		size_t n, killed = 0;
		struct pstat *v = scan_procs(&n);
		bool *mark = xmalloc(n * sizeof *mark);
		memset(mark, 0, n * sizeof *mark);
		for (size_t i = 0; i < n; i++) {
			bool ok;
			char path[64];
			struct stat st;
			if (v[i].ppid != 1 || v[i].pid == 1 || proc_uid(v[i].pid, &ok) != me || !ok)
				continue;
			snprintf(path, sizeof path, "/proc/%ld/exe", (long)v[i].pid);
			if (stat(path, &st) == 0 && st.st_dev == self_exe.st_dev &&
			    st.st_ino == self_exe.st_ino)
				continue;
			mark[i] = true;
		}
		mark_descendants(v, n, mark, 0);
		for (size_t i = 0; i < n; i++) {
			struct pstat now;
			if (mark[i] && read_pstat(v[i].pid, &now) && now.state != 'Z') {
				kill(v[i].pid, SIGKILL);
				killed++;
			}
		}
		free(mark);
		free(v);
		if (!killed)
			break;
		total += killed;
		struct timespec ts = {0, 1000000}; /* 1 ms: let init reap them */
		nanosleep(&ts, NULL);
	}
	return total;
}

/*
 * Kill and reap the whole tree below us.  Termination is decided by
 * waitpid returning ECHILD, which is exact: as a child subreaper, every
 * living descendant is either our child or has a living descendant parent,
 * so "no children" implies "no descendants".  The /proc scan only makes it
 * fast (grandchildren die now instead of after cascading reparenting).  A
 * process signalled with SIGKILL cannot fork any more, so fork bombs lose
 * the race after a few rounds.
 */
/*
 * gVisor (Debian 12's runsc) refuses PR_SET_CHILD_SUBREAPER with EINVAL.  There
 * the tree is still killed by process group and by the /proc scan, and orphans
 * that escaped to PID 1 (double fork + setsid) are reaped after every kill
 * instead of waiting for the next command.
 */
static bool g_subreaper = true;

int become_subreaper(void)
{
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) == 0)
		return 0;
	if (errno != EINVAL)
		return -1;
	g_subreaper = false;
	return 0;
}

/* Reap every child that has ended, until `pid` is among them: true, with its
 * wait status in `status`; false once no ended child is left. */
bool reap_until(pid_t pid, int *status)
{
	pid_t w;
	while ((w = waitpid(-1, status, WNOHANG)) != 0) {
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return false;
		}
		if (w == pid)
			return true;
	}
	return false;
}

static void kill_tree_once(pid_t pgid);

void kill_tree(pid_t pgid)
{
	kill_tree_once(pgid);
	if (!g_subreaper)
		reap_orphans();
}

static void kill_tree_once(pid_t pgid)
{
	pid_t self = getpid();
	for (int iter = 0; iter < 5000; iter++) {
		if (pgid > 0)
			kill(-pgid, SIGKILL);
		kill_descendants(self);
		for (;;) {
			pid_t w = waitpid(-1, NULL, WNOHANG);
			if (w > 0)
				continue;
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0 && errno == ECHILD)
				return;
			break;
		}
		struct timespec ts = {0, 1000000}; /* 1 ms */
		nanosleep(&ts, NULL);
	}
}

uid_t proc_uid(pid_t pid, bool *ok)
{
	char path[64], buf[4096];
	snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
	*ok = false;
	if (read_small(path, buf, sizeof buf) <= 0)
		return 0;
	char *p = strstr(buf, "\nUid:");
	unsigned long uid;
	if (!p || sscanf(p + 5, "%lu", &uid) != 1)
		return 0;
	*ok = true;
	return (uid_t)uid;
}
