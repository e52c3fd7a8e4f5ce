package rpc

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/gowarp/gowarp"
)

// Ref is a server's view of a span of the client's heap that a call
// passed by reference: an io.ReaderAt (and, if the client lent it
// writable, an io.WriterAt) that fetches only the bytes it is asked for,
// with RDMA Read, reading ahead when access is sequential. A Ref is
// valid until its call's handler returns; after that every method fails
// with ErrHandleExpired. A Ref is for one goroutine at a time.
type Ref struct {
	call *ServerCall
	idx  int
	gen  uint64
	h    Handle
	done chan gowarp.Status

	chunk      *gowarp.MR // staging for fetches, lent by the session
	wOff, wLen int64      // the span's bytes [wOff, wOff+wLen) are in chunk
	lastEnd    int64      // where the last ReadAt ended: sequential if the next starts there
	ahead      int64      // current read-ahead
}

func (r *Ref) grant(h Handle) {
	r.h, r.gen = h, r.call.gen.Load()
	r.wOff, r.wLen, r.lastEnd, r.ahead = 0, 0, -1, 0
}

// end gives back the staging chunk when the call ends.
func (r *Ref) end() {
	if r.chunk != nil {
		r.call.sess.putChunk(r.chunk)
		r.chunk = nil
	}
}

func (r *Ref) live() error {
	if r.gen != r.call.gen.Load() || !r.call.busy.Load() {
		return fmt.Errorf("%w: reference to STag %#08x", ErrHandleExpired, r.h.STag)
	}
	return nil
}

// Len returns the span's length.
func (r *Ref) Len() int64 { return int64(r.h.Len) }

// Writable reports whether the client lent the span for writing.
func (r *Ref) Writable() bool { return r.h.Writable }

// Handle returns the reference's wire form, which a handler may pass on
// inside an argument to another call of the same session (see Open).
func (r *Ref) Handle() Handle { return r.h }

// ReadAt reads len(p) bytes at offset off of the span, fetching what is
// not already staged. As io.ReaderAt, it returns io.EOF when the span
// ends first. No Read ever leaves the span: the range is checked here
// before it is asked for.
func (r *Ref) ReadAt(p []byte, off int64) (int, error) {
	if err := r.live(); err != nil {
		return 0, err
	}
	size := int64(r.h.Len)
	if off < 0 || off > size {
		return 0, fmt.Errorf("%w: read at %d of a %d-byte reference", ErrBadHandle, off, size)
	}
	var eof error
	if int64(len(p)) > size-off {
		p, eof = p[:size-off], io.EOF
	}
	seq := off == r.lastEnd
	r.lastEnd = off + int64(len(p))
	done := 0
	for done < len(p) {
		at := off + int64(done)
		if at >= r.wOff && at < r.wOff+r.wLen {
			n := copy(p[done:], r.chunk.Bytes()[at-r.wOff:r.wLen])
			done += n
			continue
		}
		want := int64(len(p) - done)
		if want >= fetchChunk && !seq {
			// A large read goes straight into p: registered for this read.
			if err := r.readDirect(p[done:], at); err != nil {
				return done, err
			}
			return len(p), eof
		}
		n := want
		if seq {
			r.ahead = min(max(2*r.ahead, readAhead0), fetchChunk)
			n = max(n, r.ahead)
		}
		n = min(n, fetchChunk, size-at)
		if err := r.fetch(at, n); err != nil {
			return done, err
		}
	}
	return len(p), eof
}

// fetch stages the span's bytes [at, at+n) in the chunk.
func (r *Ref) fetch(at, n int64) error {
	if r.chunk == nil {
		mr, err := r.call.sess.getChunk()
		if err != nil {
			return err
		}
		r.chunk = mr
	}
	r.wLen = 0
	if err := r.op(gowarp.OpRead, r.chunk, int(n), at); err != nil {
		return err
	}
	r.wOff, r.wLen = at, n
	r.call.sess.srv.stats.readBytes.Add(uint64(n))
	return nil
}

func (r *Ref) readDirect(p []byte, at int64) error {
	mr, err := r.call.sess.pd.Register(p, gowarp.LocalWrite)
	if err != nil {
		return err
	}
	defer mr.Deregister()
	if err := r.op(gowarp.OpRead, mr, len(p), at); err != nil {
		return err
	}
	r.call.sess.srv.stats.readBytes.Add(uint64(len(p)))
	return nil
}

// WriteAt writes p into the span at offset off with RDMA Write, if the
// client lent it writable; it returns once the bytes have left. The
// client sees them placed before it sees the reply.
func (r *Ref) WriteAt(p []byte, off int64) (int, error) {
	if err := r.live(); err != nil {
		return 0, err
	}
	if !r.h.Writable {
		return 0, fmt.Errorf("%w: STag %#08x", ErrReadOnly, r.h.STag)
	}
	if off < 0 || off > int64(r.h.Len) || int64(len(p)) > int64(r.h.Len)-off {
		return 0, fmt.Errorf("%w: write of %d bytes at %d of a %d-byte reference", ErrBadHandle, len(p), off, r.h.Len)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if off < r.wOff+r.wLen && r.wOff < off+int64(len(p)) {
		r.wLen = 0 // the staged bytes are stale now
	}
	mr, err := r.call.sess.pd.Register(p, 0)
	if err != nil {
		return 0, err
	}
	defer mr.Deregister()
	if err := r.op(gowarp.OpWrite, mr, len(p), off); err != nil {
		return 0, err
	}
	r.call.sess.srv.stats.writeBytes.Add(uint64(len(p)))
	return len(p), nil
}

// op posts one Read or Write between local memory mr and the span at
// off and waits for it. If the call's context ends first, it still waits
// for the operation, up to opDrain: memory the operation targets is never
// written after op returns, and a client that gave up on the call answers
// it all the same (from a sink: see Client.detach). Only a client that
// does not answer in that time loses its session (its queue pair closed
// before close returns).
func (r *Ref) op(kind gowarp.WROp, mr *gowarp.MR, n int, off int64) error {
	x := r.call.sess
	wr := gowarp.SendWR{
		ID: uint64(r.call.slot)<<8 | uint64(r.idx), Op: kind, Flags: gowarp.Signaled,
		SGL:        []gowarp.SGE{{MR: mr, Length: n}},
		RemoteAddr: r.h.Addr + uint64(off), RKey: gowarp.STag(r.h.STag),
	}
	if kind == gowarp.OpRead {
		x.srv.stats.reads.Add(1)
	}
	for {
		err := x.qp.PostSend(&wr)
		if err == nil {
			break
		}
		if err != gowarp.ErrQueueFull {
			return fmt.Errorf("%w: %w", ErrSessionClosed, err)
		}
		time.Sleep(20 * time.Microsecond)
	}
	var st gowarp.Status
	select {
	case st = <-r.done:
	case <-x.ctx.Done():
		// The session closed its queue pair before it said so: nothing
		// lands in mr any more.
		return fmt.Errorf("%w: %w", ErrSessionClosed, context.Cause(x.ctx))
	case <-r.call.ctx.Done():
		t := time.NewTimer(opDrain)
		defer t.Stop()
		select {
		case <-r.done:
		case <-x.ctx.Done():
		case <-t.C:
			x.close(fmt.Errorf("rpc: %s: %w, and a %s of its span did not end in %v", r.call.method.name, context.Cause(&r.call.ctx), kind, opDrain))
		}
		return fmt.Errorf("rpc: %w", r.call.ctx.Err())
	}
	if st != gowarp.Success {
		return fmt.Errorf("%w: %s of STag %#08x: %w", ErrSessionClosed, kind, r.h.STag, st)
	}
	return nil
}

// opDrain bounds how long a Read or Write of a call whose context ended
// may take to complete before the session is given up.
const opDrain = 5 * time.Second

// callCtx is a call's context, kept in its slot and reused: no
// allocation per call unless a handler asks for Done.
type callCtx struct {
	call *ServerCall
	mu   sync.Mutex
	done chan struct{}
	err  error
	dl   time.Time
	has  bool
	tm   *time.Timer
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (c *callCtx) reset() {
	c.mu.Lock()
	c.done, c.err, c.has = nil, nil, false
	c.mu.Unlock()
}

func (c *callCtx) setDeadline(t time.Time) {
	c.mu.Lock()
	c.dl, c.has = t, true
	if c.tm == nil {
		c.tm = time.AfterFunc(time.Until(t), c.expire)
	} else {
		c.tm.Reset(time.Until(t))
	}
	c.mu.Unlock()
}

// expire runs when a deadline's timer fires; a timer left from an earlier
// call of the slot finds the deadline not passed and does nothing.
func (c *callCtx) expire() {
	c.mu.Lock()
	late := c.has && !time.Now().Before(c.dl)
	c.mu.Unlock()
	if late {
		c.cancel(context.DeadlineExceeded)
	}
}

func (c *callCtx) cancel(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	if c.done == nil {
		c.done = closedChan
	} else {
		close(c.done)
	}
	if c.tm != nil && c.has {
		c.tm.Stop()
	}
}

func (c *callCtx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dl, c.has
}

func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
	}
	return c.done
}

// Err returns context.Canceled or context.DeadlineExceeded once the call
// ended. The cause (the caller canceled, the session closed) stays in
// c.err: context.Cause knows only the standard library's contexts and
// returns Err for this one.
func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.err {
	case nil:
		return nil
	case context.DeadlineExceeded:
		return context.DeadlineExceeded
	}
	return context.Canceled
}

func (c *callCtx) Value(key any) any { return nil }

func (c *callCtx) String() string { return "rpc.callCtx" }
