// Package wire is gowarp's pure iWARP codec: MPA connection setup and framing
// (RFC 5044, RFC 6581), DDP headers (RFC 5041), RDMAP messages and Terminate
// (RFC 5040), and the MPA CRC32c.
//
// Nothing here does I/O or starts goroutines. Encoders append to a caller's
// slice (Append…), decoders take bytes and return a value, the number of
// bytes consumed and an error (Parse…). Decoded values may refer to
// sub-slices of the input. Every decoder checks lengths before it reads and
// never panics, whatever the input.
package wire
