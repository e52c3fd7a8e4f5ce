// Package rpc is remote procedure call over gowarp with call-by-reference:
// small arguments and results travel by value in one Send; a large
// argument stays in the client's session heap and only a handle (STag,
// offset, length, session and call) travels with the call. The server's
// handler reads the argument through a Ref, an io.ReaderAt that fetches
// with RDMA Read only the bytes it is asked for (reading ahead when
// access is sequential), and may write results straight into a writable
// span of the client's heap with RDMA Write.
//
//	srv := rpc.NewServer(dev, rpc.Options{})
//	srv.RegisterFunc("echo", func(ctx context.Context, arg []byte) ([]byte, error) { return arg, nil })
//	srv.Register("sum", func(ctx context.Context, c *rpc.ServerCall) error {
//		r, _ := c.Ref(0)
//		... r.ReadAt(p, off) ...
//		return c.Reply(result)
//	})
//	go srv.Serve(ctx, ln)
//
//	cl, _ := rpc.Dial(ctx, dev, addr, rpc.Options{})
//	reply, err := cl.Call(ctx, "echo", []byte("hi"), nil)
//	buf, _ := cl.Alloc(1 << 20)
//	err = cl.Do(ctx, &rpc.Call{Method: "sum", Refs: []rpc.Span{buf.All()}})
//
// # What protects the client's memory
//
// A session has its own protection domain on each side, so a peer's
// connection reaches only the regions of its own session. The client
// never registers its heap for remote access as a whole: each span a
// call lends is registered as a region of its own, exactly its bytes,
// with RemoteRead (and RemoteWrite only if lent Writable), and is out of
// the server's reach before Do returns, whatever the outcome. On a reply
// or an error it is deregistered. On a deadline or a cancellation the
// server may have a Read or Write of it on the wire, and an access to a
// deregistered STag ends the whole session (RFC 5040 Terminate), every
// other call with it; so the region is detached instead
// (gowarp.MR.Detach): the server's accesses reach a sink and succeed,
// and the region is deregistered when the server replies to the call, or
// the session ends. The engine checks every Read and Write a peer asks
// for against that region's bounds and rights, and a stale or forged
// STag names no region; a peer that tries either gets its connection
// terminated, which ends only its own session. So a server, even a
// malicious one that bypasses this package, can reach only the spans of
// calls still outstanding on its own session, and only with the rights
// lent. A deregistration or detachment waits while a Read Response the
// engine already accepted is still being sent: that answer carries bytes
// of the span, never more.
//
// The server's side checks too, before any RDMA operation: a Ref's reads
// and writes must lie inside its span, a Ref dies when its handler
// returns (ErrHandleExpired), and a handle that arrives in a call or is
// opened with ServerCall.Open must name this session and a call being
// served that was granted it (ErrBadHandle otherwise). These checks keep
// an honest server's bugs from reaching a client's engine; the client's
// protection does not depend on them.
//
// # Flow and speed
//
// A client has a fixed number of call slots (Options.Slots), each with a
// send buffer, and as many receive buffers for replies; the server posts
// one receive per slot plus a few for cancel messages, so no Send ever
// finds no receive posted. There is no goroutine per call on the client:
// callers poll the session's completion queue themselves, one at a time,
// the CQ's inline receive handing each its reply on its own goroutine
// when nobody else is polling. The server runs one poller per session,
// which runs a call by value itself: a watchdog hands the polling to a new
// goroutine only if the handler has not returned within 50 µs. A call
// with references gets a goroutine at once (its Reads need the poller).
// Methods registered non-blocking (RegisterNonBlocking) skip the watchdog
// and their replies leave in batches. A call sent while its client had
// others in flight says so (a flag in its header), and the poller hands
// the reply of such a call to the session's flusher goroutine instead of
// writing it itself: it receives on meanwhile, and the replies of the
// calls that come during one write share the next. A call by value
// allocates nothing on the client.
//
// Deadlines travel with the call, so the server's handler context ends
// when the caller's does; a caller that gives up also sends a cancel. A
// handler whose context ends while an RDMA Read it issued is outstanding
// tears its session down: that is the only way to be sure the Read no
// longer lands in its memory.
package rpc
