package cache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gowarp/gowarp"
)

// ClientOptions configure a client. Zero values mean the defaults.
type ClientOptions struct {
	// Device is the RDMA device to use (default a new one).
	Device *gowarp.Device
	// Conns is how many connections (queue pairs) the client spreads its
	// calls over (default 1): each is served by one goroutine of the
	// server's.
	Conns int
	// Slots is how many calls may be outstanding on each connection
	// (default 32, at most what the server grants).
	Slots int
	// Lookup is how the client finds a key's blocks: LookupDefault (the
	// faster of the two on this machine's measurements, see the README),
	// LookupControl or LookupIndex.
	Lookup LookupMode
	Logger *slog.Logger
}

// LookupMode says how a client finds where a value lives.
type LookupMode uint8

const (
	// LookupDefault is LookupControl. On the measurements of the README
	// a lookup of a small value through the index beat the control path,
	// but a Get through it (two Reads) lost to the control path's one
	// round trip, and so did a lookup of a 1 MiB value: it is not faster
	// as a whole.
	LookupDefault LookupMode = iota
	// LookupControl asks the server over the control path (a Send and its
	// reply).
	LookupControl
	// LookupIndex reads the server's client-readable index with one RDMA
	// Read, as Pilaf and FaRM do, and asks the server only when the index
	// does not have the key (or the server serves none). A small Get then
	// takes two Reads, the bucket and the value, and no Send.
	LookupIndex
)

// PutOptions tune a put.
type PutOptions struct {
	// Durable: the put returns only once the value and its index entry
	// are on the server's stable storage (RDMA Write, persistence flush,
	// then the index commit and its sync).
	Durable bool
	// Progress, if set, is called as bytes of a large value reach the
	// server (from the calling goroutine).
	Progress func(done, total int64)
}

// GetOptions tune a get.
type GetOptions struct {
	// Progress, if set, is called as bytes of a large value arrive.
	Progress func(done, total int64)
}

// Entry is where a value lives: its generation, size and pieces. Clients
// may keep it and read through it later (ReadEntry); a read through an
// entry whose blocks were paged out or reused fails cleanly (ErrStale)
// and never returns other bytes.
type Entry struct {
	Key   string
	Gen   uint64
	Size  int64
	Addrs []Addr
	// Sum is the CRC32c of the whole value, when HasSum: a lookup through
	// the control path of a server that keeps sums reports it (the
	// client-readable index does not), so that copies on two servers
	// compare without fetching either. Gen is the server's own.
	Sum    uint32
	HasSum bool
}

// Client is a cache client, safe for concurrent use.
type Client struct {
	addr  string
	o     ClientOptions
	pd    *gowarp.PD
	conns []connHolder
	srv   hello // the server's answer, from the first connection

	closed atomic.Bool

	emu     sync.Mutex
	entries map[string]*Entry
}

type connHolder struct {
	mu sync.Mutex
	c  atomic.Pointer[cliConn]
	// After a dial that found the server unavailable, calls fail with
	// its error until failedAt+backoff instead of dialing again (under
	// mu): each dial builds a whole connection first (873 KB of buffers
	// with the defaults), so a caller retrying a server that is down made
	// 5,000 of them a second, and 66 collections.
	dialErr  error
	failedAt time.Time
	backoff  time.Duration
}

// Redial backoff: the wait after a failed dial starts at minRedial and
// doubles with each failure up to maxRedial; a dial that succeeds ends it.
const (
	minRedial = 50 * time.Millisecond
	maxRedial = 2 * time.Second
)

// Dial connects to the cache server at addr (host:port).
func Dial(ctx context.Context, addr string, o ClientOptions) (*Client, error) {
	if o.Device == nil {
		o.Device = gowarp.Open()
	}
	if o.Conns <= 0 {
		o.Conns = 1
	}
	if o.Slots <= 0 {
		o.Slots = DefaultSlots
	}
	if o.Lookup == LookupDefault {
		o.Lookup = LookupControl
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	c := &Client{addr: addr, o: o, pd: o.Device.AllocPD(), conns: make([]connHolder, o.Conns), entries: make(map[string]*Entry)}
	for i := range c.conns {
		cc, err := c.dial(ctx)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.conns[i].c.Store(cc)
		c.srv = cc.srv
	}
	return c, nil
}

// PD returns the client's protection domain: register the buffers given
// to ReadAt and WriteAt in it.
func (c *Client) PD() *gowarp.PD { return c.pd }

// BlockSize returns the server's block size.
func (c *Client) BlockSize() int64 { return int64(c.srv.BlockSize) }

// MaxValue returns the largest value the server takes.
func (c *Client) MaxValue() int64 { return int64(c.srv.MaxValue) }

// Close closes the client's connections; calls in progress fail with
// ErrClosed.
func (c *Client) Close() error {
	c.closed.Store(true)
	for i := range c.conns {
		h := &c.conns[i]
		h.mu.Lock()
		if cc := h.c.Load(); cc != nil {
			cc.fail(ErrClosed)
			<-cc.stopped
		}
		h.mu.Unlock()
	}
	return nil
}

// conn returns a live connection, dialing again for one that failed.
func (c *Client) conn(ctx context.Context) (*cliConn, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	h := &c.conns[c.pick()]
	if cc := h.c.Load(); cc != nil && !cc.failed() {
		return cc, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if cc := h.c.Load(); cc != nil && !cc.failed() {
		return cc, nil
	}
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if h.dialErr != nil && time.Since(h.failedAt) < h.backoff {
		return nil, h.dialErr
	}
	cc, err := c.dial(ctx)
	if err != nil {
		// The caller's own context ending says nothing of the server.
		if errors.Is(err, ErrUnavailable) && ctx.Err() == nil {
			h.dialErr, h.failedAt = err, time.Now()
			h.backoff = min(max(2*h.backoff, minRedial), maxRedial)
		}
		return nil, err
	}
	h.dialErr, h.backoff = nil, 0
	h.c.Store(cc)
	return cc, nil
}

// pick chooses the connection for a call: the one with the fewest calls
// outstanding, the first of those. A call alone so stays on one
// connection (alternating between two cost a quarter more CPU per 4 KiB
// ReadAt at 1 in flight), and two large reads go on two, each served by
// a server goroutine of its own.
func (c *Client) pick() int {
	if len(c.conns) == 1 {
		return 0
	}
	best, most := 0, -1
	for i := range c.conns {
		cc := c.conns[i].c.Load()
		if cc == nil || cc.failed() {
			return i // dialed again by conn
		}
		if n := len(cc.free); n > most {
			best, most = i, n
		}
	}
	return best
}

// errConnLost marks a call that failed because its connection did (the
// server gone or restarted, an address it no longer knows at all, which
// it answers with a Terminate), so the call is retried on a new one
// after a new lookup. An address into a block reused since reads the
// block's sink instead (its key is retired) and fails its header check:
// ErrStale, for that call alone.
var errConnLost = fmt.Errorf("%w: connection lost", ErrUnavailable)

// attempts bounds the tries of a call that fails with a stale address;
// lostAttempts those that fail with a lost connection. A connection is
// lost for every call on it at once, so a call may fail so because of
// another's address: when reused blocks' keys were revoked, with 4
// readers and 2 writers replacing and deleting on one connection, 5
// tries ran out about once in 60 runs of TestIndexConcurrentUpdates on a
// loaded host.
const (
	attempts     = 5
	lostAttempts = 32
)

// retry runs f on a live connection, again on a new one while it fails
// with a lost connection or a stale address (at most attempts times for
// a stale address, lostAttempts in all).
func (c *Client) retry(ctx context.Context, key string, f func(cc *cliConn) error) error {
	var err error
	stale := 0
	for range lostAttempts {
		var cc *cliConn
		if cc, err = c.conn(ctx); err != nil {
			return err
		}
		err = f(cc)
		if err == nil || !(errors.Is(err, errConnLost) || errors.Is(err, ErrStale)) || ctx.Err() != nil {
			return err
		}
		if errors.Is(err, ErrStale) && !errors.Is(err, errConnLost) {
			if stale++; stale == attempts {
				return err
			}
		}
		c.forget(key)
	}
	return err
}

// Put stores value under key.
func (c *Client) Put(ctx context.Context, key string, value []byte, o PutOptions) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if len(value) > InlineMax {
		return c.putLarge(ctx, key, value, o)
	}
	var fl uint8
	if o.Durable {
		fl = FlagDurable
	}
	c.forget(key)
	return c.retry(ctx, key, func(cc *cliConn) error {
		_, err := cc.call(ctx, &Msg{Op: OpPut, Flags: fl, Key: []byte(key), Value: value}, nil)
		return err
	})
}

func (c *Client) putLarge(ctx context.Context, key string, value []byte, o PutOptions) error {
	mr, err := c.pd.Register(value, 0)
	if err != nil {
		return fmt.Errorf("cache: put: %w", err)
	}
	defer mr.Deregister()
	return c.WriteAt(ctx, key, mr, 0, len(value), o)
}

// WriteAt stores n bytes of src, a buffer registered in PD, from offset
// srcOff, as the value of key: the bytes go from src to the server's
// block with RDMA Write, without a copy on either side. src must not
// change until WriteAt returns.
func (c *Client) WriteAt(ctx context.Context, key string, src *gowarp.MR, srcOff, n int, o PutOptions) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if srcOff < 0 || n < 0 || srcOff > src.Len() || n > src.Len()-srcOff {
		return fmt.Errorf("%w: %d bytes at %d of a buffer of %d", ErrBadRequest, n, srcOff, src.Len())
	}
	c.forget(key)
	return c.retry(ctx, key, func(cc *cliConn) error { return cc.writeAt(ctx, key, src, srcOff, n, o) })
}

// Get returns the value of key.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	return c.GetInto(ctx, key, nil, GetOptions{})
}

// GetInto returns the value of key, in dst's memory when it has room
// (appended to dst[:0]).
func (c *Client) GetInto(ctx context.Context, key string, dst []byte, o GetOptions) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	var out []byte
	noIndex := false // an entry of the index failed: the control path answers
	err := c.retry(ctx, key, func(cc *cliConn) (err error) {
		s, err := cc.acquire(ctx)
		if err != nil {
			return err
		}
		defer cc.done(s)
		var e *Entry
		if cc.useIndex() && !noIndex {
			if e, err = cc.indexLookup(ctx, s, key); err != nil {
				return err
			}
			if e != nil {
				defer func() { noIndex = err != nil }()
			}
		}
		if e == nil {
			s.inline, s.inlineCopy = dst[:0], true
			r, err := cc.callIn(ctx, s, &Msg{Op: OpGet, Key: []byte(key), Flags: cc.missFlag(true)}, nil)
			got := s.inline
			s.inline, s.inlineCopy = nil, false
			if err != nil {
				return err
			}
			if r.Flags&FlagInline != 0 {
				out = got
				return nil
			}
			e = entryOf(key, r)
			e.Addrs = append([]Addr(nil), e.Addrs...) // the slot's own is reused
			c.remember(e)
		}
		if e.Size > c.MaxValue() && c.MaxValue() > 0 {
			return fmt.Errorf("%w: the server says %d bytes", ErrMalformed, e.Size)
		}
		if e.oneRead() {
			// Small and one piece: one Read, then a copy (see readSmall).
			v, err := cc.readSmall(ctx, s, e)
			if err == nil {
				out = append(dst[:0], v...)
				if o.Progress != nil {
					o.Progress(e.Size, e.Size)
				}
			}
			return err
		}
		if e.Size <= InlineMax {
			// Small: into the slot's registered bounce buffer, then a copy.
			off := s.i * InlineMax
			n, err := cc.readIn(ctx, s, e, cc.bounceMR, off, int(e.Size), 0, o.Progress)
			if err == nil || err == io.EOF {
				out, err = append(dst[:0], cc.bounceMR.Bytes()[off:off+n]...), nil
			}
			return err
		}
		if int64(cap(dst)) >= e.Size {
			out = dst[:e.Size]
		} else {
			out = make([]byte, e.Size)
		}
		mr, err := c.pd.Register(out, gowarp.LocalWrite)
		if err != nil {
			return fmt.Errorf("cache: get: %w", err)
		}
		defer mr.Deregister()
		_, err = cc.readIn(ctx, s, e, mr, 0, int(e.Size), 0, o.Progress)
		if err == io.EOF {
			err = nil
		}
		return err
	})
	return out, err
}

// Lookup returns where the value of key lives: through the control path,
// which pages its blocks in, or the index when the client reads it
// (LookupIndex), which does not (a Read of a paged-out block faults its
// pages in from the block's file).
func (c *Client) Lookup(ctx context.Context, key string) (*Entry, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	var e *Entry
	err := c.retry(ctx, key, func(cc *cliConn) error {
		s, err := cc.acquire(ctx)
		if err != nil {
			return err
		}
		defer cc.done(s)
		e, err = cc.lookupIn(ctx, s, key, true)
		return err
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// lookupIn finds key's entry in slot s: in the index if the client reads
// it (and index is true) and it has the key, else through the control
// path. The entry is
// remembered for ReadAt.
func (cc *cliConn) lookupIn(ctx context.Context, s *cslot, key string, index bool) (*Entry, error) {
	if index && cc.useIndex() {
		e, err := cc.indexLookup(ctx, s, key)
		if err != nil || e != nil {
			if e != nil {
				cc.cl.remember(e)
			}
			return e, err
		}
	}
	r, err := cc.callIn(ctx, s, &Msg{Op: OpLookup, Key: []byte(key), Flags: cc.missFlag(index)}, nil)
	if err != nil {
		return nil, err
	}
	e := entryOf(key, r)
	e.Addrs = append([]Addr(nil), e.Addrs...) // the slot's own is reused
	cc.cl.remember(e)
	return e, nil
}

func (cc *cliConn) useIndex() bool { return cc.cl.o.Lookup == LookupIndex && cc.srv.IdxVersion != 0 }

// missFlag is the flag of a control-path lookup that the index did not
// answer, when it was asked (asked and the client reads it).
func (cc *cliConn) missFlag(asked bool) uint8 {
	if asked && cc.useIndex() {
		return FlagIndexMiss
	}
	return 0
}

// idxTries bounds the Reads of a neighbourhood that keeps reading torn
// (the server rewriting it): then the control path answers.
const idxTries = 3

// indexLookup reads key's neighbourhood of the server's index into the
// slot's header area and returns the key's entry, or nil when the index
// does not have it (the caller asks the control path).
func (cc *cliConn) indexLookup(ctx context.Context, s *cslot, key string) (*Entry, error) {
	if len(key) > idxKeyMax {
		return nil, nil
	}
	home := idxHome([]byte(key), int(cc.srv.IdxBuckets))
	const n = idxProbe * idxBucketLen
	s.wrs = append(s.wrs[:0], gowarp.SendWR{ID: wrRead<<16 | uint64(s.i), Op: gowarp.OpRead, Flags: gowarp.Signaled,
		RemoteAddr: cc.srv.IdxAddr + uint64(home)*idxBucketLen, RKey: gowarp.STag(cc.srv.IdxSTag)})
	s.sges = append(s.sges[:0], gowarp.SGE{MR: cc.hdrMR, Offset: s.hdrOff, Length: n})
	s.wrs[0].SGL = s.sges[:1]
	for range idxTries {
		if err := cc.post(s.wrs[0]); err != nil {
			return nil, cc.lostErr()
		}
		if err := cc.wait(ctx, s, 1, true); err != nil {
			return nil, err
		}
		x, found, torn := findBucket(cc.hdrMR.Bytes()[s.hdrOff:s.hdrOff+n], []byte(key))
		if found {
			return &Entry{Key: key, Gen: x.gen, Size: int64(x.size), Addrs: []Addr{x.addr}}, nil
		}
		if !torn {
			break
		}
	}
	return nil, nil
}

// entryOf makes an entry of a reply call returned (its Addrs are the
// reply's own copy).
func entryOf(key string, r *Msg) *Entry {
	e := &Entry{Key: key, Gen: r.Gen, Size: int64(r.Size), Addrs: r.Addrs}
	if r.Op == OpLookup {
		e.Sum, e.HasSum = parseSum(r.Value)
	}
	return e
}

// ReadAt reads n bytes of the value of key from offset off into dst,
// a buffer registered in PD, at dstOff, with RDMA Reads straight from the
// server's blocks: no copy, and no work for the server's CPU when the
// client knows the value's address already (it keeps the addresses of
// the values it looked up). A read through an address gone stale looks
// the key up again. It returns the bytes read; io.EOF when the range
// passes the value's end.
func (c *Client) ReadAt(ctx context.Context, key string, dst *gowarp.MR, dstOff, n int, off int64) (int, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	var got int
	noIndex := false // an entry of the index failed: the control path answers
	err := c.retry(ctx, key, func(cc *cliConn) (err error) {
		s, err := cc.acquire(ctx)
		if err != nil {
			return err
		}
		defer cc.done(s)
		e := c.entry(key)
		if e == nil {
			fromIndex := cc.useIndex() && !noIndex
			if e, err = cc.lookupIn(ctx, s, key, !noIndex); err != nil {
				return err
			}
			if fromIndex {
				defer func() { noIndex = err != nil }()
			}
		}
		got, err = cc.readIn(ctx, s, e, dst, dstOff, n, off, nil)
		return err
	})
	return got, err
}

// ReadEntry is ReadAt through an entry the caller keeps: it fails with
// ErrStale, and reads nothing that is not the entry's, if the entry's
// blocks were paged out or reused since the lookup.
func (c *Client) ReadEntry(ctx context.Context, e *Entry, dst *gowarp.MR, dstOff, n int, off int64) (int, error) {
	cc, err := c.conn(ctx)
	if err != nil {
		return 0, err
	}
	got, err := cc.read(ctx, e, dst, dstOff, n, off, nil)
	if errors.Is(err, errConnLost) {
		err = fmt.Errorf("%w: %w", ErrStale, err)
	}
	return got, err
}

// Delete removes key.
func (c *Client) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	c.forget(key)
	cc, err := c.conn(ctx)
	if err != nil {
		return err
	}
	_, err = cc.call(ctx, &Msg{Op: OpDelete, Key: []byte(key)}, nil)
	return err
}

// List returns the keys with the prefix, in order, at most limit of them
// (0: all).
func (c *Client) List(ctx context.Context, prefix string, limit int) ([]string, error) {
	var keys []string
	after := ""
	for limit <= 0 || len(keys) < limit {
		want := uint64(maxListLen)
		if limit > 0 {
			want = uint64(min(limit-len(keys), maxListLen))
		}
		var more bool
		err := c.retry(ctx, "", func(cc *cliConn) error {
			_, err := cc.call(ctx, &Msg{Op: OpList, Key: []byte(prefix), Value: []byte(after), Size: want}, func(r *Msg) {
				for _, k := range r.Keys {
					keys = append(keys, string(k))
				}
				more = r.Flags&FlagMore != 0
			})
			return err
		})
		if err != nil {
			return nil, err
		}
		if !more || len(keys) == 0 {
			break
		}
		after = keys[len(keys)-1]
	}
	return keys, nil
}

// Stats returns the server's counters.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	err := c.retry(ctx, "", func(cc *cliConn) error {
		var derr error
		_, err := cc.call(ctx, &Msg{Op: OpStats}, func(r *Msg) { st, derr = decodeStats(r.Value) })
		return errors.Join(err, derr)
	})
	return st, err
}

func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrBadRequest)
	case len(key) > MaxKey:
		return fmt.Errorf("%w: key of %d bytes (at most %d)", ErrTooLarge, len(key), MaxKey)
	}
	return nil
}

func (c *Client) entry(key string) *Entry {
	c.emu.Lock()
	defer c.emu.Unlock()
	return c.entries[key]
}

func (c *Client) remember(e *Entry) {
	c.emu.Lock()
	if len(c.entries) > 1<<16 {
		clear(c.entries)
	}
	c.entries[e.Key] = e
	c.emu.Unlock()
}

func (c *Client) forget(key string) {
	c.emu.Lock()
	delete(c.entries, key)
	c.emu.Unlock()
}

// cliConn is one connection: a queue pair, a slot per outstanding call
// (its message buffer and its headers' landing area), and the goroutine
// that polls the completion queue and hands each completion to its slot.
type cliConn struct {
	cl     *Client
	qp     *gowarp.QP
	cq     *gowarp.CQ
	sendMR *gowarp.MR
	recvMR *gowarp.MR
	hdrMR  *gowarp.MR
	// bounceMR has InlineMax bytes per slot: small values read one-sided
	// for Get land there and are copied out.
	bounceMR *gowarp.MR
	recvs    []gowarp.RecvWR
	slots    []cslot
	free     chan int
	msg      int
	srv      hello

	// Completions are polled by the callers waiting for them, one at a
	// time (the leader, holding pollMu): the leader receives on the
	// socket itself (CQ.Wait receives inline), hands each completion to
	// its slot, and leaves once its own came, passing the lead on through
	// pollFree. A call alone on the connection so waits in the socket
	// read with no hand-off between goroutines.
	pollMu   sync.Mutex
	pollFree chan struct{}
	wc       [64]gowarp.Completion // the leader's
	m        Msg                   // the leader's

	// Requests waiting to be posted together (see post).
	pmu     sync.Mutex
	pending []gowarp.SendWR
	spare   []gowarp.SendWR
	posting bool

	dead    chan struct{}
	stopped chan struct{}
	once    sync.Once
	err     error
}

// Kinds of a work request, in its ID's bits 16-23 (the slot in 0-15).
const (
	wrSend = iota + 1
	wrRead
	wrWrite
	wrFlush
)

const maxPiecesPerCall = MaxPieces

type cslot struct {
	i         int
	id        atomic.Uint64
	seq       uint64
	msg       []byte
	hdrOff    int // offset of its header area in hdrMR
	wr        gowarp.SendWR
	sge       [1]gowarp.SGE
	ev        chan struct{}
	evReady   func() bool // an event waits in ev
	abandoned atomic.Bool
	gaveUp    bool // the caller abandoned the slot: the reply frees it
	onReply   func(*Msg)
	// inlineCopy: a get's inline value is appended to inline (the
	// caller's buffer) as its reply is delivered, without a closure.
	inlineCopy bool
	inline     []byte
	reply      Msg
	status     Status
	text       []byte
	addrs      []Addr
	wrs        []gowarp.SendWR
	sges       []gowarp.SGE
}

func (c *Client) dial(ctx context.Context) (*cliConn, error) {
	n, msg := c.o.Slots, maxMsg
	cc := &cliConn{cl: c, msg: msg, dead: make(chan struct{}), stopped: make(chan struct{}), pollFree: make(chan struct{}, 1)}
	cc.cq = c.o.Device.NewCQ(n*(2*maxPiecesPerCall+4) + 16)
	qp, err := c.pd.NewQP(gowarp.QPConfig{SendCQ: cc.cq, RecvCQ: cc.cq, SendDepth: n * (2*maxPiecesPerCall + 2), RecvDepth: n})
	if err != nil {
		return nil, fmt.Errorf("cache: dial: %w", err)
	}
	cc.qp = qp
	// A dial that fails leaves nothing registered: a client retrying a
	// server that is down would otherwise add a connection's buffers to
	// its device's table at every try.
	failed := func(err error) (*cliConn, error) {
		cc.fail(ErrClosed)
		return nil, err
	}
	if cc.recvMR, err = c.pd.Register(make([]byte, n*msg), gowarp.LocalWrite); err != nil {
		return failed(fmt.Errorf("cache: dial: %w", err))
	}
	cc.recvs = make([]gowarp.RecvWR, n)
	for i := range cc.recvs {
		cc.recvs[i] = gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: cc.recvMR, Offset: i * msg, Length: msg}}}
	}
	if _, err := qp.PostRecvList(cc.recvs); err != nil {
		return failed(fmt.Errorf("cache: dial: %w", err))
	}
	h := hello{Version: Version, Slots: uint16(n), MaxMsg: uint32(msg)}
	if err := qp.Connect(ctx, c.addr, gowarp.ConnectOptions{PrivateData: h.append(nil), IRD: 1, ORD: 128, BusyPoll: gowarp.DefaultBusyPoll}); err != nil {
		return failed(fmt.Errorf("%w: dial: %w", ErrUnavailable, err)) // Connect's error names the address
	}
	sh, err := parseHello(qp.PeerPrivateData())
	if err != nil || int(sh.Slots) > n || int(sh.MaxMsg) > msg {
		return failed(fmt.Errorf("cache: dial %s: server's hello: %w", c.addr, errors.Join(err, ErrMalformed)))
	}
	cc.srv = sh
	n, cc.msg = int(sh.Slots), int(sh.MaxMsg)
	if cc.sendMR, err = c.pd.Register(make([]byte, n*cc.msg), 0); err != nil {
		return failed(fmt.Errorf("cache: dial: %w", err))
	}
	if cc.hdrMR, err = c.pd.Register(make([]byte, n*maxPiecesPerCall*HeaderLen), gowarp.LocalWrite); err != nil {
		return failed(fmt.Errorf("cache: dial: %w", err))
	}
	if cc.bounceMR, err = c.pd.Register(make([]byte, n*InlineMax), gowarp.LocalWrite); err != nil {
		return failed(fmt.Errorf("cache: dial: %w", err))
	}
	cc.slots = make([]cslot, n)
	cc.free = make(chan int, n)
	for i := range cc.slots {
		s := &cc.slots[i]
		s.i = i
		s.msg = cc.sendMR.Bytes()[i*cc.msg : (i+1)*cc.msg]
		s.hdrOff = i * maxPiecesPerCall * HeaderLen
		s.ev = make(chan struct{}, 2*maxPiecesPerCall+2)
		s.evReady = func() bool { return len(s.ev) > 0 }
		s.sge[0].MR = cc.sendMR
		s.sge[0].Offset = i * cc.msg
		s.wr = gowarp.SendWR{Op: gowarp.OpSend, SGL: s.sge[:]}
		cc.free <- i
	}
	return cc, nil
}

func (cc *cliConn) failed() bool {
	select {
	case <-cc.dead:
		return true
	default:
		return false
	}
}

// fail ends the connection: the queue pair closes (so nothing it had
// posted lands anywhere any more) and every call on it fails.
func (cc *cliConn) fail(err error) {
	cc.once.Do(func() {
		if !errors.Is(err, ErrClosed) {
			cc.cl.o.Logger.Debug("cache: connection failed", "err", err)
		}
		cc.err = err
		close(cc.dead)
		cc.qp.Close()
		// Nothing lands in the buffers any more; a leader still handing
		// out what it polled reads Go memory, which stays.
		if cc.recvMR != nil {
			cc.recvMR.Deregister()
		}
		if cc.sendMR != nil {
			cc.sendMR.Deregister()
		}
		if cc.hdrMR != nil {
			cc.hdrMR.Deregister()
		}
		if cc.bounceMR != nil {
			cc.bounceMR.Deregister()
		}
		close(cc.stopped)
	})
}

func (cc *cliConn) lostErr() error {
	if errors.Is(cc.err, ErrClosed) {
		return ErrClosed
	}
	return fmt.Errorf("%w: %w", errConnLost, cc.err)
}

// await waits until ready reports true (a free slot), or, given ev (the
// caller's slot's events), until an event comes on ev, which it takes,
// leading the polling of the completion queue when no one else does. A
// caller not leading waits on ev as well as for the lead, so that the
// leader's hand-over of its completion wakes it at once rather than
// when the lead comes to it. It returns a lost connection's error, or
// ctx's.
func (cc *cliConn) await(ctx context.Context, ready func() bool, ev chan struct{}) error {
	token := false // this caller holds the lead's hand-over token
	defer func() {
		if token { // not used: to the next waiter
			cc.passLead()
		}
	}()
	for {
		if ev != nil {
			select {
			case <-ev:
				return nil
			default:
			}
		} else if ready() {
			return nil
		}
		if cc.failed() {
			return cc.lostErr()
		}
		if cc.pollMu.TryLock() {
			token = false
			err := cc.lead(ctx, ready)
			cc.pollMu.Unlock()
			cc.passLead()
			if err != nil {
				return err
			}
			continue
		}
		token = false // the leader, when it leaves, passes the lead on
		select {
		case <-ev: // never, without ev
			return nil
		case <-cc.pollFree:
			token = true
		case <-cc.dead:
			return cc.lostErr()
		case <-ctx.Done():
			return ctx.Err()
		}
		// Or it was what we wait for that the last leader handed us: look again.
	}
}

// awaitEv is await for an event of slot s, which it takes.
func (cc *cliConn) awaitEv(ctx context.Context, s *cslot) error {
	return cc.await(ctx, s.evReady, s.ev)
}

// passLead wakes one caller waiting for the lead, if any.
func (cc *cliConn) passLead() {
	select {
	case cc.pollFree <- struct{}{}:
	default:
	}
}

// lead polls the completion queue, handing each completion to its slot,
// until ready reports true. The caller holds pollMu.
func (cc *cliConn) lead(ctx context.Context, ready func() bool) error {
	for !ready() {
		if cc.failed() {
			return cc.lostErr()
		}
		n := cc.cq.Poll(cc.wc[:])
		if n == 0 {
			if err := cc.cq.Wait(ctx); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				cc.fail(err)
				return cc.lostErr()
			}
			continue
		}
		for _, w := range cc.wc[:n] {
			if err := w.Err(); err != nil {
				cc.fail(errors.Join(err, cc.qp.Err()))
				return cc.lostErr()
			}
			if w.Op != gowarp.CompRecv {
				if kind := w.ID >> 16 & 0xff; kind != wrSend {
					if i := int(w.ID & 0xffff); i < len(cc.slots) {
						cc.slots[i].ev <- struct{}{}
					}
				}
				continue
			}
			if err := cc.onReply(int(w.ID), w.Bytes, &cc.m); err != nil {
				cc.fail(err)
				return cc.lostErr()
			}
		}
	}
	return nil
}

// onReply delivers the reply in receive buffer k to its slot.
func (cc *cliConn) onReply(k, n int, m *Msg) error {
	if k >= len(cc.recvs) {
		return fmt.Errorf("%w: completion of receive %d", ErrMalformed, k)
	}
	if err := Decode(cc.recvMR.Bytes()[k*cc.msg:k*cc.msg+n], m); err != nil {
		return err
	}
	i := int(m.ID & 0xffff)
	if i >= len(cc.slots) || cc.slots[i].id.Load() != m.ID {
		return fmt.Errorf("%w: reply to call %#x, which is not outstanding", ErrMalformed, m.ID)
	}
	s := &cc.slots[i]
	s.id.Store(0)
	if s.abandoned.CompareAndSwap(true, false) {
		if err := cc.qp.PostRecv(&cc.recvs[k]); err != nil {
			return err
		}
		cc.free <- i
		return nil
	}
	s.reply = Msg{Op: m.Op, Flags: m.Flags, Status: m.Status, ID: m.ID, Gen: m.Gen, Size: m.Size}
	s.status = m.Status
	s.text = s.text[:0]
	// The error's text, or a lookup's sum (4 bytes); any other value goes
	// to onReply or inline.
	if m.Status != StatusOK || m.Op == OpLookup && len(m.Value) <= 8 {
		s.text = append(s.text, m.Value...)
	}
	s.addrs = append(s.addrs[:0], m.Addrs...)
	s.reply.Addrs = s.addrs
	if s.onReply != nil && m.Status == StatusOK {
		s.onReply(m) // while m still aliases the receive buffer
	}
	if s.inlineCopy && m.Status == StatusOK && m.Flags&FlagInline != 0 {
		s.inline = append(s.inline, m.Value...)
	}
	s.reply.Value = s.text
	if err := cc.qp.PostRecv(&cc.recvs[k]); err != nil {
		return err
	}
	s.ev <- struct{}{}
	return nil
}

// acquire takes a free slot. With none free, it waits for one (polling,
// when no one else does: the replies that free the slots of calls given
// up need someone to receive them).
func (cc *cliConn) acquire(ctx context.Context) (*cslot, error) {
	// A free slot first, with a receive that looks at one channel: the
	// select below takes the locks of all three, which was a third of
	// the client's select cost per 4 KiB ReadAt (profile of gowarp cache
	// bench -c 16). A done context sends nothing, even with a slot free.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case i := <-cc.free:
		if !cc.failed() {
			return &cc.slots[i], nil
		}
		cc.free <- i
		return nil, cc.lostErr()
	default:
	}
	for {
		select {
		case i := <-cc.free:
			return &cc.slots[i], nil
		case <-cc.dead:
			return nil, cc.lostErr()
		case <-ctx.Done():
			return nil, ctx.Err()
		default:
		}
		if err := cc.await(ctx, cc.slotFree, nil); err != nil {
			return nil, err
		}
	}
}

func (cc *cliConn) slotFree() bool { return len(cc.free) > 0 }

func (cc *cliConn) release(s *cslot) { s.onReply = nil; cc.free <- s.i }

// done releases s after a call that took it with acquire, unless its
// caller gave it up (the reply frees it) or the connection failed.
func (cc *cliConn) done(s *cslot) {
	if !s.gaveUp && !cc.failed() {
		cc.release(s)
	}
}

// wait waits for k events of slot s. If ctx ends first and one-sided work
// is outstanding (rdma), the connection is failed: only a closed queue
// pair guarantees that a Read no longer lands in the caller's buffer.
func (cc *cliConn) wait(ctx context.Context, s *cslot, k int, rdma bool) error {
	for range k {
		if err := cc.awaitEv(ctx, s); err != nil {
			if ctx.Err() == nil || cc.failed() {
				return cc.lostErr()
			}
			if rdma {
				// Completions waiting here would mean the poller missed
				// them; none, that the peer never answered.
				cc.cl.o.Logger.Debug("cache: one-sided work given up", "completions waiting", cc.cq.Len(), "err", ctx.Err())
				cc.fail(ctx.Err())
				<-cc.stopped
			}
			return ctx.Err()
		}
	}
	return nil
}

// send posts the control message m in slot s.
func (cc *cliConn) send(s *cslot, m *Msg) error {
	s.seq++
	m.ID = s.seq<<16 | uint64(s.i)
	if m.EncodedLen() > len(s.msg) {
		return fmt.Errorf("%w: a %s message of %d bytes", ErrTooLarge, m.Op, m.EncodedLen())
	}
	s.sge[0].Length = len(m.Append(s.msg[:0]))
	s.wr.ID = wrSend<<16 | uint64(s.i)
	s.id.Store(m.ID)
	if err := cc.post(s.wr); err != nil {
		s.id.Store(0)
		return fmt.Errorf("%w: %w", errConnLost, err)
	}
	return nil
}

// post sends wr together with the requests other callers send meanwhile:
// each post is a system call (on loopback the write does the receiver's
// TCP work too), so the first caller to find nobody posting yields once
// when other calls are under way, for the callers its yield lets run to
// add theirs, and posts them all
// with one PostSendList. The others return at once; their requests go
// in that list (or the next). Should the post fail, the connection is
// failed, and the callers whose requests were in it learn it from their
// wait.
func (cc *cliConn) post(wrs ...gowarp.SendWR) error {
	cc.pmu.Lock()
	cc.pending = append(cc.pending, wrs...)
	if cc.posting {
		cc.pmu.Unlock()
		return nil
	}
	cc.posting = true
	cc.pmu.Unlock()
	if len(cc.slots)-len(cc.free) > 1 {
		// Other calls hold slots: one may be about to post. A call alone
		// posts at once (a yield cost it a quarter of its rate).
		runtime.Gosched()
	}
	for {
		cc.pmu.Lock()
		batch := cc.pending
		if len(batch) == 0 {
			cc.posting = false
			cc.pmu.Unlock()
			return nil
		}
		cc.pending = cc.spare[:0]
		cc.pmu.Unlock()
		_, err := cc.qp.PostSendList(batch)
		clear(batch) // the SGLs' references
		cc.pmu.Lock()
		cc.spare = batch[:0]
		if err != nil {
			cc.posting = false
			cc.pmu.Unlock()
			cc.fail(err)
			return err
		}
		cc.pmu.Unlock()
	}
}

// call sends m and waits for the reply; onReply, if set, sees a
// successful reply while its slices still alias the receive buffer.
// The reply returned is a copy (its Value left out): the slot's is
// overwritten as soon as the slot is released.
func (cc *cliConn) call(ctx context.Context, m *Msg, onReply func(*Msg)) (*Msg, error) {
	s, err := cc.acquire(ctx)
	if err != nil {
		return nil, err
	}
	r, err := cc.callIn(ctx, s, m, onReply)
	if r != nil {
		c := *r
		c.Value, c.Keys = nil, nil
		if len(r.Addrs) > 0 {
			c.Addrs = append([]Addr(nil), r.Addrs...)
		}
		r = &c
	}
	if !s.gaveUp && !cc.failed() {
		cc.release(s)
	}
	return r, err
}

func (cc *cliConn) callIn(ctx context.Context, s *cslot, m *Msg, onReply func(*Msg)) (*Msg, error) {
	s.onReply, s.gaveUp = onReply, false
	if err := cc.send(s, m); err != nil {
		return nil, err
	}
	if err := cc.awaitEv(ctx, s); err != nil {
		if ctx.Err() == nil || cc.failed() {
			return nil, cc.lostErr()
		}
		s.abandoned.Store(true)
		if s.id.Load() == 0 && s.abandoned.CompareAndSwap(true, false) {
			<-s.ev // the reply came meanwhile
			return &s.reply, s.status.err(m.Op, s.text)
		}
		s.gaveUp = true
		return nil, ctx.Err()
	}
	if err := s.status.err(m.Op, s.text); err != nil {
		return nil, err
	}
	return &s.reply, nil
}

// read reads [off, off+n) of the value e names into dst at dstOff: a Read
// of each piece's bytes, then a Read of its header, then the checks.
// The responder serves a queue pair's Reads in order, so a header read
// after its bytes shows whether the piece was reused meanwhile (a reused
// block changes its key first, so the header Read fails; a rewritten
// piece has another generation or CRC).
func (cc *cliConn) read(ctx context.Context, e *Entry, dst *gowarp.MR, dstOff, n int, off int64, progress func(done, total int64)) (int, error) {
	s, err := cc.acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer cc.done(s)
	return cc.readIn(ctx, s, e, dst, dstOff, n, off, progress)
}

// readIn is read in slot s, which the caller holds.
func (cc *cliConn) readIn(ctx context.Context, s *cslot, e *Entry, dst *gowarp.MR, dstOff, n int, off int64, progress func(done, total int64)) (int, error) {
	if off < 0 || n < 0 || dstOff < 0 || dstOff > dst.Len() || n > dst.Len()-dstOff {
		return 0, fmt.Errorf("%w: %d bytes at %d of a buffer of %d", ErrBadRequest, n, dstOff, dst.Len())
	}
	var eof error
	if off >= e.Size {
		return 0, io.EOF
	}
	if int64(n) > e.Size-off {
		n, eof = int(e.Size-off), io.EOF
	}
	if e.oneRead() && off == 0 && int64(n) == e.Size && dst.Bytes() != nil {
		// One piece read whole, and small: one Read of its header and
		// bytes into the slot's bounce buffer, then a copy. The CRC
		// proves the bytes: a Read torn by a rewrite fails it, and one of
		// a reused block fails on the block's new key.
		v, err := cc.readSmall(ctx, s, e)
		if err != nil {
			return 0, err
		}
		copy(dst.Bytes()[dstOff:dstOff+n], v)
		if progress != nil {
			progress(int64(n), int64(n))
		}
		return n, eof
	}
	type check struct {
		piece    int
		whole    bool
		dst, hdr int
		n        int
	}
	var checks [maxPiecesPerCall]check
	nc := 0
	s.wrs, s.sges = s.wrs[:0], s.sges[:0]
	pos, done := int64(0), 0
	for i, a := range e.Addrs {
		pstart, pend := pos, pos+int64(a.Len)
		pos = pend
		lo, hi := max(pstart, off), min(pend, off+int64(n))
		if lo >= hi {
			continue
		}
		if nc == maxPiecesPerCall {
			return 0, fmt.Errorf("%w: more than %d pieces in one read", ErrTooLarge, maxPiecesPerCall)
		}
		k := int(hi - lo)
		checks[nc] = check{piece: i, whole: lo == pstart && hi == pend, dst: dstOff + done, hdr: s.hdrOff + nc*HeaderLen, n: k}
		nc++
		// Only the header's Read is signaled: Reads complete in order, and
		// one that fails completes whatever its flags.
		s.wrs = append(s.wrs, gowarp.SendWR{ID: wrRead<<16 | uint64(s.i), Op: gowarp.OpRead,
			RemoteAddr: a.Off + HeaderLen + uint64(lo-pstart), RKey: gowarp.STag(a.STag)})
		s.sges = append(s.sges, gowarp.SGE{MR: dst, Offset: dstOff + done, Length: k})
		s.wrs = append(s.wrs, gowarp.SendWR{ID: wrRead<<16 | uint64(s.i), Op: gowarp.OpRead, Flags: gowarp.Signaled,
			RemoteAddr: a.Off, RKey: gowarp.STag(a.STag)})
		s.sges = append(s.sges, gowarp.SGE{MR: cc.hdrMR, Offset: checks[nc-1].hdr, Length: HeaderLen})
		done += k
	}
	for i := range s.wrs {
		s.wrs[i].SGL = s.sges[i : i+1]
	}
	if len(s.wrs) == 0 {
		return 0, eof
	}
	// With the other calls' requests (see post): a failed post fails the
	// connection, which the wait reports.
	if err := cc.post(s.wrs...); err != nil {
		return 0, cc.lostErr()
	}
	got := int64(0)
	for i := range nc {
		if err := cc.wait(ctx, s, 1, true); err != nil {
			return 0, err
		}
		if progress != nil {
			got += int64(checks[i].n)
			progress(got, int64(n))
		}
	}
	buf := dst.Bytes()
	hb := cc.hdrMR.Bytes()
	for _, ch := range checks[:nc] {
		hdr := hb[ch.hdr : ch.hdr+HeaderLen]
		if ch.whole && buf != nil {
			if !verifyPiece(hdr, e.Gen, buf[ch.dst:ch.dst+ch.n]) {
				return 0, fmt.Errorf("%w: piece %d of %q", ErrStale, ch.piece, e.Key)
			}
			continue
		}
		h, ok := parseHeader(hdr)
		if !ok || h.Gen != e.Gen || h.Flags&hdrPending != 0 || h.Len != e.Addrs[ch.piece].Len {
			return 0, fmt.Errorf("%w: piece %d of %q", ErrStale, ch.piece, e.Key)
		}
	}
	return done, eof
}

// oneRead reports whether e's value is read whole with one Read of its
// header and bytes (readSmall): one piece, small enough for a slot's
// bounce buffer.
func (e *Entry) oneRead() bool {
	return len(e.Addrs) == 1 && e.Size == int64(e.Addrs[0].Len) && HeaderLen+e.Size <= InlineMax
}

// readSmall reads the one piece of e, header and bytes with one Read,
// into slot s's bounce buffer and returns its bytes there once checked.
// The caller checked e.oneRead().
func (cc *cliConn) readSmall(ctx context.Context, s *cslot, e *Entry) ([]byte, error) {
	a := e.Addrs[0]
	off, n := s.i*InlineMax, HeaderLen+int(a.Len)
	s.wrs = append(s.wrs[:0], gowarp.SendWR{ID: wrRead<<16 | uint64(s.i), Op: gowarp.OpRead, Flags: gowarp.Signaled,
		RemoteAddr: a.Off, RKey: gowarp.STag(a.STag)})
	s.sges = append(s.sges[:0], gowarp.SGE{MR: cc.bounceMR, Offset: off, Length: n})
	s.wrs[0].SGL = s.sges[:1]
	if err := cc.post(s.wrs[0]); err != nil {
		return nil, cc.lostErr()
	}
	if err := cc.wait(ctx, s, 1, true); err != nil {
		return nil, err
	}
	b := cc.bounceMR.Bytes()[off : off+n]
	if !verifyPiece(b[:HeaderLen], e.Gen, b[HeaderLen:]) {
		return nil, fmt.Errorf("%w: piece 0 of %q", ErrStale, e.Key)
	}
	return b[HeaderLen:], nil
}

// writeAt allocates room for the value, writes it with RDMA Write (and a
// persistence flush if durable), then commits it.
func (cc *cliConn) writeAt(ctx context.Context, key string, src *gowarp.MR, srcOff, n int, o PutOptions) error {
	s, err := cc.acquire(ctx)
	if err != nil {
		return err
	}
	s.gaveUp = false
	defer func() {
		if !s.gaveUp && !cc.failed() {
			cc.release(s)
		}
	}()
	if _, err := cc.callIn(ctx, s, &Msg{Op: OpAlloc, Key: []byte(key), Size: uint64(n)}, nil); err != nil {
		return err
	}
	gen := s.reply.Gen
	addrs := append([]Addr(nil), s.reply.Addrs...)
	var sum uint64
	for _, a := range addrs {
		sum += uint64(a.Len)
	}
	if sum != uint64(n) || len(addrs) > maxPiecesPerCall {
		cc.fail(fmt.Errorf("%w: %d bytes allocated in %d pieces for %d", ErrMalformed, sum, len(addrs), n))
		return cc.lostErr()
	}
	s.wrs, s.sges = s.wrs[:0], s.sges[:0]
	pos := srcOff
	for _, a := range addrs {
		s.wrs = append(s.wrs, gowarp.SendWR{ID: wrWrite<<16 | uint64(s.i), Op: gowarp.OpWrite, Flags: gowarp.Signaled,
			RemoteAddr: a.Off + HeaderLen, RKey: gowarp.STag(a.STag)})
		s.sges = append(s.sges, gowarp.SGE{MR: src, Offset: pos, Length: int(a.Len)})
		pos += int(a.Len)
	}
	for i := range s.wrs {
		s.wrs[i].SGL = s.sges[i : i+1]
	}
	if _, err := cc.qp.PostSendList(s.wrs); err != nil {
		cc.fail(err)
		return cc.lostErr()
	}
	var fl uint8
	nf := 0
	if o.Durable {
		fl = FlagDurable
		for _, a := range addrs {
			wr := gowarp.FlushWR{ID: wrFlush<<16 | uint64(s.i), Flags: gowarp.Signaled, Type: gowarp.FlushPersistence,
				RKey: gowarp.STag(a.STag), RemoteAddr: a.Off + HeaderLen, Length: uint64(a.Len)}
			if err := cc.qp.PostFlush(&wr); err != nil {
				cc.fail(err)
				return cc.lostErr()
			}
			nf++
		}
	}
	done := int64(0)
	for i := range len(addrs) + nf {
		if err := cc.wait(ctx, s, 1, true); err != nil {
			return err
		}
		if o.Progress != nil && i < len(addrs) {
			done += int64(addrs[i].Len)
			o.Progress(done, int64(n))
		}
	}
	// The commit follows the Writes (and flushes) on the same queue pair:
	// the server sees it only after they are placed.
	_, err = cc.callIn(ctx, s, &Msg{Op: OpCommit, Flags: fl, Key: []byte(key), Gen: gen}, nil)
	return err
}
