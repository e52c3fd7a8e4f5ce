package engine

import (
	"fmt"

	"github.com/gowarp/gowarp/internal/mem"
)

// MaxSGE is the most scatter/gather entries a work request may carry.
const MaxSGE = 8

// WROp is the operation of a send-queue work request.
type WROp uint8

const (
	OpSend    WROp = iota + 1 // Send (with solicited event if the flag says so)
	OpSendInv                 // Send with Invalidate of InvalidateSTag
	OpWrite                   // RDMA Write
	OpRead                    // RDMA Read
	OpFlush                   // flush (remote completion): QP.PostFlush
	// RFC 7306's, toward a peer that negotiated them (Params.Ext).
	OpWriteImm // RDMA Write, then Immediate Data: the peer's receive completes
	OpSendImm  // Send carrying Immediate Data
	// Atomics: one 8-byte local SGE receives the original value.
	OpFetchAdd    // add CompareAdd to the remote word
	OpCmpSwap     // replace the remote word by Swap if it equals CompareAdd
	OpAtomicWrite // replace the remote word by Swap (a masked CmpSwap that always matches)
)

// atomic reports whether o is an atomic operation.
func (o WROp) atomic() bool { return o >= OpFetchAdd && o <= OpAtomicWrite }

// waits reports whether o completes on the peer's response (Reads,
// atomics) rather than once sent.
func (o WROp) waits() bool { return o == OpRead || o == OpFlush || o.atomic() }

// ext reports whether o needs RFC 7306's extensions.
func (o WROp) ext() bool { return o >= OpWriteImm }

func (o WROp) String() string {
	switch o {
	case OpSend:
		return "send"
	case OpSendInv:
		return "send-inv"
	case OpWrite:
		return "write"
	case OpRead:
		return "read"
	case OpFlush:
		return "flush"
	case OpWriteImm:
		return "write-imm"
	case OpSendImm:
		return "send-imm"
	case OpFetchAdd:
		return "fetch-add"
	case OpCmpSwap:
		return "cmp-swap"
	case OpAtomicWrite:
		return "atomic-write"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// WRFlags modify a work request.
type WRFlags uint8

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

// SGE is one scatter/gather element: Length bytes at Offset in a region.
type SGE struct {
	MR     *mem.Region
	Offset int
	Length int
}

// SendWR is a send-queue work request, laid out as the root package's
// SendWR (documented there; layout_test.go keeps them alike).
type SendWR struct {
	ID             uint64
	Op             WROp
	Flags          WRFlags
	SGL            []SGE
	RemoteAddr     uint64
	RKey           uint32
	InvalidateSTag uint32
	Imm            uint32
	CompareAdd     uint64
	Swap           uint64
}

// RecvWR is a receive-queue work request: where a peer's Send lands.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// Status is the outcome of a work request, in the spirit of libibverbs'
// ibv_wc_status. Every status but Success is an error.
type Status uint8

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

var statusNames = [...]string{
	Success:              "success",
	LocalLengthError:     "local length error",
	LocalQPError:         "local QP operation error",
	LocalProtectionError: "local protection error",
	WRFlushError:         "work request flushed",
	RemoteAccessError:    "remote access error",
	RemoteOperationError: "remote operation error",
	RemoteInvalidRequest: "remote invalid request",
	FatalError:           "fatal error",
}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Error makes a Status usable as an error value: errors.Is(err, WRFlushError).
func (s Status) Error() string { return "gowarp: " + s.String() }

// CompletionOp says what kind of work a completion reports.
type CompletionOp uint8

const (
	CompSend CompletionOp = iota + 1
	CompWrite
	CompRead
	CompRecv
	CompFlush
	CompAtomic
)

func (o CompletionOp) String() string {
	switch o {
	case CompSend:
		return "send"
	case CompWrite:
		return "write"
	case CompRead:
		return "read"
	case CompRecv:
		return "recv"
	case CompFlush:
		return "flush"
	case CompAtomic:
		return "atomic"
	}
	return fmt.Sprintf("compop(%d)", uint8(o))
}

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
	Invalidated uint32
	// Imm is the immediate data of a receive with WithImm set.
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

func compOp(o WROp) CompletionOp {
	switch o {
	case OpWrite, OpWriteImm:
		return CompWrite
	case OpRead:
		return CompRead
	case OpFlush:
		return CompFlush
	case OpFetchAdd, OpCmpSwap, OpAtomicWrite:
		return CompAtomic
	}
	return CompSend
}
