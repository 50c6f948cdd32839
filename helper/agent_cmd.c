/*
 * agent_cmd.c - the agent's command records: finding and freeing them, their
 * output rings within the memory budget, and their exits and list as JSON.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "agent.h"
#include "sbx.h"

struct cmd *cmd_by_pid(pid_t pid)
{
	for (struct cmd *c = g_agent.cmds; c; c = c->next)
		if (c->pid == pid && !c->reaped)
			return c;
	return NULL;
}

struct cmd *cmd_by_id(const char *id)
{
	for (struct cmd *c = g_agent.cmds; c; c = c->next)
		if (c->detached && !strcmp(c->id, id))
			return c;
	return NULL;
}

void cmd_close_fds(struct cmd *c)
{
	close_fd(&c->in_fd);
	close_fd(&c->out_fd[1]);
	close_fd(&c->out_fd[2]);
	close_fd(&c->rep_fd);
}

/* Memory the budget counts comes straight from the kernel, not malloc: it
 * is touched only as it fills, and all of it goes back when freed (glibc's
 * heap kept freed rings resident once its threshold had grown past their
 * size, so the agent held more than it counted). */
void *mem_map(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		       -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

void mem_unmap(void *p, size_t n)
{
	if (p)
		munmap(p, n);
}

uint64_t ring_fill(const struct ring *r)
{
	return r->end < r->cap ? r->end : r->cap;
}

/* What a ring holds of the budget: all it holds past its floor. */
uint64_t ring_held(const struct ring *r)
{
	uint64_t fill = ring_fill(r);
	return fill > RING_FLOOR ? fill - RING_FLOOR : 0;
}

void cmd_free(struct cmd *c)
{
	for (struct cmd **pp = &g_agent.cmds; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	cmd_close_fds(c);
	if (c->detached)
		g_agent.ndetached--;
	for (int k = 1; k <= 2; k++) {
		g_agent.held -= ring_held(&c->ring[k]);
		mem_unmap(c->ring[k].buf, c->ring[k].size);
	}
	free(c);
}

/* A non-detached command whose stream is gone: SIGHUP now (the `sbx run`
 * supervisor kills its whole tree on it), SIGKILL after KILL_GRACE_MS.
 *
 * The signal goes before the pipes close: closing stdin is an EOF, and a
 * command that took it for the end of its input would finish what was
 * cancelled (`sbx write` would give a cut-short upload its name).  A signal
 * sent first is already pending when that EOF can be read, so the command's
 * handler runs before it sees the EOF. */
void cmd_abandon(struct cmd *c)
{
	c->owner = NULL;
	if (!c->reaped && c->sup) {
		sup_kill_tree(c); /* what the supervisor did on SIGHUP */
		c->kill_at = now_ms() + KILL_GRACE_MS;
	} else if (!c->reaped) {
		kill(c->pid, SIGHUP);
		kill(c->pid, SIGCONT);
		c->kill_at = now_ms() + KILL_GRACE_MS;
	}
	cmd_close_fds(c);
	if (c->reaped)
		cmd_free(c);
}

uint64_t ring_start(const struct ring *r)
{
	return r->end > r->cap ? r->end - r->cap : 0;
}

/* How many new bytes a ring may take before it is touched: what is left
 * of its floor plus what is left of the budget.  With none it wraps where it
 * is instead (its end is then past its floor).  The bytes it holds stay
 * where they are (offset % cap is the offset itself for every offset below
 * a cap of at least `end`), so readers go on, and the next write overwrites
 * its oldest. */
uint64_t ring_room(struct ring *r)
{
	if (r->end >= r->cap)
		return UINT64_MAX; /* full: writes overwrite, nothing new is touched */
	uint64_t floor = r->end < RING_FLOOR ? RING_FLOOR - r->end : 0;
	uint64_t room = floor + (g_agent.budget > g_agent.held ? g_agent.budget - g_agent.held : 0);
	if (room == 0)
		r->cap = (size_t)r->end;
	else
		guard_poke(); /* the sandbox's memory grows: the guard looks soon */
	return room ? room : UINT64_MAX;
}

void exit_json(struct buf *b, const struct cmd *c)
{
	if (!c->reaped) {
		buf_puts(b, "\"exit_code\":null,\"signal\":null");
	} else if (WIFSIGNALED(c->status)) {
		buf_printf(b, "\"exit_code\":%d,\"signal\":%d", 128 + WTERMSIG(c->status),
			   WTERMSIG(c->status));
	} else {
		buf_printf(b, "\"exit_code\":%d,\"signal\":null", WEXITSTATUS(c->status));
	}
}

void offsets_json(struct buf *b, uint64_t o1, uint64_t o2)
{
	buf_printf(b, "{\"1\":%llu,\"2\":%llu}", (unsigned long long)o1, (unsigned long long)o2);
}

void processes_json(struct buf *b)
{
	buf_puts(b, "[");
	bool first = true;
	for (struct cmd *c = g_agent.cmds; c; c = c->next) {
		if (!c->detached || !c->started)
			continue;
		buf_puts(b, first ? "{\"id\":" : ",{\"id\":");
		first = false;
		buf_json_str(b, c->id, strlen(c->id));
		buf_printf(b, ",\"pid\":%ld,\"running\":%s,", (long)c->pid,
			   c->reaped ? "false" : "true");
		exit_json(b, c);
		/* Ages, not clock times: the server's clock may not be the sandbox's. */
		uint64_t now = now_ms();
		buf_printf(b, ",\"age_ms\":%llu", (unsigned long long)(now - c->started_ms));
		if (c->reaped)
			buf_printf(b, ",\"ran_ms\":%llu",
				   (unsigned long long)(c->ended_ms - c->started_ms));
		if (c->timeout_ms >= 0)
			buf_printf(b, ",\"timeout_ms\":%lld", (long long)c->timeout_ms);
		buf_puts(b, ",\"start\":");
		offsets_json(b, ring_start(&c->ring[1]), ring_start(&c->ring[2]));
		buf_puts(b, ",\"end\":");
		offsets_json(b, c->ring[1].end, c->ring[2].end);
		buf_puts(b, "}");
	}
	buf_puts(b, "]");
}
