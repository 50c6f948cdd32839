/*
 * sbx.h - what the helper's source files share.
 *
 * sbx.c keeps the subcommand table and the pieces every subcommand uses; a
 * larger subcommand lives in a file of its own and is declared here, so the
 * table is the one place that names them all.
 */
#ifndef SBX_H
#define SBX_H

/* dial.c: `sbx dial PORT`, a byte stream to 127.0.0.1:PORT (previews) */
int cmd_dial(int argc, char **argv);

#endif
