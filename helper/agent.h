/*
 * agent.h - what the agent's files (agent.c, agent_json.c) share.
 */
#ifndef SBX_AGENT_H
#define SBX_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A parsed JSON value.  Every node and string of one document lives in one
 * arena (struct jdoc), freed at once; strings are NUL-terminated and never
 * contain a NUL (a \u0000 in the input fails the parse: C strings cannot hold
 * it, and argv/env/ids must not). */
enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jval {
	enum jtype type;
	bool b;
	double num;
	bool is_int; /* num is an integer within int64 */
	int64_t i;
	const char *s;	       /* J_STR */
	const char *key;       /* member name, when inside an object */
	struct jval *child;    /* first element / member */
	struct jval *next;     /* next sibling */
	size_t n;	       /* element / member count */
};

struct jdoc {
	struct jval *nodes;
	size_t nused, ncap;
	char *strs;
	size_t sused, scap;
	struct jval *root;
};

/* Parses exactly one JSON value (whitespace around allowed) of `len` bytes.
 * Depth at most 32.  Returns 0, or -1 on any syntax error (doc freed). */
int json_parse(struct jdoc *doc, const char *text, size_t len);
void json_free(struct jdoc *doc);
/* Member `key` of object `o`, or NULL (also when `o` is not an object). */
const struct jval *json_get(const struct jval *o, const char *key);

#endif
