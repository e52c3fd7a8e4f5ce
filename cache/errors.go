package cache

import (
	"errors"
	"fmt"
)

// Errors. A client's calls return errors that match these with errors.Is
// (or gowarp's errors, or a context's).
var (
	// ErrNotFound: no value under the key.
	ErrNotFound = errors.New("cache: key not found")
	// ErrTooLarge: a value over the server's limit, or a key over MaxKey.
	ErrTooLarge = errors.New("cache: value or key too large")
	// ErrMalformed: a control message that does not parse.
	ErrMalformed = errors.New("cache: malformed message")
	// ErrVersion: a control message of another format version.
	ErrVersion = errors.New("cache: unknown message version")
	// ErrStale: a block address that no longer holds the value it was
	// given for (the block was paged out or reused): look the key up again.
	ErrStale = errors.New("cache: stale block address")
	// ErrBadRequest: a request the server refuses (an unknown generation
	// to commit, an empty key, a range outside the value).
	ErrBadRequest = errors.New("cache: bad request")
	// ErrFull: the server has no room for the value.
	ErrFull = errors.New("cache: no room")
	// ErrServer: the server failed to carry the request out (I/O).
	ErrServer = errors.New("cache: server error")
	// ErrUnavailable: the server could not be reached (a dial that
	// failed: refused, timed out, rejected), or the connection to it
	// failed while the call was out and a new one could not be made in
	// the call's tries. A call that fails so may or may not have been
	// carried out; the error wraps the cause as well (gowarp's errors, a
	// context's, the system's). After a dial that failed so, the client
	// does not dial that connection again for a while (50 ms, doubling
	// with each failure up to 2 s): calls meanwhile fail at once with the
	// same error.
	ErrUnavailable = errors.New("cache: server unavailable")
	// ErrClosed: the client is closed.
	ErrClosed = errors.New("cache: client closed")
)

// Status is a reply's outcome.
type Status uint8

// Statuses.
const (
	StatusOK Status = iota
	StatusNotFound
	StatusTooLarge
	StatusMalformed
	StatusVersion
	StatusBadRequest
	StatusFull
	StatusServer
	numStatus
)

var statusNames = [...]string{"ok", "not-found", "too-large", "malformed", "version", "bad-request", "full", "server"}

// String names the status, as metrics label it.
func (s Status) String() string {
	if s < numStatus {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

var statusErr = [...]error{nil, ErrNotFound, ErrTooLarge, ErrMalformed, ErrVersion, ErrBadRequest, ErrFull, ErrServer}

// statusOf is the status that tells a client about err.
func statusOf(err error) Status {
	for i, e := range statusErr {
		if e != nil && errors.Is(err, e) {
			return Status(i)
		}
	}
	return StatusServer
}

// err turns a reply's status and text into an error.
func (s Status) err(op Op, text []byte) error {
	if s == StatusOK {
		return nil
	}
	if s >= numStatus {
		return fmt.Errorf("%w: status %d", ErrMalformed, s)
	}
	if len(text) > 0 {
		return &serverError{err: statusErr[s], text: string(text)}
	}
	return fmt.Errorf("%w (%s)", statusErr[s], op)
}

// serverError is an error the server told: its text, matching the error
// of its status.
type serverError struct {
	err  error
	text string
}

func (e *serverError) Error() string { return e.text }
func (e *serverError) Unwrap() error { return e.err }
