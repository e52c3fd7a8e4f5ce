package wire

import "fmt"

// A flush (remote completion, gowarp's capability C10, after IBTA's FLUSH
// of the IB 1.5 Memory Placement Extensions) travels as an RDMA Read
// Request of size zero, so that a peer that does not know it answers it
// as the zero-length Read it is: with a zero-length Read Response, sent
// once every earlier message of the stream was processed (a placement
// fence). A gowarp responder reads more in it:
//
//   - Data Sink STag: index 0 (never a valid STag, in gowarp or siw) and
//     key FlushKey|placement type: this marks the request as a flush. A
//     Read Response carries it back unchanged, and nothing is placed.
//   - Data Sink TO: the length of the range; 0 flushes the whole region
//     (IBTA's "memory region" selectivity).
//   - Data Source STag and TO: the region (through one of its keys) and
//     the range's start, as an RDMA Read names its source.
//
// An RTR (RFC 6581) and any other zero-length Read carry another sink
// STag and stay what they were.

// FlushKey is the sink STag of a flush request, less its placement type.
const FlushKey = 0xf0

// FlushType is a flush's placement type (IBTA's FLUSH "placement type").
type FlushType uint8

const (
	// FlushVisibility asks that the Writes before it be placed: visible
	// to every reader of the responder's memory (global visibility).
	FlushVisibility FlushType = 0
	// FlushPersistence asks that they also be on the stable storage of
	// the region's backing file (persistence).
	FlushPersistence FlushType = 1
)

func (t FlushType) String() string {
	switch t {
	case FlushVisibility:
		return "global visibility"
	case FlushPersistence:
		return "persistence"
	}
	return fmt.Sprintf("flush type %d", uint8(t))
}

// Flush is a decoded flush request.
type Flush struct {
	Type FlushType
	STag uint32 // the region, through one of its keys
	TO   uint64 // the range's start (ignored when Len is 0)
	Len  uint64 // the range's length; 0 is the whole region
}

// ReadRequest returns the Read Request body that carries f.
func (f *Flush) ReadRequest() ReadRequest {
	return ReadRequest{SinkSTag: FlushKey | uint32(f.Type), SinkTO: f.Len, SourceSTag: f.STag, SourceTO: f.TO}
}

// AsFlush reads a Read Request body as a flush. It reports false for any
// other Read Request: one with a size, or another sink STag.
func AsFlush(r *ReadRequest) (Flush, bool) {
	if r.Size != 0 || r.SinkSTag&^1 != FlushKey {
		return Flush{}, false
	}
	return Flush{Type: FlushType(r.SinkSTag & 1), STag: r.SourceSTag, TO: r.SourceTO, Len: r.SinkTO}, true
}

// ParseFlush decodes a Read Request body that carries a flush. A body
// too short is ErrULPDUTooShort; a Read Request that is not a flush is
// ErrNotFlush.
func ParseFlush(b []byte) (Flush, int, error) {
	r, n, err := ParseReadRequest(b)
	if err != nil {
		return Flush{}, 0, err
	}
	f, ok := AsFlush(&r)
	if !ok {
		return Flush{}, 0, ErrNotFlush
	}
	return f, n, nil
}
