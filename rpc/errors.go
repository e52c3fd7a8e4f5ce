package rpc

import (
	"context"
	"errors"
	"fmt"
)

// Errors. Errors from the server arrive as *Error, which matches the one
// of these its status names (errors.Is).
var (
	// ErrMalformed: a message that does not decode.
	ErrMalformed = errors.New("rpc: malformed message")
	// ErrUnknownMethod: the server has no such method.
	ErrUnknownMethod = errors.New("rpc: unknown method")
	// ErrBadHandle: a handle the server refuses before any RDMA Read:
	// forged, from another session or call, or a range outside it.
	ErrBadHandle = errors.New("rpc: bad handle")
	// ErrHandleExpired: a reference used after its call ended.
	ErrHandleExpired = errors.New("rpc: handle used after its call")
	// ErrReadOnly: WriteAt on a reference the client did not lend for writing.
	ErrReadOnly = errors.New("rpc: reference is read-only")
	// ErrTooLarge: an argument or reply larger than a message; pass it by
	// reference instead.
	ErrTooLarge = errors.New("rpc: too large for a message")
	// ErrCanceled: the server's handler saw its call canceled.
	ErrCanceled = errors.New("rpc: canceled on the server")
	// ErrInternal: the handler panicked.
	ErrInternal = errors.New("rpc: handler panicked")
	// ErrApplication: the handler returned an error.
	ErrApplication = errors.New("rpc: handler error")
	// ErrHeapFull: Client.Alloc found no free run of the size asked for
	// in the session heap (Options.HeapSize); a Free makes room.
	ErrHeapFull = errors.New("rpc: session heap full")
	// ErrSessionClosed: the session ended (closed, or its peer died)
	// while the call was outstanding or before it started.
	ErrSessionClosed = errors.New("rpc: session closed")
)

// Error is an error that crossed the wire: the server's status and
// message for one call.
type Error struct {
	Method string
	Status uint8
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("rpc: %s: %s", e.Method, e.Msg) }

// Unwrap returns the sentinel of the error's status; a deadline that
// passed on the server also matches context.DeadlineExceeded.
func (e *Error) Unwrap() []error {
	if e.Status == statusDeadline {
		return []error{ErrCanceled, context.DeadlineExceeded}
	}
	return []error{statusErr(e.Status)}
}

func statusErr(s uint8) error {
	switch s {
	case statusUnknownMethod:
		return ErrUnknownMethod
	case statusBadCall:
		return ErrMalformed
	case statusBadHandle:
		return ErrBadHandle
	case statusCanceled:
		return ErrCanceled
	case statusTooLarge:
		return ErrTooLarge
	case statusInternal:
		return ErrInternal
	}
	return ErrApplication
}

// errStatus says which status an error from a handler is sent with.
func errStatus(err error) uint8 {
	switch {
	case errors.Is(err, ErrBadHandle), errors.Is(err, ErrHandleExpired):
		return statusBadHandle
	case errors.Is(err, ErrTooLarge):
		return statusTooLarge
	case errors.Is(err, ErrCanceled):
		return statusCanceled
	}
	return statusError
}
