package gowarp

import (
	"context"
	"unsafe"

	"github.com/gowarp/gowarp/internal/engine"
)

// The work requests, SGEs and completions below are laid out field by
// field as the engine's (layout_test.go checks it), and an *MR or *QP is
// the address of the engine's region or queue pair: a post hands the
// caller's request to the engine by a pointer conversion, with no copy and
// no allocation, and Poll fills the caller's slice directly.

// MaxSGE is the most scatter/gather entries a work request may carry.
const MaxSGE = 8

// SGE is one scatter/gather element: Length bytes at Offset in a region.
type SGE struct {
	MR     *MR
	Offset int
	Length int
}

// WROp is the operation of a send-queue work request.
type WROp uint8

// Work request opcodes.
const (
	OpSend    WROp = iota + 1 // Send (with solicited event if the flag says so)
	OpSendInv                 // Send with Invalidate of InvalidateSTag
	OpWrite                   // RDMA Write
	OpRead                    // RDMA Read
	OpFlush                   // flush (remote completion); posted with QP.PostFlush
	// OpWriteImm is an RDMA Write followed by immediate data (Imm): the
	// peer learns from a completion that the Write has landed. It
	// consumes one of the peer's posted receives (none of whose memory
	// it writes), whose completion has WithImm set, Imm, and Bytes 0.
	// RFC 7306's Immediate Data; only toward a peer that negotiated it
	// (ConnectOptions.Extensions), else ErrNotSupported.
	OpWriteImm
	// OpSendImm is a Send carrying immediate data (Imm): the peer's
	// receive completes with its bytes, WithImm and Imm. Only toward a
	// peer that negotiated RFC 7306's extensions, as OpWriteImm.
	OpSendImm
	// OpFetchAdd adds CompareAdd to the 8 bytes at RemoteAddr (8-byte
	// aligned, in a region registered with RemoteAtomic) and returns
	// their original value into the one 8-byte SGE; OpCmpSwap replaces
	// them by Swap if they equal CompareAdd, returning the original too;
	// OpAtomicWrite replaces them by Swap (IBTA's 8-byte Atomic Write,
	// carried as an RFC 7306 CmpSwap whose comparison always holds),
	// returning the original value as well. The word is a uint64 in the
	// machine's byte order; the operations are atomic against each other
	// and against MR.AtomicAdd and MR.CompareAndSwap at the target, not
	// against RDMA Writes. They complete (CompAtomic) when the peer's
	// response has placed the value, and count against ORD like Reads.
	// RFC 7306 Atomic Operations: only toward a peer that negotiated
	// them, else ErrNotSupported; a misshapen one fails with ErrBadAtomic.
	OpFetchAdd
	OpCmpSwap
	OpAtomicWrite
)

func (o WROp) String() string { return engine.WROp(o).String() }

// WRFlags modify a work request.
type WRFlags uint8

// Work request flags.
const (
	// Signaled asks for a completion when the request completes
	// successfully. Failed requests always complete.
	Signaled WRFlags = 1 << iota
	// Solicited sets the solicited-event bit of a Send.
	Solicited
	// Fence holds the request until every earlier RDMA Read of the queue
	// pair has completed.
	Fence
)

// SendWR is a send-queue work request.
type SendWR struct {
	ID    uint64
	Op    WROp
	Flags WRFlags
	// SGL is the local memory: the data of a Send or Write, the sink of a
	// Read (several SGEs make several Read Requests, one per SGE).
	SGL []SGE
	// RemoteAddr and RKey name the remote memory of a Write or Read:
	// RKey is the STag of the peer's region (its MR.STag).
	RemoteAddr uint64
	RKey       STag
	// InvalidateSTag is the peer's STag a Send with Invalidate kills.
	InvalidateSTag STag
	// Imm is the immediate data of OpWriteImm and OpSendImm.
	Imm uint32
	// CompareAdd is the addend of OpFetchAdd and the comparand of
	// OpCmpSwap; Swap the new value of OpCmpSwap and OpAtomicWrite.
	CompareAdd uint64
	Swap       uint64
}

// RecvWR is a receive-queue work request: where a peer's Send lands.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// Status is the outcome of a work request, in the spirit of libibverbs'
// ibv_wc_status. Every status but Success is also an error value:
// errors.Is(err, WRFlushError).
type Status uint8

// Completion statuses.
const (
	Success              Status = iota
	LocalLengthError            // a received message did not fit the receive buffers
	LocalQPError                // the queue pair failed for a local reason
	LocalProtectionError        // local memory could not be used as asked
	WRFlushError                // the queue pair went to error before the request ran
	RemoteAccessError           // the peer refused access to its memory
	RemoteOperationError        // the peer could not carry the operation out
	RemoteInvalidRequest        // the peer found the request invalid
	FatalError                  // the connection broke
)

func (s Status) String() string { return engine.Status(s).String() }

// Error makes a Status usable as an error value.
func (s Status) Error() string { return engine.Status(s).Error() }

// CompletionOp says what kind of work a completion reports.
type CompletionOp uint8

// Completion kinds.
const (
	CompSend CompletionOp = iota + 1
	CompWrite
	CompRead
	CompRecv
	CompFlush // a flush (QP.PostFlush)
	CompAtomic
)

func (o CompletionOp) String() string { return engine.CompletionOp(o).String() }

// Completion is one entry of a completion queue.
type Completion struct {
	ID     uint64
	QP     *QP
	Op     CompletionOp
	Status Status
	// Bytes is the number of bytes received (receives) or transferred.
	Bytes int
	// Solicited is set on a receive whose Send carried a solicited event.
	Solicited bool
	// Invalidated is the local STag a Send with Invalidate killed (receives).
	Invalidated STag
	// Imm is the immediate data of a receive completed by the peer's
	// OpWriteImm or OpSendImm, which set WithImm. The Solicited flag of
	// either sets Solicited.
	Imm     uint32
	WithImm bool
}

// Err returns nil for a successful completion and its Status otherwise.
func (c *Completion) Err() error {
	if c.Status == Success {
		return nil
	}
	return c.Status
}

// The conversions to the engine's types: see the comment at the top.

func engSendWR(wr *SendWR) *engine.SendWR { return (*engine.SendWR)(unsafe.Pointer(wr)) }
func engRecvWR(wr *RecvWR) *engine.RecvWR { return (*engine.RecvWR)(unsafe.Pointer(wr)) }

func engSendWRs(wrs []SendWR) []engine.SendWR {
	return unsafe.Slice((*engine.SendWR)(unsafe.Pointer(unsafe.SliceData(wrs))), len(wrs))
}

func engSGEs(sges []SGE) []engine.SGE {
	return unsafe.Slice((*engine.SGE)(unsafe.Pointer(unsafe.SliceData(sges))), len(sges))
}

func engRecvWRs(wrs []RecvWR) []engine.RecvWR {
	return unsafe.Slice((*engine.RecvWR)(unsafe.Pointer(unsafe.SliceData(wrs))), len(wrs))
}

func engCompletions(wc []Completion) []engine.Completion {
	return unsafe.Slice((*engine.Completion)(unsafe.Pointer(unsafe.SliceData(wc))), len(wc))
}

// CQ is a completion queue, shared by any number of queue pairs.
type CQ struct {
	cq engine.CQ // by value: a *CQ is the engine's *CQ
}

func pubCQ(cq *engine.CQ) *CQ { return (*CQ)(unsafe.Pointer(cq)) }

// Cap returns the queue's depth.
func (cq *CQ) Cap() int { return cq.cq.Cap() }

// Len returns the number of completions waiting.
func (cq *CQ) Len() int { return cq.cq.Len() }

// Poll moves up to len(out) completions into out and returns how many.
// It never blocks, and it receives nothing: the queue pair's receive
// goroutine reads the peer's bytes meanwhile. To wait for a completion,
// use Wait (or QP.Progress), which receive on the waiting goroutine. A
// loop that spins on Poll must let that goroutine run: spinning with
// runtime.Gosched alone, gowarp perf -cq poll's Read round trips had a
// p99 of 4 ms in one process and 11 ms across two, and sleeping a
// microsecond between polls gave 71 µs and 196 µs. (Our reading, not
// measured: Go's scheduler serves its run queue, where Gosched puts the
// spinner, before it polls the network.)
func (cq *CQ) Poll(out []Completion) int { return cq.cq.Poll(engCompletions(out)) }

// Wait blocks until at least one completion is waiting or ctx is done.
// It returns ErrCQOverrun once the queue has overrun. A queue pair that
// fails completes its outstanding work as flushed, which ends the wait;
// one with no work outstanding completes nothing, and Wait goes on
// waiting: watch QP.Done (or Device.Events) for that.
//
// When the queue serves a single queue pair, the waiting goroutine
// receives on that queue pair's connection itself, as a TCP reader would:
// no hand-off from the receive goroutine, hence the lowest latency.
func (cq *CQ) Wait(ctx context.Context) error { return cq.cq.Wait(ctx) }

// Notify returns a channel that receives a token when completions arrive,
// for use in a select. Drain with Poll after each token.
func (cq *CQ) Notify() <-chan struct{} { return cq.cq.Notify() }
