/*
 * agent_json.c - a small, bounded JSON reader for the agent's requests.
 *
 * The agent reads JSON only from frames of at most 64 KiB, so a document
 * never has more nodes or string bytes than its length: both arenas are
 * sized from it up front and nothing grows while parsing.  Recursion depth is
 * bounded; any error fails the whole document.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "sbx.h"

#define JSON_MAX_DEPTH 32

struct jp {
	const char *p, *end;
	struct jdoc *doc;
};

static void skip_ws(struct jp *j)
{
	while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
		j->p++;
}

static struct jval *new_node(struct jp *j, enum jtype t)
{
	if (j->doc->nused >= j->doc->ncap)
		return NULL;
	struct jval *v = &j->doc->nodes[j->doc->nused++];
	memset(v, 0, sizeof *v);
	v->type = t;
	return v;
}

static int hex4(const char *p, unsigned *out)
{
	unsigned v = 0;
	for (int i = 0; i < 4; i++) {
		char c = p[i];
		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v |= (unsigned)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v |= (unsigned)(c - 'A' + 10);
		else
			return -1;
	}
	*out = v;
	return 0;
}

/* Decoded strings are never longer than their source, so the arena (as
 * large as the document) always has room. */
static const char *parse_string(struct jp *j)
{
	if (j->p >= j->end || *j->p != '"')
		return NULL;
	j->p++;
	struct jdoc *d = j->doc;
	char *out = d->strs + d->sused, *o = out;
	while (j->p < j->end) {
		unsigned char c = (unsigned char)*j->p++;
		if (c == '"') {
			*o++ = '\0';
			d->sused += (size_t)(o - out);
			return out;
		}
		if (c < 0x20)
			return NULL;
		if (c != '\\') {
			*o++ = (char)c;
			continue;
		}
		if (j->p >= j->end)
			return NULL;
		char e = *j->p++;
		switch (e) {
		case '"': *o++ = '"'; break;
		case '\\': *o++ = '\\'; break;
		case '/': *o++ = '/'; break;
		case 'b': *o++ = '\b'; break;
		case 'f': *o++ = '\f'; break;
		case 'n': *o++ = '\n'; break;
		case 'r': *o++ = '\r'; break;
		case 't': *o++ = '\t'; break;
		case 'u': {
			unsigned cp, lo;
			if (j->end - j->p < 4 || hex4(j->p, &cp) < 0)
				return NULL;
			j->p += 4;
			if (cp >= 0xD800 && cp <= 0xDBFF) {
				if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' ||
				    hex4(j->p + 2, &lo) < 0 || lo < 0xDC00 || lo > 0xDFFF)
					return NULL;
				j->p += 6;
				cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
			} else if (cp >= 0xDC00 && cp <= 0xDFFF) {
				return NULL;
			}
			if (cp == 0)
				return NULL;
			/* \uXXXX is 6 source bytes, at most 3 out (4 out of 12 for a pair) */
			if (cp < 0x80) {
				*o++ = (char)cp;
			} else if (cp < 0x800) {
				*o++ = (char)(0xC0 | (cp >> 6));
				*o++ = (char)(0x80 | (cp & 0x3F));
			} else if (cp < 0x10000) {
				*o++ = (char)(0xE0 | (cp >> 12));
				*o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
				*o++ = (char)(0x80 | (cp & 0x3F));
			} else {
				*o++ = (char)(0xF0 | (cp >> 18));
				*o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
				*o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
				*o++ = (char)(0x80 | (cp & 0x3F));
			}
			break;
		}
		default:
			return NULL;
		}
	}
	return NULL;
}

static struct jval *parse_value(struct jp *j, int depth);

static struct jval *parse_number(struct jp *j)
{
	const char *s = j->p;
	if (j->p < j->end && *j->p == '-')
		j->p++;
	if (j->p >= j->end || *j->p < '0' || *j->p > '9')
		return NULL;
	if (*j->p == '0')
		j->p++;
	else
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	if (j->p < j->end && *j->p == '.') {
		j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return NULL;
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
		j->p++;
		if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
			j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return NULL;
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	char tmp[64];
	size_t n = (size_t)(j->p - s);
	struct jval *v = new_node(j, J_NUM);
	if (!v)
		return NULL;
	if (n >= sizeof tmp) {
		/* a long literal: only its sign and magnitude class matter */
		v->num = (*s == '-') ? -HUGE_VAL : HUGE_VAL;
		return v;
	}
	memcpy(tmp, s, n);
	tmp[n] = '\0';
	v->num = strtod(tmp, NULL);
	if (v->num >= -9007199254740992.0 && v->num <= 9007199254740992.0 && v->num == floor(v->num)) {
		v->is_int = true;
		v->i = (int64_t)v->num;
	}
	return v;
}

static int lit(struct jp *j, const char *w)
{
	size_t n = strlen(w);
	if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n))
		return -1;
	j->p += n;
	return 0;
}

static struct jval *parse_value(struct jp *j, int depth)
{
	if (depth > JSON_MAX_DEPTH)
		return NULL;
	skip_ws(j);
	if (j->p >= j->end)
		return NULL;
	char c = *j->p;
	struct jval *v;
	if (c == '{' || c == '[') {
		bool obj = c == '{';
		v = new_node(j, obj ? J_OBJ : J_ARR);
		if (!v)
			return NULL;
		j->p++;
		skip_ws(j);
		struct jval **tail = &v->child;
		if (j->p < j->end && *j->p == (obj ? '}' : ']')) {
			j->p++;
			return v;
		}
		for (;;) {
			const char *key = NULL;
			if (obj) {
				skip_ws(j);
				key = parse_string(j);
				if (!key)
					return NULL;
				skip_ws(j);
				if (j->p >= j->end || *j->p != ':')
					return NULL;
				j->p++;
			}
			struct jval *e = parse_value(j, depth + 1);
			if (!e)
				return NULL;
			e->key = key;
			*tail = e;
			tail = &e->next;
			v->n++;
			skip_ws(j);
			if (j->p >= j->end)
				return NULL;
			if (*j->p == ',') {
				j->p++;
				continue;
			}
			if (*j->p == (obj ? '}' : ']')) {
				j->p++;
				return v;
			}
			return NULL;
		}
	}
	if (c == '"') {
		const char *s = parse_string(j);
		if (!s)
			return NULL;
		v = new_node(j, J_STR);
		if (v)
			v->s = s;
		return v;
	}
	if (c == 't' || c == 'f') {
		if (lit(j, c == 't' ? "true" : "false") < 0)
			return NULL;
		v = new_node(j, J_BOOL);
		if (v)
			v->b = c == 't';
		return v;
	}
	if (c == 'n')
		return lit(j, "null") < 0 ? NULL : new_node(j, J_NULL);
	return parse_number(j);
}

int json_parse(struct jdoc *doc, const char *text, size_t len)
{
	memset(doc, 0, sizeof *doc);
	/* every node takes at least one source byte */
	doc->ncap = len + 1;
	doc->nodes = xmalloc(doc->ncap * sizeof *doc->nodes);
	doc->scap = len + 1;
	doc->strs = xmalloc(doc->scap);
	struct jp j = {text, text + len, doc};
	doc->root = parse_value(&j, 0);
	skip_ws(&j);
	if (!doc->root || j.p != j.end) {
		json_free(doc);
		return -1;
	}
	return 0;
}

void json_free(struct jdoc *doc)
{
	free(doc->nodes);
	free(doc->strs);
	memset(doc, 0, sizeof *doc);
}

const struct jval *json_get(const struct jval *o, const char *key)
{
	if (!o || o->type != J_OBJ)
		return NULL;
	const struct jval *found = NULL;
	for (const struct jval *m = o->child; m; m = m->next)
		if (!strcmp(m->key, key))
			found = m; /* the last one wins, as in Python's json */
	return found;
}
