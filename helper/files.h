/*
 * files.h - stat records on stdout (stat.c), for the file subcommands that
 * print them: stat, list, write, mkdir, move, read.
 */
#ifndef SBX_FILES_H
#define SBX_FILES_H

#include "sbx.h"

/* ---- stat.c: stat records on stdout ---- */

/* What a subcommand prints, written at once by out_flush(). */
extern struct buf g_out;
void out_flush(void);
struct stat;
void stat_record(struct buf *b, const char *rel, const char *name, int dirfd,
		 const char *entry, const struct stat *st);
void print_stat(const char *norm, int dirfd, const char *name);

#endif
