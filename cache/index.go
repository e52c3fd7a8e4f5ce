package cache

import (
	"encoding/binary"
	"fmt"
	"hash/crc64"

	"github.com/gowarp/gowarp"
)

// The client-readable index, as Pilaf and FaRM serve lookups: the server
// keeps a copy of its key → address table in a registered region that
// clients read with one RDMA Read, so that a lookup needs no Send and no
// work of the server's CPU beyond the responder's.
//
// The region is a hash table of idxBuckets fixed-size buckets (plus
// idxProbe-1 at the end, so that a key's neighbourhood never wraps). A
// key lives in one of the idxProbe buckets from its home bucket, FNV-1a
// of the key modulo the table's size; the client reads the whole
// neighbourhood in one Read. A bucket (idxBucketLen bytes, big-endian):
//
//	sum u64 | seq u64 | gen u64 | size u64 | off u64 | stag u32 | len u32 |
//	keylen u16 | flags u16 | key [idxKeyMax]byte
//
// sum is the CRC-64 (ECMA) of the bucket's other bytes: the server
// rewrites a bucket while clients may be reading it, so a Read can see
// half of one entry and half of another (a torn read). The sum makes
// such a bucket fail (the client reads again, or asks the control path),
// and the entry found is then checked again against the value's own
// piece header (generation and CRC), so an entry that is stale (the key
// was replaced, the block reused) never yields other bytes than the
// value it names. Only values of one piece whose key fits the bucket
// are indexed; the rest, and keys whose neighbourhood is full, are found
// through the control path, which is also where a client turns when the
// index does not have the key (the index says nothing about a miss).

const (
	idxVersion   = 1
	idxBucketLen = 128
	idxKeyMax    = idxBucketLen - 52
	idxProbe     = 4
	// DefaultIndexBuckets is the default size of the index: 64 Ki
	// buckets, 8 MiB.
	DefaultIndexBuckets = 1 << 16
)

var crc64Table = crc64.MakeTable(crc64.ECMA)

// idxEntry is one bucket's entry.
type idxEntry struct {
	seq  uint64
	gen  uint64
	size uint64
	addr Addr
	key  []byte // aliases the bucket it was decoded from
}

// idxHome is the home bucket of key in a table of n buckets (a power of
// two): FNV-1a, which clients and servers compute alike.
func idxHome(key []byte, n int) int {
	h := uint64(14695981039346656037)
	for _, c := range key {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return int(h & uint64(n-1))
}

// putBucket encodes e into b (idxBucketLen bytes).
func putBucket(b []byte, e *idxEntry) {
	b = b[:idxBucketLen]
	binary.BigEndian.PutUint64(b[8:], e.seq)
	binary.BigEndian.PutUint64(b[16:], e.gen)
	binary.BigEndian.PutUint64(b[24:], e.size)
	binary.BigEndian.PutUint64(b[32:], e.addr.Off)
	binary.BigEndian.PutUint32(b[40:], e.addr.STag)
	binary.BigEndian.PutUint32(b[44:], e.addr.Len)
	binary.BigEndian.PutUint16(b[48:], uint16(len(e.key)))
	binary.BigEndian.PutUint16(b[50:], 0)
	clear(b[52+copy(b[52:], e.key):])
	binary.BigEndian.PutUint64(b, crc64.Checksum(b[8:], crc64Table))
}

// Outcomes of parseBucket.
const (
	bucketEmpty = iota
	bucketEntry
	bucketTorn // the sum does not match, or the fields do not make sense
)

// parseBucket decodes one bucket. It never panics; a bucket that is not
// all zeros and fails its sum or its bounds is torn. The entry's key
// aliases b.
func parseBucket(b []byte, e *idxEntry) int {
	if len(b) < idxBucketLen {
		return bucketTorn
	}
	b = b[:idxBucketLen]
	kl := int(binary.BigEndian.Uint16(b[48:]))
	sum := binary.BigEndian.Uint64(b)
	if kl == 0 && sum == 0 && allZero(b) {
		return bucketEmpty
	}
	if kl == 0 || kl > idxKeyMax || crc64.Checksum(b[8:], crc64Table) != sum {
		return bucketTorn
	}
	*e = idxEntry{seq: binary.BigEndian.Uint64(b[8:]), gen: binary.BigEndian.Uint64(b[16:]), size: binary.BigEndian.Uint64(b[24:]),
		addr: Addr{Off: binary.BigEndian.Uint64(b[32:]), STag: binary.BigEndian.Uint32(b[40:]), Len: binary.BigEndian.Uint32(b[44:])},
		key:  b[52 : 52+kl : 52+kl]}
	if e.size != uint64(e.addr.Len) {
		return bucketTorn // one piece holds the whole value
	}
	return bucketEntry
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// findBucket looks key up in a neighbourhood read from the index: the
// entry of the key (the newest, should two show it), found; or torn when
// some bucket failed its check and none matched (a reader tries again).
func findBucket(nb []byte, key []byte) (e idxEntry, found, torn bool) {
	var x idxEntry
	for off := 0; off+idxBucketLen <= len(nb); off += idxBucketLen {
		switch parseBucket(nb[off:], &x) {
		case bucketTorn:
			torn = true
		case bucketEntry:
			if string(x.key) == string(key) && (!found || x.gen > e.gen) {
				e, found = x, true
			}
		}
	}
	return e, found, torn && !found
}

// index is the server's side: the region and where each key is.
// Its methods are called with the store's mutex held.
type index struct {
	mr    *gowarp.MR
	b     []byte
	n     int            // buckets of the table proper (a power of two)
	where map[string]int // key → its bucket
	used  []bool
	seq   uint64
	// overflow counts values not indexed: a full neighbourhood, a key too
	// long, more than one piece.
	overflow uint64
	removes  uint64 // buckets cleared (a delete, a value no longer indexed)
}

func newIndex(pd *gowarp.PD, n int) (*index, error) {
	if n <= 0 || n&(n-1) != 0 || n > 1<<24 {
		return nil, fmt.Errorf("cache: index of %d buckets (a power of two up to 16 Mi)", n)
	}
	total := n + idxProbe - 1
	mr, err := pd.Register(make([]byte, total*idxBucketLen), gowarp.RemoteRead)
	if err != nil {
		return nil, fmt.Errorf("cache: index: %w", err)
	}
	return &index{mr: mr, b: mr.Bytes(), n: n, where: make(map[string]int), used: make([]bool, total)}, nil
}

// set indexes key at the piece of r (or removes it when r cannot be
// indexed).
func (x *index) set(key string, r *record, a Addr) {
	if len(key) > idxKeyMax || len(r.ext) != 1 {
		x.remove(key)
		x.overflow++
		return
	}
	i, ok := x.where[key]
	if !ok {
		home := idxHome([]byte(key), x.n)
		for j := home; j < home+idxProbe; j++ {
			if !x.used[j] {
				i, ok = j, true
				break
			}
		}
		if !ok {
			x.overflow++
			return
		}
		x.used[i] = true
		x.where[key] = i
	}
	x.seq++
	var tmp [idxBucketLen]byte
	putBucket(tmp[:], &idxEntry{seq: x.seq, gen: r.gen, size: r.size, addr: a, key: []byte(key)})
	copy(x.b[i*idxBucketLen:], tmp[:])
}

// remove clears key's bucket, if it has one.
func (x *index) remove(key string) {
	i, ok := x.where[key]
	if !ok {
		return
	}
	delete(x.where, key)
	x.removes++
	x.used[i] = false
	clear(x.b[i*idxBucketLen : (i+1)*idxBucketLen])
}

func (x *index) close() error { return x.mr.Deregister() }
