package cache

import (
	"encoding/binary"
	"fmt"
)

// The control path's messages travel in one Send each, request and reply
// alike. Every message has the same shape, so one pure decoder serves
// both directions:
//
//	version u8 | op u8 | flags u8 | status u8 | id u64 | gen u64 | size u64
//	key:   len u16, bytes
//	value: len u32, bytes (an inline value, an error text, a stats block)
//	addrs: n u16, n × (stag u32, off u64, len u32)
//	keys:  n u16, n × (len u16, bytes)
//
// A field an op does not use is empty. Integers are big-endian.

// Version is the control path's message format version.
const Version = 1

// Op is a control message's operation.
type Op uint8

// Operations. A reply carries its request's op; the reply to a request
// that does not parse has OpNone and an error status.
const (
	OpNone   Op = iota
	OpPut       // key, value inline: store it
	OpGet       // key: the value inline, or its addresses when large
	OpAlloc     // key, size: extents to write the value into with RDMA Write
	OpCommit    // key, gen: make the written value the key's
	OpLookup    // key: the value's addresses, generation and size (and its sum in value, from a server that keeps sums)
	OpDelete    // key
	OpList      // key as prefix, value as the key to start after, size as the limit
	OpStats     // the server's counters
	numOps
)

func (o Op) String() string {
	names := [...]string{"none", "put", "get", "alloc", "commit", "lookup", "delete", "list", "stats"}
	if o < numOps {
		return names[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Message flags.
const (
	// FlagDurable (put, commit): acknowledge only once the value and the
	// index entry are on stable storage.
	FlagDurable uint8 = 1 << iota
	// FlagInline (get reply): the value is inline, not in Addrs.
	FlagInline
	// FlagMore (list reply): more keys follow the last one.
	FlagMore
	// FlagIndexMiss (get, lookup): the client reads the index, which did
	// not answer for the key (not there, or an entry that failed):
	// counted in Stats.IndexMisses.
	FlagIndexMiss
)

// Limits of the format.
const (
	MaxKey     = 250 // as memcached's
	maxAddrs   = 4096
	headerLen  = 4 + 8 + 8 + 8
	addrLen    = 4 + 8 + 4
	minMsgLen  = headerLen + 2 + 4 + 2 + 2
	maxListLen = 1024
)

// Addr is where a piece of a value lives: an RDMA address in the server's
// blocks. The piece starts with a block header (HeaderLen bytes), then
// Len bytes of the value.
type Addr struct {
	STag uint32
	Off  uint64 // tagged offset of the piece's header
	Len  uint32 // bytes of the value in the piece (after the header)
}

// Msg is one control message, decoded. Its slices point into the bytes it
// was decoded from.
type Msg struct {
	Op     Op
	Flags  uint8
	Status Status
	ID     uint64
	Gen    uint64
	Size   uint64
	Key    []byte
	Value  []byte
	Addrs  []Addr
	Keys   [][]byte
}

// Append encodes m after b.
func (m *Msg) Append(b []byte) []byte {
	b = append(b, Version, byte(m.Op), m.Flags, byte(m.Status))
	b = binary.BigEndian.AppendUint64(b, m.ID)
	b = binary.BigEndian.AppendUint64(b, m.Gen)
	b = binary.BigEndian.AppendUint64(b, m.Size)
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Key)))
	b = append(b, m.Key...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(m.Value)))
	b = append(b, m.Value...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Addrs)))
	for _, a := range m.Addrs {
		b = binary.BigEndian.AppendUint32(b, a.STag)
		b = binary.BigEndian.AppendUint64(b, a.Off)
		b = binary.BigEndian.AppendUint32(b, a.Len)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Keys)))
	for _, k := range m.Keys {
		b = binary.BigEndian.AppendUint16(b, uint16(len(k)))
		b = append(b, k...)
	}
	return b
}

// EncodedLen is the length of m's encoding.
func (m *Msg) EncodedLen() int {
	n := minMsgLen + len(m.Key) + len(m.Value) + addrLen*len(m.Addrs)
	for _, k := range m.Keys {
		n += 2 + len(k)
	}
	return n
}

// Decode parses one message. It never panics and keeps nothing of b but
// the slices of m, which alias it; addrs and keys, when not nil, are
// reused for m's lists (so a decoder in a loop allocates nothing).
func Decode(b []byte, m *Msg) error {
	addrs, keys := m.Addrs[:0], m.Keys[:0]
	*m = Msg{}
	if len(b) < minMsgLen {
		return fmt.Errorf("%w: %d bytes, less than a header", ErrMalformed, len(b))
	}
	if b[0] != Version {
		return fmt.Errorf("%w: version %d, want %d", ErrVersion, b[0], Version)
	}
	m.Op, m.Flags, m.Status = Op(b[1]), b[2], Status(b[3])
	if m.Op >= numOps || m.Op == OpNone && m.Status == StatusOK {
		return fmt.Errorf("%w: unknown op %d", ErrMalformed, b[1])
	}
	if m.Status >= numStatus {
		return fmt.Errorf("%w: unknown status %d", ErrMalformed, b[3])
	}
	m.ID = binary.BigEndian.Uint64(b[4:])
	m.Gen = binary.BigEndian.Uint64(b[12:])
	m.Size = binary.BigEndian.Uint64(b[20:])
	r := reader{b: b[headerLen:]}
	m.Key = r.bytes(int(r.u16()))
	if len(m.Key) > MaxKey {
		return fmt.Errorf("%w: key of %d bytes", ErrMalformed, len(m.Key))
	}
	m.Value = r.bytes(int(r.u32()))
	n := int(r.u16())
	if n > maxAddrs {
		return fmt.Errorf("%w: %d addresses", ErrMalformed, n)
	}
	if n > 0 {
		if r.len() < n*addrLen {
			return fmt.Errorf("%w: %d addresses in %d bytes", ErrMalformed, n, r.len())
		}
		for range n {
			addrs = append(addrs, Addr{STag: r.u32(), Off: r.u64(), Len: r.u32()})
		}
		m.Addrs = addrs
	}
	n = int(r.u16())
	if n > maxListLen {
		return fmt.Errorf("%w: %d keys", ErrMalformed, n)
	}
	for range n {
		k := r.bytes(int(r.u16()))
		if len(k) > MaxKey {
			return fmt.Errorf("%w: listed key of %d bytes", ErrMalformed, len(k))
		}
		keys = append(keys, k)
	}
	if n > 0 {
		m.Keys = keys
	}
	if r.short {
		return fmt.Errorf("%w: truncated %s message of %d bytes", ErrMalformed, m.Op, len(b))
	}
	if r.len() != 0 {
		return fmt.Errorf("%w: %d bytes after the %s message", ErrMalformed, r.len(), m.Op)
	}
	return nil
}

// reader takes fields off a buffer; once short it returns zeros.
type reader struct {
	b     []byte
	short bool
}

func (r *reader) len() int { return len(r.b) }

func (r *reader) take(n int) []byte {
	if r.short || n > len(r.b) {
		r.short = true
		return nil
	}
	p := r.b[:n:n]
	r.b = r.b[n:]
	return p
}

func (r *reader) u16() uint16 {
	if p := r.take(2); p != nil {
		return binary.BigEndian.Uint16(p)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if p := r.take(4); p != nil {
		return binary.BigEndian.Uint32(p)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if p := r.take(8); p != nil {
		return binary.BigEndian.Uint64(p)
	}
	return 0
}

func (r *reader) bytes(n int) []byte {
	p := r.take(n)
	if p == nil && n == 0 && !r.short {
		return nil
	}
	return p
}

// Stats are a server's counters, as the stats op returns them. It is the
// snapshot Server.Stats gives, for a metrics exporter or a status page.
type Stats struct {
	Keys        uint64 // values stored
	Bytes       uint64 // bytes of values stored
	Blocks      uint64 // blocks in the data directory
	Resident    uint64 // blocks mapped and registered now
	BlockSize   uint64
	Budget      uint64 // bytes of blocks allowed in memory
	Puts        uint64
	Gets        uint64 // gets and lookups
	Hits        uint64
	Misses      uint64
	Deletes     uint64
	PageIns     uint64
	PageOuts    uint64
	Errors      uint64 // requests answered with an error, but for not found (a Get's is a miss)
	Conns       uint64 // clients connected now
	BytesIn     uint64 // value bytes put
	BytesOut    uint64 // value bytes got inline
	DurablePuts uint64

	// The client-readable index (zeros when the server has none):
	IndexBuckets  uint64 // its size in buckets
	IndexEntries  uint64 // buckets holding a key now
	IndexUpdates  uint64 // buckets written (each bumps the index's sequence)
	IndexRemoves  uint64 // buckets cleared
	IndexOverflow uint64 // values left out (key too long, several pieces, neighbourhood full)
	// IndexReads counts clients' one-sided RDMA Reads of the index: the
	// lookups served without the control path (a torn bucket read again
	// counts twice).
	IndexReads uint64
	// IndexMisses counts the lookups of clients that read the index that
	// came to the control path all the same (FlagIndexMiss).
	IndexMisses uint64
}

// statsFields is how many fields a stats block has at least: those of
// the first version. Fields added since follow them, and a block from an
// older server just lacks them (they read as zero).
const statsFields = 18

func (s *Stats) fields() []*uint64 {
	return []*uint64{&s.Keys, &s.Bytes, &s.Blocks, &s.Resident, &s.BlockSize, &s.Budget, &s.Puts, &s.Gets,
		&s.Hits, &s.Misses, &s.Deletes, &s.PageIns, &s.PageOuts, &s.Errors, &s.Conns, &s.BytesIn, &s.BytesOut, &s.DurablePuts,
		&s.IndexBuckets, &s.IndexEntries, &s.IndexUpdates, &s.IndexRemoves, &s.IndexOverflow, &s.IndexReads, &s.IndexMisses}
}

func (s *Stats) appendTo(b []byte) []byte {
	for _, f := range s.fields() {
		b = binary.BigEndian.AppendUint64(b, *f)
	}
	return b
}

// decodeStats parses a stats block; a longer one (a newer server) is
// read as far as this version knows, a shorter one (an older server's)
// as far as it goes.
func decodeStats(b []byte) (Stats, error) {
	var s Stats
	if len(b) < 8*statsFields {
		return s, fmt.Errorf("%w: stats of %d bytes", ErrMalformed, len(b))
	}
	for i, f := range s.fields() {
		if 8*i+8 > len(b) {
			break
		}
		*f = binary.BigEndian.Uint64(b[8*i:])
	}
	return s, nil
}

// appendSum encodes a value's CRC32c as a lookup reply carries it.
func appendSum(b []byte, sum uint32) []byte { return binary.BigEndian.AppendUint32(b, sum) }

// parseSum reads the sum of a lookup reply's value: none (ok false) when
// it is not 4 bytes, as from a server before sums.
func parseSum(v []byte) (sum uint32, ok bool) {
	if len(v) != 4 {
		return 0, false
	}
	return binary.BigEndian.Uint32(v), true
}
