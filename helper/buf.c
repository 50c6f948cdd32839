/*
 * buf.c - low-level I/O, growable buffers and JSON strings, for every subcommand.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sbx.h"

int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n > 0) {
		ssize_t w = write(fd, c, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

ssize_t read_retry(int fd, void *p, size_t n)
{
	ssize_t r;
	do
		r = read(fd, p, n);
	while (r < 0 && errno == EINTR);
	return r;
}

/* Out of memory: nothing sane left to do, but keep the protocol intact. */
void oom(void)
{
	static const char msg[] = "{\"error\":\"EIO\",\"message\":\"out of memory\"}\n";
	(void)!write(2, msg, sizeof msg - 1);
	_exit(1);
}

void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p)
		oom();
	return p;
}

char *xstrdup(const char *s)
{
	char *p = strdup(s);
	if (!p)
		oom();
	return p;
}

/* Room for `need` bytes at *p, which holds *cap: the capacity doubled (from
 * `first` when there is none yet) until they fit.  Out of memory ends the
 * process. */
void grow_bytes(char **p, size_t *cap, size_t need, size_t first)
{
	if (need <= *cap)
		return;
	size_t nc = *cap ? *cap : first;
	while (nc < need)
		nc *= 2;
	char *np = realloc(*p, nc);
	if (!np)
		oom();
	*p = np;
	*cap = nc;
}

void buf_add(struct buf *b, const char *s, size_t n)
{
	grow_bytes(&b->p, &b->cap, b->len + n + 1, 256);
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

void buf_puts(struct buf *b, const char *s)
{
	buf_add(b, s, strlen(s));
}

void buf_printf(struct buf *b, const char *fmt, ...)
{
	char tmp[128];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	/* Only used for short numeric fragments; truncation would be a bug. */
	if (n < 0 || (size_t)n >= sizeof tmp)
		oom();
	buf_add(b, tmp, (size_t)n);
}

/* Length of the well-formed UTF-8 sequence at s, or 0 if it is invalid
 * (overlong forms, surrogates and code points above U+10FFFF included). */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	size_t len;
	uint32_t cp;
	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xC2 && s[0] <= 0xDF) {
		len = 2;
		cp = s[0] & 0x1F;
	} else if ((s[0] & 0xF0) == 0xE0) {
		len = 3;
		cp = s[0] & 0x0F;
	} else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
		len = 4;
		cp = s[0] & 0x07;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3F);
	}
	if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)))
		return 0;
	if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))
		return 0;
	return len;
}

/* File names are arbitrary bytes; JSON must be valid UTF-8, so each bad
 * byte becomes U+FFFD (lossy, but never produces unparsable output). */
void buf_json_str(struct buf *b, const char *str, size_t n)
{
	const unsigned char *s = (const unsigned char *)str;
	buf_add(b, "\"", 1);
	for (size_t i = 0; i < n;) {
		unsigned char c = s[i];
		if (c == '"' || c == '\\') {
			char esc[2] = {'\\', (char)c};
			buf_add(b, esc, 2);
			i++;
		} else if (c < 0x20) {
			buf_printf(b, "\\u%04x", c);
			i++;
		} else {
			size_t l = utf8_len(s + i, n - i);
			if (l == 0) {
				buf_add(b, "\xEF\xBF\xBD", 3);
				i++;
			} else {
				buf_add(b, (const char *)s + i, l);
				i += l;
			}
		}
	}
	buf_add(b, "\"", 1);
}
