/*
 * agent.h - what the files of `sbx agent` share: its state (struct agent),
 * the channel's constants and records, and each file's functions.  agent.c
 * runs the loop; agent_in.c and agent_out.c are the channel's two directions;
 * agent_sock.c the channel over a Unix socket;
 * agent_stream.c, agent_attach.c and agent_net.c the streams; agent_cmd.c,
 * agent_exec.c and agent_reap.c the commands; agent_json.c the requests' JSON.
 */
#ifndef SBX_AGENT_H
#define SBX_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "sbx.h"

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


/* ---- the channel and its state (agent.c, agent_exec.c) ---- */

#define MAX_PAYLOAD 65536u
#define HDR_LEN 9u
#define SYNC_LEN 16u
#define IN_CAP (2u * (HDR_LEN + MAX_PAYLOAD))
/* Past this much unsent output the agent reads nothing more (channel or
 * commands) until the server has taken some. */
#define OUT_HIGH (256u * 1024u)
/* One input frame makes at most a few frames of output; room for them. */
#define OUT_CAP (OUT_HIGH + 4u * (HDR_LEN + MAX_PAYLOAD))
#define CHUNK (MAX_PAYLOAD - 1u)
/* A command's output that flows without a pause (its previous read was
 * under FLOW_US ago, or one read found FLOW_BYTES) is read again only
 * HOLD_US later, so what it writes
 * meanwhile leaves in one frame instead of one per write (4 KiB each for
 * many tools): far fewer frames, engine messages and gRPC messages for a
 * stream, and a latency of HOLD_US only for output that is already
 * streaming.  Output after a pause (an echo, a prompt) is read at once. */
#define FLOW_US 100u
#define FLOW_BYTES 16384u
#define HOLD_US 500u
/* A command's stdout pipe (64 KiB by default): what it may write during a
 * hold without blocking.  Best effort (the host's per-user pipe limits). */
#define CMD_PIPE (256u * 1024u)
#define MAX_STREAMS 1024
#define MAX_DETACHED 128
#define MAX_ID 64
#define DEFAULT_WINDOW 262144u
#define MIN_WINDOW 1024u
#define MAX_WINDOW (16u * 1024u * 1024u)
#define DEFAULT_KEEPALIVE_MS 15000
#define DEFAULT_RING (1u << 20)
#define MAX_RING (64u << 20)
/* The agent's memory budget (docs/agent.md, "Memory"): what its rings and
 * its streams' input buffers may hold together.  The server sends its share
 * of the sandbox's memory (HELLO's and each detached exec's "budget"); this
 * until it has.  Every byte is reserved before it is touched: a ring grows
 * only while the reservation fits, else it stops growing and wraps where it
 * is (its oldest output is overwritten, a reader from there is told GAP);
 * an input buffer that would pass it ends its stream (RESET MEMORY).  So the
 * memory cgroup's OOM killer is never pressed by what the agent holds, and
 * it takes a command first anyway (OOM_SCORE_ADJ). */
#define DEFAULT_RING_BUDGET (128u << 20)
#define MAX_RING_BUDGET (1ull << 40)
/* Each ring's first RING_FLOOR bytes come outside the budget, so a process
 * started at the budget still keeps its newest output: at most
 * MAX_DETACHED * 2 * RING_FLOOR (16 MiB) in all, a bound of its own. */
#define RING_FLOOR (64u << 10)
/* Every command's oom_score_adj: the memory cgroup's OOM killer then scores
 * any command above the agent (0), whose death would end the sandbox: a
 * command's points are its memory plus the whole limit's, more than all the
 * agent can hold within the limit. */
#define OOM_SCORE_ADJ "1000"
/* The guard (agent_guard.c, gVisor only): how often it reads meminfo while
 * commands run, how often it reads every process's stat besides (the tasks
 * it counts), at least when near the line, at which growth (bytes per ms) a
 * look is due before the line is reached; how often a growing ring asks for a check
 * at most, the least margin below the memory limit where it kills (else 1/16
 * of it), and how
 * long after a victim is gone before another may go. */
#define GUARD_MS 100
#define GUARD_NEAR_MS 5
#define GUARD_RATE (1u << 20)
#define GUARD_SCAN_MS 500
#define GUARD_POKE_MS 10
#define GUARD_MARGIN (8u << 20)
#define GUARD_SETTLE_MS 250
#define KILL_GRACE_MS 1000
#define SWEEP_MS 1000
/* A tty command's output is over once its terminal reads empty this long
 * after the command was reaped: gVisor's pty master never says EIO when the
 * last holder of the terminal is gone (measured: the command's EXIT never
 * came), Linux's does, normally well within this. */
#define TTY_DONE_MS 100
/* How many supervised commands' deaths by a signal `sbx status` can still ask about. */
#define SIGREC 64
/* A wait that overran by more than this was a memory suspend (or a host that
 * stalled the sandbox as long): a supervised command's deadline does not count it. */
#define SUSPEND_JUMP_MS 500

enum {
	F_HELLO = 0x01, F_HELLO_OK, F_PING, F_PONG, F_GOAWAY,
	F_OPEN = 0x10, F_OPEN_OK, F_DATA, F_EOF, F_WINDOW, F_EXIT, F_RESET,
	F_SIGNAL, F_RESIZE, F_CLOSE,
};

struct ring {
	char *buf;	/* mapped with `size` (mem_map), touched only as it fills */
	size_t size;
	size_t cap;	/* where it wraps: `size`, or less once the budget stopped it */
	uint64_t end; /* bytes ever written; the ring holds [end-cap, end) */
};

struct cmd {
	struct cmd *next;
	pid_t pid;	    /* the process the agent started (group and session leader) */
	bool reaped;
	int status;
	int rep_fd;	    /* exec report pipe until exec happened or failed */
	bool started;	    /* exec happened (OPEN_OK sent) */
	bool tty;
	int in_fd;	    /* stdin pipe or pty master (dup), -1 when closed */
	int out_fd[3];	    /* [1], [2]: pipes; a tty has only [1] */
	struct stream *owner; /* the exec stream of a non-detached command */
	uint64_t kill_at;   /* SIGKILL due (ms), once its stream is gone */
	uint64_t tty_done_at; /* reaped tty: output over at its first empty read after */
	bool detached;
	/* Monotonic ms: when it started and ended, and the server's timeout for it
	 * (-1: none given), so that a server started again keeps its deadline. */
	uint64_t started_ms, ended_ms;
	int64_t timeout_ms;
	char id[MAX_ID + 1];
	struct ring ring[3];
	uint64_t last_read_us[3]; /* when out_fd[k] last gave data */
	uint64_t hold_until_us[3]; /* out_fd[k] is not polled before this */
	/* Run by the agent as the `sbx run` supervisor (agent_run.c): its --id,
	 * its backstop deadline (monotonic ms, 0: none), whether the agent killed
	 * its tree (the exit is then 137, as the supervisor's), and whether its
	 * EXIT waits for the rest of its tree to be gone. */
	bool sup;
	bool killed;
	bool tree_wait;
	uint64_t deadline_ms;
	char token[MAX_ID + 1];
};

/* What an `sbx run` request asked of the supervisor the agent stands in for
 * (agent_run.c): the command, its environment, --cwd, --tty, --timeout-ms. */
struct sup {
	char **argv;	/* the command, within the request's argv */
	char **envp;	/* its environment (owned) */
	const char *token;
	const char *cwd;
	uint64_t timeout_ms;
	bool clean;	/* --clean-env */
	bool tty;
	unsigned short rows, cols;
	int root_err;	/* why the root has no realpath (realroot NULL) */
};

enum kind { K_EXEC, K_ATTACH, K_DIAL, K_EGRESS };

struct stream {
	struct stream *next;
	uint32_t id;
	enum kind kind;
	bool established;   /* OPEN_OK sent (or, for egress, received) */
	struct cmd *cmd;    /* exec, attach */
	int sock;	    /* dial, egress */
	bool connecting;
	/* server -> agent bytes not yet written to the process or socket */
	char *ib;	    /* mapped with ib_size (mem_map) when bytes must wait */
	size_t ib_len, ib_size;
	size_t ib_held;	    /* bytes of the budget it holds (its touched pages) */
	uint32_t recv_credit, consumed;
	bool in_eof, in_eof_done;
	/* agent -> server */
	int64_t send_credit;
	bool sock_eof;	    /* the socket's peer is done sending */
	uint64_t cursor[3]; /* attach: next offset to send per fd */
};

/*
 * The agent's state, all of it in one place: one instance, g_agent (agent.c),
 * which every file of the agent reaches by that name.  One thread, so no
 * locks; the SIGCHLD handler touches only sigpipe[1].
 */
/* HELLO's "guard" (agent_guard.c): the sandbox's memory limit, the Sentry's
 * share of it (a base and one per task), the session's pids; off without. */
struct guard {
	bool on;
	uint64_t memory, base, per_task, pids;
	char meminfo[128];	/* where the kernel's meminfo is (tests: a file of theirs) */
	uint64_t next_ms, next_scan_ms, last_poke_ms, settle_ms;
	uint64_t tasks, peak;	/* counted by the last scan, and the most ever */
	pid_t victim;		/* the session being killed, until its memory is back */
	uint64_t kills;
};

struct pollfd;
struct pref;
struct agent {
	/* The channel's input (stdin): up to two frames, hunting for SYNC first. */
	char in[IN_CAP];
	size_t in_off, in_len;
	bool hunting;		/* discarding input until a SYNC marker */
	bool stdin_open;
	/* The channel's output (stdout): queued frames, [out_head, out_len). */
	char *out;
	size_t out_head, out_len, out_frame_end;
	bool out_broken;
	/* The epoch: what the server's HELLO set. */
	bool epoch;		/* HELLO received, answering */
	uint32_t window;
	uint64_t keepalive;
	uint64_t last_rx, ping_sent_at;
	uint32_t max_odd;	/* highest stream id the server opened */
	uint32_t next_even;	/* next id the agent opens */
	char instance[33];	/* this agent's random name, in HELLO_OK */
	/* Streams and commands. */
	struct cmd *cmds;
	struct stream *streams;
	size_t nstreams, ndetached;
	/* Bytes of the budget held (rings past their floor, input buffers) and the
	 * budget itself (see DEFAULT_RING_BUDGET). */
	uint64_t held, budget;
	struct guard guard;
	/* When the orphan sweep is due next, and when it last ran. */
	uint64_t next_sweep, last_sweep;
	/* The egress listener (HELLO's egress port). */
	int listen;
	uint16_t listen_port;
	/* --channel-socket (agent_sock.c): its listener, the accepted server
	 * connection that is the channel while it lasts (-1: stdin/stdout), and
	 * the rest of a frame stdout was in the middle of when it left. */
	int chan_listen, chan;
	char *stdout_rest;
	size_t stdout_rest_len;
	char listen_error[160];
	/* The process. */
	int sigpipe[2];		/* SIGCHLD's self-pipe */
	int devnull;
	pid_t self;
	/* --user UID:GID: the identity commands run as, when the agent runs as
	 * another (root with only CAP_SETUID, CAP_SETGID and CAP_KILL): then no
	 * command can signal, stop or read the agent whatever the runtime does for
	 * PID 1.  Without it commands run as the agent's own uid. */
	bool switch_user;
	uid_t cmd_uid;
	gid_t cmd_gid;
	/* The poll set build_poll() makes each turn of the loop. */
	struct pollfd *pfd;
	struct pref *pref;
	size_t pn, pcap;
	/* The earliest end of a hold on a command's output (0: none), set by build_poll. */
	uint64_t hold_wake_us;
	/* Supervised commands (agent_run.c): the root as realpath gives it, once
	 * (a command's cwd must be at or below it); the signals recent
	 * supervised commands died of, for `sbx status TOKEN`. */
	char *realroot;
	struct {
		char token[MAX_ID + 1];
		int sig;
	} sigrec[SIGREC];
	unsigned sigrec_next;
};

extern struct agent g_agent;

/* ---- agent.c: the loop, and small helpers ---- */
uint64_t now_ms(void);
uint64_t now_us(void);
__attribute__((format(printf, 1, 2))) void logf_(const char *fmt, ...);
void set_nonblock(int fd);
void put32(unsigned char *p, uint32_t v);
uint32_t get32(const unsigned char *p);
void close_fd(int *fd);

/* ---- agent_out.c: frames queued on the channel's output ---- */
size_t out_pending(void);
bool out_room(void);
void out_frame2(uint8_t type, uint32_t stream, const void *p1, size_t n1, const void *p2,
		size_t n2);
void out_frame(uint8_t type, uint32_t stream, const void *p, size_t n);
void out_json(uint8_t type, uint32_t stream, struct buf *b);
void out_error(uint8_t type, uint32_t stream, const char *error, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void out_u32(uint8_t type, uint32_t stream, uint32_t v);
void out_discard(void);
void out_write(void);

/* ---- agent_in.c: frames read from the channel, epochs (HELLO) ---- */
void end_epoch(const char *error, const char *msg);
void process_input(void);
void read_channel(void);

/* ---- agent_sock.c: the channel over a Unix socket ---- */
int chan_in_fd(void);
int chan_out_fd(void);
bool chan_readable(void);
bool chan_out_dead(void);
void chan_ended(const char *why);
void chan_listen(const char *path);
void chan_accept(void);

/* ---- agent_stream.c: streams, their windows and inbound bytes ---- */
struct stream *stream_find(uint32_t id);
struct stream *stream_new(uint32_t id, enum kind kind);
void stream_drop(struct stream *s);
void stream_reset(struct stream *s, const char *error, const char *msg);
bool ib_reserve(struct stream *s, size_t len);
void stream_consumed(struct stream *s, size_t n);
int stream_sink(const struct stream *s);
void stream_write_in(struct stream *s);
void pump_streams(void);

/* ---- agent_attach.c: detached processes: attach, processes, forget ---- */
void open_attach(uint32_t id, const struct jval *req);
bool attach_pump(struct stream *s);
void open_processes(uint32_t id);
void open_forget(uint32_t id, const struct jval *req);

/* ---- agent_net.c: dial and egress streams (TCP) ---- */
void open_dial(uint32_t id, const struct jval *req);
void dial_connected(struct stream *s);
void sock_read(struct stream *s);
void listen_egress(uint32_t port);
void egress_accept(void);

/* ---- agent_cmd.c: command records, rings, the memory budget, their JSON ---- */
struct cmd *cmd_by_pid(pid_t pid);
struct cmd *cmd_by_id(const char *id);
void cmd_close_fds(struct cmd *c);
void cmd_free(struct cmd *c);
void cmd_abandon(struct cmd *c);
void *mem_map(size_t n);
void mem_unmap(void *p, size_t n);
uint64_t ring_start(const struct ring *r);
uint64_t ring_fill(const struct ring *r);
uint64_t ring_held(const struct ring *r);
uint64_t ring_room(struct ring *r);
void exit_json(struct buf *b, const struct cmd *c);
void offsets_json(struct buf *b, uint64_t o1, uint64_t o2);
void processes_json(struct buf *b);

/* ---- agent_exec.c: starting commands, their output ---- */
int nonneg_u16(const struct jval *v, unsigned *out);
void open_exec(uint32_t id, const struct jval *req);
void cmd_report(struct cmd *c);
void cmd_read_out(struct cmd *c, int k);
bool cmd_output_done(const struct cmd *c);

/* ---- agent_guard.c: the OOM killer and pids count of a gVisor sandbox ---- */
void guard_config(const struct jval *g);
uint64_t guard_estimate(uint64_t used, uint64_t tasks);
uint64_t guard_line(void);
void guard_tick(uint64_t now);
void guard_poke(void);
uint64_t guard_next(uint64_t next);
bool guard_admit(char *why, size_t len);

/* ---- agent_run.c: the agent as the `sbx run` supervisor ---- */
bool sup_parse(char **argv, struct sup *out);
bool sup_helper_call(uint32_t id, char **argv);
__attribute__((noreturn)) void sup_child(const struct sup *sup);
void sup_kill_tree(struct cmd *c);
void sup_reaped(struct cmd *c);
void sup_settle(void);
void sup_timers(uint64_t now);
void sup_shift_deadlines(uint64_t by);
uint64_t sup_next_timer(uint64_t next);
bool sup_signal(struct cmd *c, int sig, bool relay);

/* ---- agent_reap.c: children and orphans ---- */
void on_sigchld(int sig);
void reap(void);
size_t sweep_orphans(void);

#endif
