// Package gowarp is a software RDMA stack: one-sided RDMA Read and Write,
// Send/Receive and completion queues over ordinary TCP, speaking iWARP
// (MPA, DDP and RDMAP) on the wire, so it interoperates with the Linux
// kernel's siw driver and rdma-core's tools.
//
// The model is the one of libibverbs and rdma_cm. A Device holds protection
// domains (PD); memory is registered in a PD as a memory region (MR) with
// access rights and an STag (the rkey/lkey). A queue pair (QP) has a send
// and a receive queue; work requests posted to them complete into
// completion queues (CQ), which any number of QPs may share. QPs are
// connected with Connect on one side and a Listener on the other.
//
//	dev := gowarp.Open()
//	pd := dev.AllocPD()
//	cq := dev.NewCQ(64)
//	qp, _ := pd.NewQP(gowarp.QPConfig{SendCQ: cq, RecvCQ: cq})
//	_ = qp.Connect(ctx, "10.0.0.2:7174", gowarp.ConnectOptions{})
//	buf := make([]byte, 4096)
//	mr, _ := pd.Register(buf, gowarp.LocalWrite)
//	_ = qp.PostSend(&gowarp.SendWR{ID: 1, Op: gowarp.OpWrite, Flags: gowarp.Signaled,
//		SGL: []gowarp.SGE{{MR: mr, Length: 4096}}, RemoteAddr: addr, RKey: rkey})
//	var wc [16]gowarp.Completion
//	_ = cq.Wait(ctx)
//	n := cq.Poll(wc[:])
package gowarp

import (
	"log/slog"
	"math/rand/v2"
	"sync/atomic"

	"github.com/gowarp/gowarp/internal/engine"
	"github.com/gowarp/gowarp/internal/mem"
)

// MR is a registered memory region. Its STag is both the local key in
// SGEs (through the *MR itself) and the remote key peers use.
type MR = mem.Region

// STag is a steering tag: a 24-bit index and an 8-bit key.
type STag = mem.STag

// Access is a set of rights on a memory region.
type Access = mem.Access

// Access rights.
const (
	LocalWrite       = mem.LocalWrite       // receives and Read sinks may write it
	RemoteRead       = mem.RemoteRead       // peers may RDMA Read it
	RemoteWrite      = mem.RemoteWrite      // peers may RDMA Write it
	RemoteInvalidate = mem.RemoteInvalidate // a peer's Send with Invalidate may kill its STag
)

// Work requests and completions.
type (
	SGE            = engine.SGE
	SendWR         = engine.SendWR
	RecvWR         = engine.RecvWR
	WROp           = engine.WROp
	WRFlags        = engine.WRFlags
	Completion     = engine.Completion
	CompletionOp   = engine.CompletionOp
	Status         = engine.Status
	State          = engine.State
	CompletionMode = engine.CompletionMode
	CQ             = engine.CQ
)

// Work request opcodes and flags.
const (
	OpSend    = engine.OpSend
	OpSendInv = engine.OpSendInv
	OpWrite   = engine.OpWrite
	OpRead    = engine.OpRead

	Signaled  = engine.Signaled
	Solicited = engine.Solicited
	Fence     = engine.Fence

	MaxSGE = engine.MaxSGE
)

// Completion kinds.
const (
	CompSend  = engine.CompSend
	CompWrite = engine.CompWrite
	CompRead  = engine.CompRead
	CompRecv  = engine.CompRecv
)

// Completion statuses; every one but Success is also an error value.
const (
	Success              = engine.Success
	LocalLengthError     = engine.LocalLengthError
	LocalQPError         = engine.LocalQPError
	LocalProtectionError = engine.LocalProtectionError
	WRFlushError         = engine.WRFlushError
	RemoteAccessError    = engine.RemoteAccessError
	RemoteOperationError = engine.RemoteOperationError
	RemoteInvalidRequest = engine.RemoteInvalidRequest
	FatalError           = engine.FatalError
)

// QP states.
const (
	StateIdle       = engine.StateIdle
	StateConnecting = engine.StateConnecting
	StateReady      = engine.StateReady
	StateClosing    = engine.StateClosing
	StateError      = engine.StateError
)

// Completion modes of signaled Sends and Writes.
const (
	Handed = engine.Handed
	Acked  = engine.Acked
)

// Errors.
var (
	ErrNotReady       = engine.ErrNotReady
	ErrQueueFull      = engine.ErrQueueFull
	ErrTooManySGE     = engine.ErrTooManySGE
	ErrBadOp          = engine.ErrBadOp
	ErrLocalAccess    = engine.ErrLocalAccess
	ErrPeerTerminated = engine.ErrPeerTerminated
	ErrTerminated     = engine.ErrTerminated
	ErrPeerClosed     = engine.ErrPeerClosed
	ErrClosed         = engine.ErrClosed
	ErrLinkLost       = engine.ErrLinkLost
	ErrCQOverrun      = engine.ErrCQOverrun
	ErrRegionBusy     = mem.ErrBusy
)

// Device is a software RDMA device: the STag table its regions live in and
// the protection domains that partition it.
type Device struct {
	table  *mem.Table
	nextPD atomic.Uint32
	log    *slog.Logger
}

// DeviceOption configures Open.
type DeviceOption func(*Device)

// WithLogger sets the logger for connection events and protocol errors
// (default slog.Default()).
func WithLogger(l *slog.Logger) DeviceOption { return func(d *Device) { d.log = l } }

// Open returns a new device.
func Open(opts ...DeviceOption) *Device {
	// STag indexes start at a random point, as siw does, so that STags of
	// a restarted process are unlikely to match stale ones.
	d := &Device{table: mem.NewTable(rand.Uint32()), log: slog.Default()}
	for _, o := range opts {
		o(d)
	}
	return d
}

// NewCQ returns a completion queue holding up to depth completions.
func (d *Device) NewCQ(depth int) *CQ { return engine.NewCQ(depth) }

// PD is a protection domain: regions and queue pairs of one PD can be
// used together; a peer connected to a QP reaches only its PD's regions.
type PD struct {
	dev *Device
	id  uint32
}

// AllocPD returns a new protection domain.
func (d *Device) AllocPD() *PD { return &PD{dev: d, id: d.nextPD.Add(1)} }

// Register registers buf as a memory region with the given rights. Its
// tagged offsets start at the buffer's address, as with libibverbs.
func (pd *PD) Register(buf []byte, access Access) (*MR, error) {
	return pd.dev.table.Register(pd.id, [][]byte{buf}, access, mem.Options{})
}

// RegisterOptions tune RegisterBuffers.
type RegisterOptions = mem.Options

// RegisterBuffers registers several buffers as one region with a single
// STag and one contiguous range of tagged offsets: a Write into it or a
// Read landing in it fills the buffers in order.
func (pd *PD) RegisterBuffers(bufs [][]byte, access Access, o RegisterOptions) (*MR, error) {
	return pd.dev.table.Register(pd.id, bufs, access, o)
}

// Prepared is a work request checked, pinned and encoded once and posted
// many times: see QP.Prepare.
type Prepared = engine.Prepared

// ErrReleased is returned by a post of a released Prepared.
var ErrReleased = engine.ErrReleased
