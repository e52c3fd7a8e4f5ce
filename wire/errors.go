package wire

import "errors"

// ErrShort means the input ends before the structure does; more bytes of the
// stream are needed. It is not a protocol error.
var ErrShort = errors.New("wire: short buffer")

// Malformed-input errors. Each names what is wrong with the bytes.
var (
	ErrMPAKey          = errors.New("wire: not an MPA request/reply key")
	ErrMPAPrivateData  = errors.New("wire: MPA private data longer than 512 bytes")
	ErrMPAEnhanced     = errors.New("wire: MPA enhanced frame without its IRD/ORD block")
	ErrCRC             = errors.New("wire: FPDU CRC mismatch")
	ErrULPDUTooShort   = errors.New("wire: ULPDU shorter than its DDP/RDMAP header")
	ErrULPDUTooLong    = errors.New("wire: ULPDU longer than 65535 bytes")
	ErrTerminateFormat = errors.New("wire: Terminate message shorter than its flags say")
	ErrNotFlush        = errors.New("wire: Read Request is not a flush")
)
