/*
 * agent_attach.c - detached processes: attach (replaying a ring), the processes
 * list, and forget.
 */
#define _GNU_SOURCE

#include "agent.h"
#include "sbx.h"

static uint64_t offset_of(const struct jval *o, const char *k)
{
	const struct jval *v = json_get(o, k);
	return v && v->type == J_NUM && v->is_int && v->i > 0 ? (uint64_t)v->i : 0;
}

void open_attach(uint32_t id, const struct jval *req)
{
	const struct jval *idv = json_get(req, "id"), *offs = json_get(req, "offsets");
	struct cmd *c = idv && idv->type == J_STR ? cmd_by_id(idv->s) : NULL;
	if (!c || !c->started) {
		out_error(F_RESET, id, "NOT_FOUND", "no detached process with that id");
		return;
	}
	struct stream *s = stream_new(id, K_ATTACH);
	s->cmd = c;
	s->established = true;
	for (int k = 1; k <= 2; k++) {
		uint64_t want = offset_of(offs, k == 1 ? "1" : "2");
		uint64_t start = ring_start(&c->ring[k]);
		s->cursor[k] = want < start ? start : want > c->ring[k].end ? c->ring[k].end : want;
	}
	struct buf b = {0};
	buf_puts(&b, "{\"start\":");
	offsets_json(&b, ring_start(&c->ring[1]), ring_start(&c->ring[2]));
	buf_puts(&b, ",\"end\":");
	offsets_json(&b, c->ring[1].end, c->ring[2].end);
	buf_puts(&b, "}");
	out_json(F_OPEN_OK, id, &b);
}

/* Send a detached process's output to a stream attached to it. Returns
 * false when the stream was reset (and freed): the caller must not touch it. */
bool attach_pump(struct stream *s)
{
	struct cmd *c = s->cmd;
	for (int k = 1; k <= 2; k++) {
		struct ring *r = &c->ring[k];
		while (s->cursor[k] < r->end && s->send_credit > 0 && out_room()) {
			if (s->cursor[k] < ring_start(r)) {
				stream_reset(s, "GAP", "output overwritten before it was sent; attach again");
				return false;
			}
			size_t pos = (size_t)(s->cursor[k] % r->cap);
			uint64_t n = r->end - s->cursor[k];
			if (n > r->cap - pos)
				n = r->cap - pos;
			if (n > CHUNK)
				n = CHUNK;
			if ((int64_t)n > s->send_credit)
				n = (uint64_t)s->send_credit;
			unsigned char fd = (unsigned char)k;
			out_frame2(F_DATA, s->id, &fd, 1, r->buf + pos, (size_t)n);
			s->cursor[k] += n;
			s->send_credit -= (int64_t)n;
		}
	}
	return true;
}

void open_processes(uint32_t id)
{
	struct buf b = {0};
	buf_puts(&b, "{\"processes\":");
	processes_json(&b);
	buf_puts(&b, "}");
	out_json(F_OPEN_OK, id, &b);
	out_frame(F_CLOSE, id, NULL, 0);
}

void open_forget(uint32_t id, const struct jval *req)
{
	const struct jval *idv = json_get(req, "id");
	struct cmd *c = idv && idv->type == J_STR ? cmd_by_id(idv->s) : NULL;
	if (!c) {
		out_error(F_RESET, id, "NOT_FOUND", "no detached process with that id");
		return;
	}
	if (!c->reaped) {
		out_error(F_RESET, id, "RUNNING", "the process is still running");
		return;
	}
	/* Readers still attached are told (a stream dropped without a word
	 * would leave its reader waiting for output that never comes). */
	for (struct stream *s = g_agent.streams, *n; s; s = n) {
		n = s->next;
		if (s->cmd == c)
			stream_reset(s, "GONE", "the detached process was forgotten");
	}
	cmd_free(c);
	out_frame(F_OPEN_OK, id, "{}", 2);
	out_frame(F_CLOSE, id, NULL, 0);
}
