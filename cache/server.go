package cache

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gowarp/gowarp"
	"github.com/gowarp/gowarp/wire"
)

// ServerOptions configure a server. Zero values mean the defaults.
type ServerOptions struct {
	// Dir is the data directory (default DefaultDir()), created if needed.
	Dir string
	// BlockSize is the size of a block (default 4 MiB, a multiple of the
	// page size). A data directory keeps the block size it was made with.
	BlockSize int64
	// Budget is how many bytes of blocks may be in memory (mapped and
	// registered) at once (default 1 GiB); the rest wait in their files.
	Budget int64
	// MaxValue is the largest value (default 64 MiB, or less when 64
	// blocks hold less).
	MaxValue int64
	// Slots is how many requests a client connection may have
	// outstanding (default 32).
	Slots int
	// IndexBuckets is the size of the client-readable index (a power of
	// two; default DefaultIndexBuckets, 128 bytes each); -1 serves no
	// index, and clients look every key up through the control path.
	IndexBuckets int
	// Device is the RDMA device to use (default a new one).
	Device *gowarp.Device
	Logger *slog.Logger
	// OnRequest, if set, is called after each request is answered, on the
	// connection's goroutine: for metrics.
	OnRequest func(op Op, status Status, valueBytes int, took time.Duration)
}

// Defaults.
const (
	DefaultBlockSize = 4 << 20
	DefaultBudget    = 1 << 30
	DefaultMaxValue  = 64 << 20
	DefaultSlots     = 32
	// MaxPieces is the most blocks one value spans: MaxValue is at most
	// MaxPieces × (BlockSize - HeaderLen).
	MaxPieces = 64
	// InlineMax is the largest value a put or get carries inline in its
	// control message; larger ones travel by RDMA Write and Read.
	InlineMax = 16 << 10
	// maxMsg is the size of a control message buffer.
	maxMsg = InlineMax + 4096
)

// DefaultDir is the default data directory: gowarp/cache under the
// user's cache directory.
func DefaultDir() (string, error) {
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("cache: %w", err)
	}
	return filepath.Join(d, "gowarp", "cache"), nil
}

func (o ServerOptions) withDefaults() (ServerOptions, error) {
	if o.Dir == "" {
		d, err := DefaultDir()
		if err != nil {
			return o, err
		}
		o.Dir = d
	}
	if o.BlockSize == 0 {
		o.BlockSize = DefaultBlockSize
	}
	if o.BlockSize%int64(gowarp.PageSize) != 0 || o.BlockSize < 2*HeaderLen || o.BlockSize > 1<<31 {
		return o, fmt.Errorf("cache: block size %d is not a multiple of the page size up to 2 GiB", o.BlockSize)
	}
	if o.Budget == 0 {
		o.Budget = DefaultBudget
	}
	most := MaxPieces * (o.BlockSize - HeaderLen)
	if o.MaxValue == 0 {
		o.MaxValue = min(DefaultMaxValue, most)
	}
	if o.MaxValue > most {
		return o, fmt.Errorf("cache: a value of %d bytes would take more than %d blocks of %d", o.MaxValue, MaxPieces, o.BlockSize)
	}
	if o.Slots == 0 {
		o.Slots = DefaultSlots
	}
	if o.IndexBuckets == 0 {
		o.IndexBuckets = DefaultIndexBuckets
	}

	if o.Device == nil {
		o.Device = gowarp.Open()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// Server is a cache server: it serves the control path over Send and
// Receive and lets clients read and write its blocks one-sided.
type Server struct {
	o   ServerOptions
	pd  *gowarp.PD
	st  *store
	log *slog.Logger

	mu     sync.Mutex
	conns  map[*srvConn]struct{}
	closed bool
	wg     sync.WaitGroup

	puts, gets, hits, misses, deletes, errs, bytesIn, bytesOut, durable, idxMisses atomic.Uint64
}

// NewServer opens (or creates) the data directory and loads its index.
// The blocks are registered as clients look them up, under the STags they
// had before a restart.
func NewServer(o ServerOptions) (*Server, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	pd := o.Device.AllocPD()
	st, err := openStore(o.Dir, o.BlockSize, o.Budget, o.MaxValue, o.IndexBuckets, pd)
	if err != nil {
		return nil, err
	}
	s := &Server{o: o, pd: pd, st: st, log: o.Logger, conns: make(map[*srvConn]struct{})}
	return s, nil
}

// Dir returns the data directory.
func (s *Server) Dir() string { return s.o.Dir }

// Stats returns a snapshot of the server's counters.
func (s *Server) Stats() Stats {
	st := Stats{Puts: s.puts.Load(), Gets: s.gets.Load(), Hits: s.hits.Load(), Misses: s.misses.Load(),
		Deletes: s.deletes.Load(), Errors: s.errs.Load(), BytesIn: s.bytesIn.Load(), BytesOut: s.bytesOut.Load(),
		DurablePuts: s.durable.Load(), BlockSize: uint64(s.o.BlockSize), Budget: uint64(s.o.Budget), IndexMisses: s.idxMisses.Load()}
	s.mu.Lock()
	st.Conns = uint64(len(s.conns))
	s.mu.Unlock()
	s.st.mu.Lock()
	st.Keys, st.Bytes, st.Blocks, st.Resident = uint64(len(s.st.vals)), s.st.bytes, uint64(len(s.st.blocks)), uint64(s.st.resident)
	st.PageIns, st.PageOuts = s.st.pageIns, s.st.pageOuts
	if x := s.st.idx; x != nil {
		st.IndexBuckets, st.IndexEntries, st.IndexUpdates = uint64(x.n), uint64(len(x.where)), x.seq
		st.IndexRemoves, st.IndexOverflow, st.IndexReads = x.removes, x.overflow, x.mr.Reads()
	}
	s.st.mu.Unlock()
	return st
}

// ClientInfo is a connected client, as Clients lists it.
type ClientInfo struct {
	Addr     string    // its address
	Since    time.Time // when it connected
	Requests uint64    // control-path requests it made
}

// Clients lists the clients connected now (one per connection: a client
// with several connections is listed for each), oldest first.
func (s *Server) Clients() []ClientInfo {
	s.mu.Lock()
	cs := make([]ClientInfo, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, ClientInfo{Addr: c.remote, Since: c.since, Requests: c.served.Load()})
	}
	s.mu.Unlock()
	slices.SortFunc(cs, func(a, b ClientInfo) int { return a.Since.Compare(b.Since) })
	return cs
}

// Listen listens on addr with the server's device, for Serve.
func (s *Server) Listen(addr string) (*gowarp.Listener, error) {
	ln, err := s.o.Device.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	return ln, nil
}

// ListenAndServe listens on addr and serves until ctx ends or Close.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	ln, err := s.Listen(addr)
	if err != nil {
		return err
	}
	return s.Serve(ctx, ln)
}

// Serve accepts clients on ln until ctx ends or Close; it closes ln.
func (s *Server) Serve(ctx context.Context, ln *gowarp.Listener) error {
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		req, err := ln.Accept(ctx)
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("cache: accept: %w", err)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			req.Reject(nil)
			return nil
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			if err := s.accept(ctx, req); err != nil {
				s.log.Info("cache: client not accepted", "from", req.RemoteAddr(), "err", err)
			}
		}()
	}
}

// Close ends every connection and closes the store.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for c := range s.conns {
		c.qp.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return s.st.close()
}

// hello is the private data of connection setup: the client's offer, the
// server's answer. The server's answer may go on with where its
// client-readable index is (a server without one, or of before it, stops
// at helloLen).
type hello struct {
	Version   uint8
	Slots     uint16
	MaxMsg    uint32
	BlockSize uint64
	MaxValue  uint64
	// The index: its layout version (0: none), STag, tagged offset of its
	// first bucket, and buckets (without the idxProbe-1 past the end).
	IdxVersion uint8
	IdxSTag    uint32
	IdxAddr    uint64
	IdxBuckets uint32
}

const (
	helloLen    = 1 + 2 + 4 + 8 + 8
	helloIdxLen = helloLen + 1 + 4 + 8 + 4
)

func (h hello) append(b []byte) []byte {
	b = append(b, h.Version)
	b = binary.BigEndian.AppendUint16(b, h.Slots)
	b = binary.BigEndian.AppendUint32(b, h.MaxMsg)
	b = binary.BigEndian.AppendUint64(b, h.BlockSize)
	b = binary.BigEndian.AppendUint64(b, h.MaxValue)
	if h.IdxVersion == 0 {
		return b
	}
	b = append(b, h.IdxVersion)
	b = binary.BigEndian.AppendUint32(b, h.IdxSTag)
	b = binary.BigEndian.AppendUint64(b, h.IdxAddr)
	return binary.BigEndian.AppendUint32(b, h.IdxBuckets)
}

func parseHello(b []byte) (hello, error) {
	if len(b) < helloLen {
		return hello{}, fmt.Errorf("%w: hello of %d bytes", ErrMalformed, len(b))
	}
	h := hello{Version: b[0], Slots: binary.BigEndian.Uint16(b[1:]), MaxMsg: binary.BigEndian.Uint32(b[3:]),
		BlockSize: binary.BigEndian.Uint64(b[7:]), MaxValue: binary.BigEndian.Uint64(b[15:])}
	if h.Version != Version {
		return h, fmt.Errorf("%w: hello of version %d", ErrVersion, h.Version)
	}
	if h.Slots == 0 || h.MaxMsg < minMsgLen {
		return h, fmt.Errorf("%w: hello with %d slots of %d bytes", ErrMalformed, h.Slots, h.MaxMsg)
	}
	if len(b) >= helloIdxLen {
		h.IdxVersion, h.IdxSTag = b[helloLen], binary.BigEndian.Uint32(b[helloLen+1:])
		h.IdxAddr, h.IdxBuckets = binary.BigEndian.Uint64(b[helloLen+5:]), binary.BigEndian.Uint32(b[helloLen+13:])
		n := h.IdxBuckets
		if h.IdxVersion != idxVersion || n == 0 || n&(n-1) != 0 || n > 1<<24 ||
			h.IdxAddr > math.MaxUint64-uint64(n+idxProbe)*idxBucketLen {
			h.IdxVersion = 0 // an index this client cannot read: the control path serves
		}
	}
	return h, nil
}

// srvConn is one client's connection: its queue pair, receive buffers (one
// per slot), reply buffers, and the allocations it has not committed.
type srvConn struct {
	s      *Server
	remote string    // the client's address, for Clients
	since  time.Time // when it connected
	served atomic.Uint64
	qp     *gowarp.QP
	cq     *gowarp.CQ
	recvMR *gowarp.MR
	sendMR *gowarp.MR
	recvs  []gowarp.RecvWR
	sends  []gowarp.SendWR
	sges   []gowarp.SGE
	free   []int    // reply buffers not in flight
	wait   [][2]int // receives (buffer, length) waiting for a reply buffer
	batch  []gowarp.SendWR
	rbatch []gowarp.RecvWR
	msg    int
	// pending are the allocations (OpAlloc) not yet committed, by
	// generation: a client that vanishes leaves them as dead space.
	pending map[uint64]*pendingPut
	in      Msg
	out     Msg
	scratch []byte
	addrs   []Addr
	crcs    []uint32 // a commit's pieces' CRCs
}

type pendingPut struct {
	key string
	rec *record
}

func (s *Server) accept(ctx context.Context, req *gowarp.ConnRequest) error {
	h, err := parseHello(req.PrivateData())
	if err != nil {
		return errors.Join(err, req.Reject([]byte("not a gowarp cache client")))
	}
	n := min(int(h.Slots), s.o.Slots)
	msg := min(int(h.MaxMsg), maxMsg)
	c := &srvConn{s: s, msg: msg, pending: make(map[uint64]*pendingPut), remote: req.RemoteAddr().String(), since: time.Now()}
	c.cq = s.o.Device.NewCQ(4*n + 16)
	if c.qp, err = s.pd.NewQP(gowarp.QPConfig{SendCQ: c.cq, RecvCQ: c.cq, SendDepth: 2 * n, RecvDepth: n}); err != nil {
		return errors.Join(err, req.Reject(nil))
	}
	if c.recvMR, err = s.pd.Register(make([]byte, n*msg), gowarp.LocalWrite); err != nil {
		return errors.Join(err, req.Reject(nil))
	}
	if c.sendMR, err = s.pd.Register(make([]byte, 2*n*msg), 0); err != nil {
		c.recvMR.Deregister()
		return errors.Join(err, req.Reject(nil))
	}
	c.recvs = make([]gowarp.RecvWR, n)
	for i := range c.recvs {
		c.recvs[i] = gowarp.RecvWR{ID: uint64(i), SGL: []gowarp.SGE{{MR: c.recvMR, Offset: i * msg, Length: msg}}}
	}
	c.sends = make([]gowarp.SendWR, 2*n)
	c.sges = make([]gowarp.SGE, 2*n)
	for i := range c.sends {
		c.sges[i] = gowarp.SGE{MR: c.sendMR, Offset: i * msg}
		c.sends[i] = gowarp.SendWR{ID: uint64(i), Op: gowarp.OpSend, Flags: gowarp.Signaled, SGL: c.sges[i : i+1]}
		c.free = append(c.free, i)
	}
	if _, err := c.qp.PostRecvList(c.recvs); err != nil {
		c.release()
		return errors.Join(err, req.Reject(nil))
	}
	reply := hello{Version: Version, Slots: uint16(n), MaxMsg: uint32(msg), BlockSize: uint64(s.o.BlockSize), MaxValue: uint64(s.o.MaxValue)}
	if x := s.st.idx; x != nil {
		reply.IdxVersion, reply.IdxSTag, reply.IdxAddr, reply.IdxBuckets = idxVersion, uint32(x.mr.STag()), x.mr.Addr(), uint32(x.n)
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := req.Accept(actx, c.qp, gowarp.ConnectOptions{PrivateData: reply.append(nil), IRD: 128, ORD: 1, BusyPoll: gowarp.DefaultBusyPoll}); err != nil {
		c.release()
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.release()
		return ErrClosed
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	c.serve()
	return nil
}

// release closes the queue pair and frees the connection's buffers and
// allocations.
func (c *srvConn) release() {
	c.qp.Close()
	c.recvMR.Deregister()
	c.sendMR.Deregister()
	st := c.s.st
	st.mu.Lock()
	for _, p := range c.pending {
		for _, e := range p.rec.ext {
			st.releaseSpan(e, true, false)
		}
	}
	st.mu.Unlock()
	c.pending = nil
}

// serve runs the connection until it fails or the server closes.
func (c *srvConn) serve() {
	defer func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
		c.release()
	}()
	var wc [32]gowarp.Completion
	ctx := context.Background()
	for {
		if err := c.cq.Wait(ctx); err != nil {
			c.s.log.Info("cache: connection", "err", err)
			return
		}
		for _, w := range wc[:c.cq.Poll(wc[:])] {
			if err := w.Err(); err != nil {
				if qe := c.qp.Err(); qe != nil && !errors.Is(qe, gowarp.ErrClosed) && !errors.Is(qe, gowarp.ErrPeerClosed) {
					c.s.log.Info("cache: client gone", "err", qe)
				}
				return
			}
			switch w.Op {
			case gowarp.CompSend:
				c.free = append(c.free, int(w.ID))
				if len(c.wait) > 0 {
					r := c.wait[0]
					c.wait = c.wait[1:]
					c.request(r[0], r[1])
				}
			case gowarp.CompRecv:
				if len(c.free) == 0 {
					c.wait = append(c.wait, [2]int{int(w.ID), w.Bytes})
					continue
				}
				c.request(int(w.ID), w.Bytes)
			}
		}
		// The replies to the requests of one poll leave together, in as
		// few writes as the socket takes, and their receives go back.
		if len(c.batch) > 0 {
			if _, err := c.qp.PostSendList(c.batch); err != nil {
				return
			}
			c.batch = c.batch[:0]
		}
		if len(c.rbatch) > 0 {
			if _, err := c.qp.PostRecvList(c.rbatch); err != nil {
				return
			}
			c.rbatch = c.rbatch[:0]
		}
	}
}

// request answers the request in receive buffer k (n bytes): the reply
// and the receive to post again join the batches.
func (c *srvConn) request(k, n int) {
	start := time.Now()
	c.served.Add(1)
	b := c.recvMR.Bytes()[k*c.msg : k*c.msg+n]
	// The request's bytes are decoded into c.in, which aliases the receive
	// buffer: the buffer goes back only after the reply is built.
	err := Decode(b, &c.in)
	if err != nil {
		c.in.Op = OpNone
	}
	c.out = Msg{Op: c.in.Op, ID: c.in.ID, Addrs: c.addrs[:0]}
	if err == nil {
		err = c.handle(&c.in, &c.out)
	}
	if err != nil {
		if !errors.Is(err, ErrNotFound) { // a miss, or nothing to delete: an answer, not an error
			c.s.errs.Add(1)
		}
		c.out = Msg{Op: c.in.Op, ID: c.in.ID, Status: statusOf(err), Value: []byte(err.Error())}
		if len(c.out.Value) > 512 {
			c.out.Value = c.out.Value[:512]
		}
	}
	j := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	buf := c.sendMR.Bytes()[j*c.msg : (j+1)*c.msg]
	if c.out.EncodedLen() > len(buf) {
		c.out = Msg{Op: c.in.Op, ID: c.in.ID, Status: StatusServer, Value: []byte("reply too large")}
	}
	c.sges[j].Length = len(c.out.Append(buf[:0]))
	if c.s.o.OnRequest != nil {
		c.s.o.OnRequest(c.out.Op, c.out.Status, len(c.in.Value)+len(c.out.Value), time.Since(start))
	}
	c.batch = append(c.batch, c.sends[j])
	c.rbatch = append(c.rbatch, c.recvs[k])
	c.addrs = c.out.Addrs
}

func (c *srvConn) handle(in, out *Msg) error {
	s, st := c.s, c.s.st
	if in.Status != StatusOK {
		return fmt.Errorf("%w: a request with a status", ErrBadRequest)
	}
	key := string(in.Key)
	needKey := in.Op != OpList && in.Op != OpStats
	if needKey && len(key) == 0 {
		return fmt.Errorf("%w: empty key", ErrBadRequest)
	}
	durable := in.Flags&FlagDurable != 0
	switch in.Op {
	case OpPut:
		if len(in.Value) > InlineMax {
			return fmt.Errorf("%w: inline value of %d bytes", ErrTooLarge, len(in.Value))
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		ext, err := st.alloc(int64(len(in.Value)), false)
		if err != nil {
			return err
		}
		gen := st.nextGen()
		r := &record{gen: gen, size: uint64(len(in.Value)), ext: ext, hasSum: true}
		// Blocks smaller than InlineMax hold an inline value in several
		// pieces.
		data := in.Value
		for i, e := range ext {
			piece := data[:e.n]
			data = data[e.n:]
			crc := crc32Of(piece)
			r.sum = wire.CombineCRC32c(r.sum, crc, int64(e.n))
			if err = st.writePiece(e, gen, i, piece, crc); err != nil {
				break
			}
		}
		if err == nil && durable {
			err = st.syncBlocks(ext)
		}
		if err == nil {
			err = st.commit(key, r, durable)
		}
		if err != nil {
			for _, e := range ext {
				st.releaseSpan(e, false, false)
			}
			return err
		}
		s.countPut(len(in.Value), durable)
		out.Gen = gen
	case OpGet, OpLookup:
		s.gets.Add(1)
		if in.Flags&FlagIndexMiss != 0 {
			s.idxMisses.Add(1)
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		r := st.vals[key]
		if r == nil {
			s.misses.Add(1)
			return fmt.Errorf("%w: %q", ErrNotFound, key)
		}
		s.hits.Add(1)
		out.Gen, out.Size = r.gen, r.size
		if in.Op == OpLookup && r.hasSum {
			// The value's sum, in the lookup reply's otherwise empty
			// value (a client before sums ignores it).
			out.Value = appendSum(c.scratch[:0], r.sum)
			c.scratch = out.Value
		}
		if in.Op == OpGet && r.size <= InlineMax {
			v, err := st.readValue(r, c.scratch[:0])
			if err != nil {
				return err
			}
			c.scratch = v
			out.Value, out.Flags = v, FlagInline
			s.bytesOut.Add(uint64(len(v)))
			return nil
		}
		a, err := st.addrs(r, out.Addrs)
		if err != nil {
			return err
		}
		out.Addrs = a
	case OpAlloc:
		st.mu.Lock()
		defer st.mu.Unlock()
		if len(c.pending) >= len(c.recvs) {
			return fmt.Errorf("%w: %d allocations not committed", ErrBadRequest, len(c.pending))
		}
		ext, err := st.alloc(int64(in.Size), true)
		if err != nil {
			return err
		}
		gen := st.nextGen()
		r := &record{gen: gen, size: in.Size, ext: ext}
		for i, e := range ext {
			// A pending header first: an old address into this space
			// (from before a restart) fails its check from now on.
			if err == nil {
				err = st.writeHeader(e, header{Gen: gen, Len: e.n, Flags: hdrPending, Piece: uint16(i)})
			}
		}
		if err == nil {
			out.Addrs, err = st.addrs(r, out.Addrs)
		}
		if err != nil {
			for _, e := range ext {
				st.releaseSpan(e, true, false)
			}
			return err
		}
		c.pending[gen] = &pendingPut{key: key, rec: r}
		out.Gen, out.Size = gen, in.Size
	case OpCommit:
		p := c.pending[in.Gen]
		if p == nil || p.key != key {
			return fmt.Errorf("%w: no allocation %d for %q on this connection", ErrBadRequest, in.Gen, key)
		}
		delete(c.pending, in.Gen)
		r := p.rec
		// What landed is summed off the lock (a value may be 64 MiB):
		// its blocks are pinned until the end of the commit.
		c.crcs = st.pieceCRCs(r, c.crcs[:0])
		st.mu.Lock()
		defer st.mu.Unlock()
		err := st.sealPieces(r, c.crcs)
		if err == nil && durable {
			err = st.syncBlocks(r.ext)
		}
		if err == nil {
			err = st.commit(key, r, durable)
		}
		for _, e := range r.ext {
			st.releaseSpan(e, true, false)
		}
		if err != nil {
			return err
		}
		s.countPut(int(r.size), durable)
		out.Gen = r.gen
	case OpDelete:
		st.mu.Lock()
		defer st.mu.Unlock()
		if err := st.delete(key); err != nil {
			return fmt.Errorf("%w: %q", err, key)
		}
		s.deletes.Add(1)
	case OpList:
		limit := int(min(in.Size, maxListLen))
		if limit == 0 {
			limit = maxListLen
		}
		st.mu.Lock()
		ks := st.keys(key, string(in.Value), limit+1)
		st.mu.Unlock()
		room := c.msg - minMsgLen - 64
		for i, k := range ks {
			if i == limit || room < 2+len(k) {
				out.Flags |= FlagMore
				break
			}
			room -= 2 + len(k)
			out.Keys = append(out.Keys, []byte(k))
		}
	case OpStats:
		stats := s.Stats()
		out.Value = stats.appendTo(c.scratch[:0])
		c.scratch = out.Value
	}
	return nil
}

func (s *Server) countPut(n int, durable bool) {
	s.puts.Add(1)
	s.bytesIn.Add(uint64(n))
	if durable {
		s.durable.Add(1)
	}
}

// pieceCRCs appends to dst the CRCs of what landed in the pieces of a
// value the client wrote with RDMA, read from the blocks' mappings. The
// store's lock is held only to find the blocks.
func (st *store) pieceCRCs(r *record, dst []uint32) []uint32 {
	st.mu.Lock()
	mems := make([][]byte, len(r.ext))
	for i, e := range r.ext {
		mems[i] = st.blocks[e.block].mr.Bytes()[int64(e.off)+HeaderLen : int64(e.off)+HeaderLen+int64(e.n)]
	}
	st.mu.Unlock()
	for _, m := range mems {
		dst = append(dst, crc32Of(m))
	}
	return dst
}

// sealPieces writes the headers of a value the client wrote with RDMA,
// given its pieces' CRCs (pieceCRCs), and sets the whole value's sum,
// combined from them.
func (st *store) sealPieces(r *record, crcs []uint32) error {
	r.sum, r.hasSum = 0, true
	for i, e := range r.ext {
		r.sum = wire.CombineCRC32c(r.sum, crcs[i], int64(e.n))
		if err := st.writeHeader(e, header{Gen: r.gen, Len: e.n, CRC: crcs[i], Piece: uint16(i)}); err != nil {
			return err
		}
	}
	return nil
}
