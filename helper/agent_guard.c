/*
 * agent_guard.c - the agent's own OOM killer and pids count, for a sandbox
 * whose kernel has neither that ends a command alone (gVisor: SECURITY.md,
 * "Memory of the agent").
 *
 * Under runc the memory cgroup's OOM killer takes a command (OOM_SCORE_ADJ)
 * and the pids cgroup refuses a fork.  Under gVisor (runsc 0.0~20221219) the
 * host's OOM killer sees only the Sentry, so a full cgroup ends the sandbox
 * whole, agent and workspace with it; and the host's pids cgroup counts the
 * Sentry's threads (about 8 per task), not the sandbox's processes.  The
 * server then sends HELLO's "guard": the sandbox's memory limit, what the
 * Sentry holds of it outside the sandbox's own view (a base and a share per
 * task, measured), and the session's pids.  The agent estimates what the host
 * charges, the sandbox's own use (the Sentry's /proc/meminfo: MemTotal is the
 * limit, MemTotal - MemFree everything the sandbox's processes, tmpfs and the
 * agent hold) plus the Sentry's share for the tasks it counts, and:
 *   - past the kill line (the limit less 1/16, at least GUARD_MARGIN) kills the largest
 *     session of processes (by resident memory; every command is a session
 *     leader), never itself: the command is reported as ended by SIGKILL, as
 *     a kernel OOM kill under runc.  As the kernel's OOM reaper, it takes no
 *     second victim before the first is gone and GUARD_SETTLE_MS passed;
 *   - refuses a new command ("LIMIT") when the tasks it counts are at the
 *     pids budget, or the estimate is past the kill line still.
 * It checks at every start, as a ring grows (at most every GUARD_POKE_MS)
 * and while any command runs every GUARD_MS, sooner the nearer the line.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "proc.h"
#include "sbx.h"

struct gproc {
	pid_t pid, sid;
	uint64_t rss, tasks;
};

static uint64_t field_u(const struct jval *o, const char *key, uint64_t max)
{
	const struct jval *v = json_get(o, key);
	if (!v || v->type != J_NUM || !v->is_int || v->i < 0 || (uint64_t)v->i > max)
		return 0;
	return (uint64_t)v->i;
}

void guard_config(const struct jval *g)
{
	struct guard *gd = &g_agent.guard;
	if (!g || g->type != J_OBJ) {
		gd->on = false; /* absent: no guard (runc, whose kernel does it) */
		return;
	}
	gd->memory = field_u(g, "memory", MAX_RING_BUDGET);
	gd->base = field_u(g, "sentry", MAX_RING_BUDGET);
	gd->per_task = field_u(g, "task", 1ull << 30);
	gd->pids = field_u(g, "pids", 1u << 22);
	const struct jval *mi = json_get(g, "meminfo");
	snprintf(gd->meminfo, sizeof gd->meminfo, "%s",
		 mi && mi->type == J_STR && mi->s[0] == '/' ? mi->s : "/proc/meminfo");
	gd->on = gd->memory > 0 || gd->pids > 0;
	/* The victim being ended and the most tasks counted are the sandbox's
	 * (its Sentry's), not the epoch's: a server's new HELLO keeps them. */
	gd->next_ms = 0;
}

/* The sandbox's own use of its memory, from its kernel's meminfo: MemTotal -
 * MemFree (the Sentry reports its limit as MemTotal).  0: unknown. */
static uint64_t meminfo_used(void)
{
	char buf[4096];
	if (read_small(g_agent.guard.meminfo, buf, sizeof buf) <= 0)
		return 0;
	unsigned long long total = 0, free_ = 0;
	char *p = strstr(buf, "MemTotal:"), *q = strstr(buf, "MemFree:");
	if (!p || !q || sscanf(p, "MemTotal: %llu", &total) != 1 ||
	    sscanf(q, "MemFree: %llu", &free_) != 1 || free_ > total)
		return 0;
	return (total - free_) * 1024u;
}

static struct gproc gproc_of(const struct pstat *ps)
{
	struct gproc gp = {
		.pid = ps->pid,
		.sid = ps->sid,
		.tasks = ps->state == 'Z' || ps->threads < 1 ? 1 : (uint64_t)ps->threads,
		.rss = ps->rss > 0 ? (uint64_t)ps->rss * 4096u : 0,
	};
	return gp;
}

/* Whether a process is the sandbox's and not the agent: as PID 1 every
 * other process is; outside a PID namespace (tests) only the sessions of
 * its own commands. */
static bool ours(const struct gproc *gp)
{
	if (gp->pid == g_agent.self)
		return false;
	if (g_agent.self == 1)
		return true;
	struct cmd *c = cmd_by_pid(gp->sid);
	return c && !c->reaped;
}

/* Every process of the sandbox but the agent: how many tasks, and the
 * processes in `*out` (caller frees). */
static size_t scan(struct gproc **out, uint64_t *tasks)
{
	size_t all, n = 0;
	struct pstat *ps = scan_pstats(&all);
	struct gproc *v = xmalloc((all ? all : 1) * sizeof *v);
	*tasks = 0;
	for (size_t i = 0; i < all; i++) {
		if (!ps[i].counted)
			continue;
		v[n] = gproc_of(&ps[i]);
		if (ours(&v[n])) {
			*tasks += v[n].tasks;
			n++;
		}
	}
	free(ps);
	*out = v;
	return n;
}

/* What the host charges: the sandbox's own use, and the Sentry's for the most
 * tasks it has run at once (its host threads and their memory stay once made:
 * measured, the charge does not go back down when tasks end). */
uint64_t guard_estimate(uint64_t used, uint64_t tasks)
{
	struct guard *gd = &g_agent.guard;
	uint64_t most = tasks > gd->peak ? tasks : gd->peak;
	return used + gd->base + most * gd->per_task;
}

uint64_t guard_line(void)
{
	uint64_t m = g_agent.guard.memory, margin = m / 16;
	if (margin < GUARD_MARGIN)
		margin = GUARD_MARGIN;
	return m > margin ? m - margin : 0;
}

/* SIGKILL every process of session `sid` (and its process group). */
static void kill_session(const struct gproc *v, size_t n, pid_t sid)
{
	kill(-sid, SIGKILL);
	for (size_t i = 0; i < n; i++)
		if (v[i].sid == sid)
			kill(v[i].pid, SIGKILL);
}

/* Scan, and past the kill line end the largest session (or the one being
 * ended still, whose memory is not back yet).  Whether the estimate is past
 * the line after it; the tasks counted in `*tasks`. */
static bool check(uint64_t used, uint64_t *tasks)
{
	struct guard *gd = &g_agent.guard;
	struct gproc *v;
	size_t n = scan(&v, tasks);
	gd->tasks = *tasks;
	if (*tasks > gd->peak)
		gd->peak = *tasks;
	bool over = gd->memory && used && guard_estimate(used, *tasks) > guard_line();
	if (over) {
		bool pending = false;
		for (size_t i = 0; i < n && gd->victim; i++)
			pending = pending || v[i].sid == gd->victim;
		uint64_t now = now_ms();
		if (pending) {
			kill_session(v, n, gd->victim);
		} else if (gd->victim) {
			/* Gone: its memory is back by the next look, or another goes. */
			gd->victim = 0;
			gd->settle_ms = now + GUARD_SETTLE_MS;
		} else if (now >= gd->settle_ms) {
			/* sessions by resident memory: the largest goes */
			pid_t best = 0;
			uint64_t most = 0;
			for (size_t i = 0; i < n; i++) {
				if (v[i].sid == g_agent.self || v[i].sid <= 0)
					continue;
				uint64_t sum = 0;
				for (size_t j = 0; j < n; j++)
					if (v[j].sid == v[i].sid)
						sum += v[j].rss + 1; /* +1: a session of zombies still counts */
				if (!best || sum > most) {
					best = v[i].sid;
					most = sum;
				}
			}
			if (best) {
				logf_("agent: guard: sandbox at %llu of %llu bytes (%llu tasks): "
				      "killing session %ld (%llu bytes resident)",
				      (unsigned long long)guard_estimate(used, *tasks),
				      (unsigned long long)gd->memory, (unsigned long long)*tasks,
				      (long)best, (unsigned long long)most);
				gd->victim = best;
				gd->kills++;
				kill_session(v, n, best);
			}
		}
	}
	free(v);
	return over;
}

static bool running(void)
{
	for (struct cmd *c = g_agent.cmds; c; c = c->next)
		if (!c->reaped)
			return true;
	return false;
}

void guard_tick(uint64_t now)
{
	struct guard *gd = &g_agent.guard;
	if (!gd->on || !gd->memory || now < gd->next_ms)
		return;
	gd->next_ms = now + GUARD_MS;
	if (!running())
		return;
	uint64_t used = meminfo_used(), tasks = gd->tasks, line = guard_line();
	/* The nearer the line, the sooner the next look: as long as the room
	 * left would take at GUARD_RATE (bytes per ms), at least GUARD_NEAR_MS
	 * apart.  Measured: a command reading /dev/zero into its memory grows
	 * by 0.4 to 0.6 MiB per ms under gVisor (and then in steps no look can
	 * come between: SECURITY.md). */
	uint64_t est = guard_estimate(used, tasks);
	if (used && est < line) {
		uint64_t ms = (line - est) / GUARD_RATE;
		gd->next_ms = now + (ms < GUARD_NEAR_MS ? GUARD_NEAR_MS : ms > GUARD_MS ? GUARD_MS : ms);
	} else if (used) {
		gd->next_ms = now + GUARD_NEAR_MS;
	}
	/* Between scans the tasks last counted stand: a scan per check would read
	 * every process's stat every GUARD_MS. */
	if (used && (guard_estimate(used, tasks) > line || gd->victim ||
		     now >= gd->next_scan_ms)) {
		gd->next_scan_ms = now + GUARD_SCAN_MS;
		if (!check(used, &tasks))
			gd->victim = 0;
	}
}

void guard_poke(void)
{
	struct guard *gd = &g_agent.guard;
	if (!gd->on || !gd->memory)
		return;
	uint64_t now = now_ms();
	if (now < gd->last_poke_ms + GUARD_POKE_MS)
		return;
	gd->last_poke_ms = now;
	gd->next_ms = 0; /* the next turn of the loop checks */
}

uint64_t guard_next(uint64_t next)
{
	struct guard *gd = &g_agent.guard;
	if (gd->on && gd->memory && running() && gd->next_ms < next)
		next = gd->next_ms;
	return next;
}

bool guard_admit(char *why, size_t len)
{
	struct guard *gd = &g_agent.guard;
	if (!gd->on)
		return true;
	uint64_t used = gd->memory ? meminfo_used() : 0, tasks;
	bool over = check(used, &tasks);
	if (!over)
		gd->victim = 0;
	if (gd->pids && tasks >= gd->pids) {
		snprintf(why, len,
			 "the sandbox's process limit is reached: %llu of %llu processes run; end "
			 "some or wait for them to exit",
			 (unsigned long long)tasks, (unsigned long long)gd->pids);
		return false;
	}
	if (over) {
		snprintf(why, len,
			 "the sandbox's memory limit is reached: about %llu MiB of %llu MiB in use "
			 "(commands are ended, the largest first); retry once memory is free",
			 (unsigned long long)(guard_estimate(used, tasks) >> 20),
			 (unsigned long long)(gd->memory >> 20));
		return false;
	}
	return true;
}
